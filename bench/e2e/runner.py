#!/usr/bin/env python
"""End-to-end serving benchmark: ``run`` a config matrix of ``vllm serve`` launches, or
``compare`` two result files.

    # the real box: stock vLLM 0.34.0 venv vs this project's patched env
    python bench/e2e/runner.py run --config bench/configs/e2e-kimi-k25-pcie8.yaml \\
        --python stock=/opt/vllm-stock --python patched=.venv --out bench/out/e2e/kimi
    # anywhere: the pipeline on a tiny Kimi-shaped checkpoint written on the fly
    python bench/e2e/runner.py run
    # what would run (no --python needed, nothing started, nothing written)
    python bench/e2e/runner.py run --config bench/configs/e2e-kimi-k25-pcie8.yaml --plan-only
    # the cost model's answer and the configuration to measure beside it, back to back;
    # forecast.json / forecast.md: measured tokens/s and acceptance beside the forecast
    # (--python PATH or run's --python box=PATH; checked for vLLM 0.34.0 before launching)
    python bench/e2e/runner.py recommendation --python .venv --out bench/out/e2e/what-to-run
    # ratios B/A per matching level
    python bench/e2e/runner.py compare A/results.json B/results.json --out cmp.md
    # within one file: patched vs stock
    python bench/e2e/runner.py compare A/results.json --axis env=stock:patched

``run`` writes ``<out>/results.json`` (schema ``vllm-kimi-ext/e2e-results/1``, validated),
``<out>/report.md`` and ``<out>/logs/*.log`` (one server log per launch). Without ``--out``
each run gets a new directory ``bench/out/e2e/<UTC date-time>``; an ``--out`` that holds an
earlier run's results is refused unless ``--overwrite`` (which removes them first; a
``checkpoints/`` cache of the tiny model stays). ``--plan-only`` starts nothing and writes
nothing: it prints the plan (and writes its JSON only to ``--plan-out FILE``).

Every argument and the config file are checked before anything starts.

Exit status: 0 clean (``run``: every launch measured, or the plan printed; ``compare``: the
table printed); 1 ``run``: results written but some launch did not start, failed or was not
attempted, ``compare``: no matching levels; 2 usage error, unreadable or malformed input
(config, result file, a --python that is not an executable when a run needs it, an --out
under a file) or internal error: one line on stderr, never a traceback (--debug shows it).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness.cli import (  # noqa: E402 - after the sys.path line above
    EXIT_FINDINGS,
    EXIT_OK,
    ArgumentParser,
    UsageError,
    add_debug,
    check_output_dir,
    check_output_file,
    int_list,
    name_list,
    positive_int,
    positive_seconds,
    read_json,
    run_cli,
)
from bench.harness.e2e.config import DEFAULT_CONFIG  # noqa: E402

KIMI_CONFIG = ROOT / "bench" / "configs" / "e2e-kimi-k25-pcie8.yaml"

PROG = "runner.py"
DEFAULT_OUT_BASE = ROOT / "bench" / "out" / "e2e"


def build_parser() -> argparse.ArgumentParser:
    head, rest = __doc__.split("\n\n", 1)
    ap = ArgumentParser(prog=PROG, description=head,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=rest)
    add_debug(ap)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="launch vllm serve over the config matrix and measure",
                       epilog=rest, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                   help="matrix file, .yaml/.yml or .json (default bench/configs/e2e-tiny.yaml)")
    r.add_argument("--model", default=None,
                   help="model path or id (overrides the config's; default: the config's, "
                        "'@tiny' = a tiny Kimi-shaped checkpoint written under --out)")
    r.add_argument("--python", action="append", default=[], metavar="NAME=PATH",
                   help="the python (executable or venv) for @NAME in the config, e.g. "
                        "stock=/opt/vllm-0.34.0-venv patched=.venv (repeat; not needed "
                        "with --plan-only)")
    r.add_argument("--out", type=Path, default=None,
                   help="results directory (default: a new bench/out/e2e/<UTC date-time>); "
                        "refused when it holds an earlier run's results, unless --overwrite")
    r.add_argument("--overwrite", action="store_true",
                   help="replace the earlier results in --out (or the --plan-out file)")
    r.add_argument("--select", action="append", default=[], metavar="AXIS=V1,V2",
                   help="run only these values of an axis (repeat for several axes)")
    r.add_argument("--requests", type=positive_int, help="override requests_per_level")
    r.add_argument("--concurrency", type=int_list,
                   help="override the concurrency sweep, e.g. 1,4,16")
    r.add_argument("--max-tokens", type=positive_int, help="override max_tokens")
    r.add_argument("--datasets", type=name_list, help="override datasets, e.g. mt-bench,gsm8k")
    r.add_argument("--startup-timeout", type=positive_seconds,
                   help="override startup_timeout_s")
    r.add_argument("--level-time-limit", type=positive_seconds,
                   help="override level_time_limit_s")
    r.add_argument("--stop-after-failed-starts", type=positive_int, default=None, metavar="N",
                   help="do not attempt further launches after N failed server starts")
    r.add_argument("--time-budget", type=positive_seconds, default=None, metavar="S",
                   help="start no launch after S seconds")
    r.add_argument("--plan-only", action="store_true",
                   help="print the launches and levels; start nothing, write nothing")
    r.add_argument("--plan-out", type=Path, default=None, metavar="FILE",
                   help="with --plan-only: also write the plan (a result skeleton) as JSON here")
    r.add_argument("--no-git", action="store_true",
                   help="do not run git for the dirty flag in provenance")
    add_debug(r, sub=True)
    m = sub.add_parser("recommendation",
                       help="the answer of vllm-kimi-ext plan and the configuration to measure "
                            "beside it, back to back; the measured numbers beside the forecast",
                       description=(
                           "Serve the configuration the cost model recommends and the one to "
                           "settle beside it (worth measuring, or the measured alternative), "
                           "back to back with the same prompts at concurrency 1, and write "
                           "forecast.json / forecast.md: measured tokens/s and acceptance "
                           "length beside the forecast and its interval."))
    m.add_argument("--config", type=Path, default=KIMI_CONFIG,
                   help="e2e config for the model, prompts, sampling and timeouts (its matrix "
                        "is replaced; default bench/configs/e2e-kimi-k25-pcie8.yaml)")
    m.add_argument("--python", default=None, metavar="[box=]PATH",
                   help="the python (executable or venv) with vLLM 0.34.0 and this project; "
                        "PATH, or box=PATH as run's --python NAME=PATH spells it (both launches "
                        "use @box); its vLLM version is checked before anything starts (not "
                        "needed with --plan-only)")
    m.add_argument("--draft-dir", action="append", default=[], metavar="DRAFT=DIR",
                   help="serve DRAFT (a profile name, e.g. zlab-dflash) from DIR instead of "
                        "its published checkpoint, e.g. the copy vllm-kimi-ext draft "
                        "rope-config writes (the other arm of DFlash's RoPE A/B)")
    for flag in ("--model", "--out", "--overwrite", "--requests", "--max-tokens",
                 "--datasets", "--startup-timeout", "--level-time-limit",
                 "--stop-after-failed-starts", "--time-budget", "--plan-only", "--plan-out",
                 "--no-git"):
        m._add_action(next(a for a in r._actions if flag in a.option_strings))
    m.set_defaults(concurrency=None, select=[])
    add_debug(m, sub=True)
    c = sub.add_parser("compare", help="ratio table B/A of two result files",
                       epilog=rest, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("a", type=Path, help="results.json A (the baseline)")
    c.add_argument("b", type=Path, nargs="?", help="results.json B (default: A, with --axis)")
    c.add_argument("--axis", metavar="NAME=VA:VB",
                   help="pair runs that differ only in axis NAME (A side VA, B side VB)")
    c.add_argument("--out", type=Path, help="also write the markdown table here")
    add_debug(c, sub=True)
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with the checks that need no file (files are read by the commands)."""
    args = build_parser().parse_args(argv)
    if args.cmd in ("run", "recommendation"):
        if args.plan_out is not None and not args.plan_only:
            raise UsageError("--plan-out: only with --plan-only (a run writes its results "
                             "under --out)")
        if args.datasets:
            from bench.harness.prompts import DATASETS

            bad = [d for d in args.datasets if d not in DATASETS]
            if bad:
                raise UsageError(f"--datasets: unknown dataset(s) {', '.join(bad)}; expected "
                                 f"some of {', '.join(DATASETS)}")
    return args


def apply_overrides(cfg: dict, args: argparse.Namespace) -> dict:
    """The config with the command line's overrides (already checked by their types)."""
    for key, value in (("requests_per_level", args.requests),
                       ("concurrency", args.concurrency), ("max_tokens", args.max_tokens),
                       ("datasets", args.datasets), ("startup_timeout_s", args.startup_timeout),
                       ("level_time_limit_s", args.level_time_limit)):
        if value is not None:
            cfg[key] = value
    return cfg


def default_out_dir(base: Path | None = None) -> Path:
    """A results directory no earlier run used: ``base/<UTC date-time>[-N]`` (``base``
    defaults to :data:`DEFAULT_OUT_BASE`)."""
    base = DEFAULT_OUT_BASE if base is None else base
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out, n = base / stamp, 1
    while out.exists():
        n += 1
        out = base / f"{stamp}-{n}"
    return out


def _check_destination(args: argparse.Namespace, out: Path) -> None:
    """Where the run (or the plan) would write: writable, and no earlier results replaced
    without ``--overwrite``."""
    from bench.harness import e2e

    if args.plan_only:
        if args.plan_out is not None:
            check_output_file("--plan-out", args.plan_out)
            if args.plan_out.exists() and not args.overwrite:
                raise UsageError(f"--plan-out {args.plan_out}: exists; pass --overwrite to "
                                 "replace it, or choose another file")
        return
    check_output_dir("--out", out)
    earlier = e2e.earlier_results(out)
    if earlier and not args.overwrite:
        raise UsageError(f"--out {out}: holds an earlier run's {', '.join(earlier)}; pass "
                         "--overwrite to replace them, or choose another --out (without "
                         "--out each run gets a new directory)")


def cmd_run(args: argparse.Namespace) -> int:
    from bench.harness import e2e

    where = str(args.config)
    pythons = e2e.parse_pythons(args.python)
    select = e2e.parse_select(args.select)
    cfg = e2e.normalize_config(apply_overrides(e2e.load_config(args.config), args), where)
    e2e.check_python_names(cfg, pythons, where)
    return _execute(args, cfg, where, pythons, select)


#: The vLLM the answer's commands are written for.
VLLM_VERSION = "0.34.0"


def recommendation_python(text: str | None) -> str | None:
    """``--python`` of ``recommendation``: ``PATH`` or ``box=PATH`` (run's syntax, the one
    NAME its matrix uses)."""
    if text is None:
        return None
    name, sep, path = text.partition("=")
    if sep and name.lstrip("@") == "box":
        return path
    if sep and "/" not in name and name and path:
        raise UsageError(f"--python {text}: the recommendation's launches use @box: pass "
                         "PATH or box=PATH")
    return text


def check_vllm_version(python: str) -> None:
    """Refuse, before anything launches, a python whose vLLM is not :data:`VLLM_VERSION`."""
    from bench.harness import e2e
    from bench.harness.e2e.server import probe_software

    exe = e2e.python_path(python, f"--python {python}")
    found = probe_software(exe)
    if found.get("error"):
        raise UsageError(f"--python {python}: cannot read its packages ({found['error']}); "
                         f"expected a python with vLLM {VLLM_VERSION}")
    if found.get("vllm") != VLLM_VERSION:
        raise UsageError(f"--python {python}: has vLLM {found.get('vllm') or 'not installed'}; "
                         f"expected vLLM {VLLM_VERSION} (the answer's commands are written for "
                         "it; nothing was launched)")


def cmd_recommendation(args: argparse.Namespace) -> int:
    """The answer and the configuration to measure beside it, back to back, then the
    measured numbers beside the forecast (forecast.json / forecast.md)."""
    from bench.harness import e2e
    from bench.harness.e2e import recommendation as rec
    from vllm_kimi_ext.costmodel.headline import headline

    where = f"{args.config} (recommendation)"
    python = recommendation_python(args.python)
    draft_dirs = e2e.parse_pythons(args.draft_dir, "--draft-dir")
    h = headline()
    unknown = sorted(set(draft_dirs) - {j.draft.name for j in rec.pair(h).values()})
    if unknown:
        raise UsageError(f"--draft-dir {unknown[0]}: not a draft of the answer (expected "
                         + " or ".join(j.draft.name for j in rec.pair(h).values()) + ")")
    base = e2e.normalize_config(apply_overrides(e2e.load_config(args.config), args),
                                str(args.config))
    cfg = e2e.normalize_config(rec.matrix_config(base, h, "@box", draft_dirs), where)
    pythons = {"box": python} if python else {}
    for line in rec.arm_lines(h, draft_dirs):
        print(line)
    if python and not args.plan_only:
        check_vllm_version(python)

    def forecast(out: Path, results: dict) -> None:
        rows = rec.forecast_rows(h, results)
        for path in rec.write_forecast(out, rows):
            print(f"wrote {path}")
        print(rec.verdict(rows, out))

    try:
        return _execute(args, cfg, where, pythons, {}, after=forecast)
    except e2e.ConfigError as exc:
        if "'speculative_config': 'model'" not in str(exc):
            raise
        raise UsageError(f"{exc}; write it first (vllm-kimi-ext draft rope-config --draft "
                         "DOWNLOAD --out DIR --attention-factor F) or drop --draft-dir to serve "
                         "the published checkpoint") from None


def _execute(args: argparse.Namespace, cfg: dict, where: str, pythons: dict, select: dict,
             after=None) -> int:
    """Plan, then run (or print the plan of) ``cfg``; ``after(out, results)`` runs once the
    results are written."""
    from bench.harness import e2e
    from bench.harness.common import rel, write_json
    from bench.harness.schema import E2EResults, validate

    out = args.out if args.out is not None else default_out_dir()
    _check_destination(args, out)
    plan = e2e.plan_matrix(cfg, out, model=args.model, pythons=pythons, select=select,
                           launching=not args.plan_only, where=where)
    if args.plan_only:
        results = e2e.run_matrix(cfg, out, config_file=where, plan_only=True,
                                 use_git=not args.no_git, plan=plan)
        print(e2e.plan_markdown(results, rel(out)), end="")
        if args.plan_out is not None:
            write_json(args.plan_out, results)
            print(f"wrote the plan to {args.plan_out}")
        return EXIT_OK
    if args.overwrite:
        removed = e2e.clear_earlier_results(out)
        if removed:
            print(f"{PROG}: --overwrite: removed the earlier {', '.join(removed)} from {out}")
    results = e2e.run_matrix(
        cfg, out, config_file=where, stop_after_failed_starts=args.stop_after_failed_starts,
        time_budget_s=args.time_budget, use_git=not args.no_git, plan=plan)
    problems = validate(results, E2EResults)
    if problems:  # a bug of this runner, not of the input
        raise RuntimeError("results.json does not match its schema: " + "; ".join(problems[:5]))
    print(f"wrote {out / 'results.json'} and {out / 'report.md'}")
    if after is not None:
        after(out, results)
    return EXIT_OK if all(r["status"] == "ok" for r in results["runs"]) else EXIT_FINDINGS


def _load_results(label: str, path: Path) -> dict:
    from bench.harness.schema import E2EResults, validate

    data = read_json(label, path)
    problems = validate(data, E2EResults)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise UsageError(f"{label} {path}: not an e2e results file (schema "
                         f"vllm-kimi-ext/e2e-results/1): {'; '.join(problems[:3])}{more}")
    return data


def _parse_axis(text: str, docs: list[dict]) -> tuple[str, str, str]:
    """``NAME=VA:VB``, NAME an axis of the result files, VA a value in A, VB one in B."""
    name, sep, vals = text.partition("=")
    va, sep2, vb = vals.partition(":")
    name, va, vb = name.strip(), va.strip(), vb.strip()
    if not (sep and sep2 and name and va and vb):
        raise UsageError(f"--axis {text!r}: expected NAME=VA:VB")
    if va == vb:
        raise UsageError(f"--axis {text!r}: VA and VB are the same value; expected two values")

    def values(doc: dict) -> set[str]:
        return {str(r["axes"][name]) for r in doc["runs"] if name in r["axes"]}

    axes = sorted({a for d in docs for r in d["runs"] for a in r["axes"]})
    if not any(values(d) for d in docs):
        raise UsageError(f"--axis {text!r}: no run has axis {name!r} (axes: "
                         f"{', '.join(axes) or 'none'})")
    for side, val, doc in (("A", va, docs[0]), ("B", vb, docs[-1])):
        if val not in values(doc):
            raise UsageError(f"--axis {text!r}: {side} has no run with {name}={val} (values: "
                             f"{', '.join(sorted(values(doc))) or 'none'})")
    return name, va, vb


def cmd_compare(args: argparse.Namespace) -> int:
    from bench.harness import e2e

    if args.out is not None:
        check_output_file("--out", args.out)
    docs = [_load_results("compare A", args.a)]
    if args.b is not None:
        docs.append(_load_results("compare B", args.b))
    axis = _parse_axis(args.axis, docs) if args.axis else None
    if axis is None and len(docs) < 2:
        raise UsageError("compare: give two result files, or one with --axis NAME=VA:VB")
    names = (axis[1], axis[2]) if axis else ("A", "B")
    rows = e2e.compare_rows(docs[0], docs[1] if len(docs) > 1 else None, axis)
    text = e2e.compare_markdown(rows, *names)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return EXIT_OK if rows else EXIT_FINDINGS


def main(argv: list[str] | None = None) -> int:
    commands = {"run": cmd_run, "recommendation": cmd_recommendation, "compare": cmd_compare}
    return run_cli(PROG, parse_args, lambda a: commands[a.cmd](a), argv)


if __name__ == "__main__":
    sys.exit(main())
