#!/usr/bin/env python
"""End-to-end serving benchmark: ``run`` a config matrix of ``vllm serve`` launches, or
``compare`` two result files.

    # the real box: stock vLLM 0.34.0 venv vs this project's patched env
    python bench/e2e/runner.py run --config bench/configs/e2e-kimi-k25-pcie8.yaml \\
        --python stock=/opt/vllm-stock --python patched=.venv --out bench/out/e2e/kimi
    # anywhere: the pipeline on a tiny Kimi-shaped checkpoint written on the fly
    python bench/e2e/runner.py run --out bench/out/e2e/tiny
    # ratios B/A per matching level
    python bench/e2e/runner.py compare A/results.json B/results.json --out cmp.md
    # within one file: patched vs stock
    python bench/e2e/runner.py compare A/results.json --axis env=stock:patched

``run`` writes ``<out>/results.json`` (schema ``vllm-kimi-ext/e2e-results/1``, validated),
``<out>/report.md`` and ``<out>/logs/*.log`` (one server log per launch). Exit status: 0 all
launches measured; 4 results written but some launch did not start or failed; 2 bad
arguments or config.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_CONFIG = ROOT / "bench" / "configs" / "e2e-tiny.yaml"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="runner.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="launch vllm serve over the config matrix and measure")
    r.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                   help="matrix file, YAML or JSON (default bench/configs/e2e-tiny.yaml)")
    r.add_argument("--model", default=None,
                   help="model path or id (overrides the config's; default: the config's, "
                        "'@tiny' = a tiny Kimi-shaped checkpoint written under --out)")
    r.add_argument("--python", action="append", default=[], metavar="NAME=PATH",
                   help="the python (executable or venv) for @NAME in the config, e.g. "
                        "stock=/opt/vllm-0.34.0-venv patched=.venv (repeat)")
    r.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "e2e",
                   help="output directory (default bench/out/e2e)")
    r.add_argument("--select", action="append", default=[], metavar="AXIS=V1,V2",
                   help="run only these values of an axis (repeat for several axes)")
    r.add_argument("--requests", type=int, help="override requests_per_level")
    r.add_argument("--concurrency", help="override the concurrency sweep, e.g. 1,4,16")
    r.add_argument("--max-tokens", type=int, help="override max_tokens")
    r.add_argument("--datasets", help="override datasets, e.g. mt-bench,gsm8k")
    r.add_argument("--startup-timeout", type=float, help="override startup_timeout_s")
    r.add_argument("--level-time-limit", type=float, help="override level_time_limit_s")
    r.add_argument("--stop-after-failed-starts", type=int, default=None, metavar="N",
                   help="do not attempt further launches after N failed server starts")
    r.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="start no launch after S seconds")
    r.add_argument("--plan-only", action="store_true",
                   help="write the matrix and result skeleton, start nothing")
    r.add_argument("--no-git", action="store_true",
                   help="do not run git for the dirty flag in provenance")
    c = sub.add_parser("compare", help="ratio table B/A of two result files")
    c.add_argument("a", type=Path, help="results.json A (the baseline)")
    c.add_argument("b", type=Path, nargs="?", help="results.json B (default: A, with --axis)")
    c.add_argument("--axis", metavar="NAME=VA:VB",
                   help="pair runs that differ only in axis NAME (A side VA, B side VB)")
    c.add_argument("--out", type=Path, help="also write the markdown table here")
    return ap


def parse_pythons(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"runner.py: --python {item!r}: expected NAME=PATH")
        name, path = item.split("=", 1)
        out[name.strip().lstrip("@")] = path.strip()
    return out


def apply_overrides(cfg: dict, args: argparse.Namespace) -> dict:
    if args.requests is not None:
        cfg["requests_per_level"] = args.requests
    if args.concurrency:
        cfg["concurrency"] = [int(x) for x in args.concurrency.split(",") if x.strip()]
    if args.max_tokens is not None:
        cfg["max_tokens"] = args.max_tokens
    if args.datasets:
        cfg["datasets"] = [x.strip() for x in args.datasets.split(",") if x.strip()]
    if args.startup_timeout is not None:
        cfg["startup_timeout_s"] = args.startup_timeout
    if args.level_time_limit is not None:
        cfg["level_time_limit_s"] = args.level_time_limit
    return cfg


def cmd_run(args: argparse.Namespace) -> int:
    from bench.harness import e2e
    from bench.harness.schema import E2EResults, validate

    try:
        cfg = apply_overrides(e2e.load_config(args.config), args)
        cfg = e2e.normalize_config(cfg, str(args.config))
        results = e2e.run_matrix(
            cfg, args.out, model=args.model, pythons=parse_pythons(args.python),
            select=e2e.parse_select(args.select), config_file=str(args.config),
            plan_only=args.plan_only, stop_after_failed_starts=args.stop_after_failed_starts,
            time_budget_s=args.time_budget, use_git=not args.no_git)
    except e2e.ConfigError as exc:
        print(f"runner.py: {exc}", file=sys.stderr)
        return 2
    saved = json.loads((args.out / "results.json").read_text())
    problems = validate(saved, E2EResults)
    if problems:
        print("runner.py: results.json does not match its schema:\n  " + "\n  ".join(problems),
              file=sys.stderr)
        return 1
    print(f"wrote {args.out / 'results.json'} and {args.out / 'report.md'}")
    statuses = [r["status"] for r in results["runs"]]
    if args.plan_only or all(s == "ok" for s in statuses):
        return 0
    return 4


def cmd_compare(args: argparse.Namespace) -> int:
    from bench.harness import e2e
    from bench.harness.schema import E2EResults, SchemaError, check

    docs = []
    for p in [args.a] + ([args.b] if args.b else []):
        data = json.loads(p.read_text())
        try:
            check(data, E2EResults)
        except SchemaError as exc:
            print(f"runner.py compare: {p}: {exc}", file=sys.stderr)
            return 2
        docs.append(data)
    axis = None
    if args.axis:
        try:
            name, vals = args.axis.split("=", 1)
            va, vb = vals.split(":", 1)
        except ValueError:
            print(f"runner.py compare: --axis {args.axis!r}: expected NAME=VA:VB",
                  file=sys.stderr)
            return 2
        axis = (name, va, vb)
        names = (va, vb)
    else:
        if len(docs) < 2:
            print("runner.py compare: give two result files, or --axis NAME=VA:VB",
                  file=sys.stderr)
            return 2
        names = ("A", "B")
    rows = e2e.compare_rows(docs[0], docs[1] if len(docs) > 1 else None, axis)
    text = e2e.compare_markdown(rows, *names)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0 if rows else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return cmd_run(args) if args.cmd == "run" else cmd_compare(args)


if __name__ == "__main__":
    sys.exit(main())
