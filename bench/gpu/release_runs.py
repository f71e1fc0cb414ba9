#!/usr/bin/env python3
"""The release's GPU runs on one GPU, module- and kernel-level (vLLM's engine is not run):
``tests/gpu`` (all of it: the verify kernels, the folded escalation's kernels, the
serving-safety replay on real CUDA graphs, patch 0002's ``compute_logits_local``, kimi_tli
through vLLM's kernels), the verify-step benchmark (``bench/kernels/bench_verify_graph.py``:
ours, vLLM's graph-captured step, vLLM's batch-sharded sampling, bytes per rank) and the same
benchmark with the folded escalation (``folded``: ``--escalation folded``, Kimi's two top-p
settings, k = 3 and 7, 4-256 rows: the folded step as ``ours`` beside the whole-row step,
vLLM's graph step and batch-sharded sampling, in the same alternating rounds).

    # 1. here, after `nox -s apply-patches` (the patched tree is build/vllm-0.34.0/):
    python bench/gpu/release_runs.py prepare
    #    copies the vLLM source files the runs load into .vllm_src/ (git-ignored) and prints
    #    what to carry to the GPU machine and the commands to run there
    # 2. on the GPU machine, in the repository root (torch + Triton + pytest; no vLLM):
    python3 bench/gpu/release_runs.py run --out DIR --test-workers 8 --step-timeout 190
    python3 bench/gpu/release_runs.py run --out DIR --steps tests    # or one per call
    # 3. here, with DIR's files back:
    python bench/gpu/release_runs.py install DIR
    #    checks the verify report (schema, no failed case, the cost model reads it) and
    #    replaces bench/reports/verify_graph_vs_vllm_h200.{json,md}; then `nox -s docs`. With
    #    the folded report in DIR (verify_folded.{json,md}) it checks that one too, copies it
    #    into bench/reports/ and the package (costmodel/profiles/verify/) and regenerates its
    #    priced table in docs/sharded-verification.md

``run`` writes into ``--out``: ``release_runs.json`` (each step's command, exit status,
seconds; the tests' outcomes with skip reasons; patch 0002's tests; the replay test's
uncaptured-step count), ``tests_gpu.xml`` + ``tests_gpu.log`` (pytest), and
``verify_graph_vs_vllm_h200.{json,md}`` + ``bench.log`` (both benchmarks' output, the folded
one appended), ``verify_folded.{json,md}``: eight files (the most a GPU machine returns).
The summary is rewritten after every step, and the benchmark rewrites its report after every
case, so a run stopped by a time limit still returns what finished. ``run --dry-run`` (any
machine): the same steps in their CPU form (``pytest tests/gpu --collect-only``; the
benchmarks' ``--dry-run``).

The serving-safety replay is the verify step's own GPU test, :data:`REPLAY_TEST`; the
driver reads the uncaptured-step count from the line it prints, :data:`REPLAY_RE` (steps
minus replayed steps; the summary says ``null`` when no such line was printed).

Exit status: 0 every step ran clean; 1 a step failed or timed out (``run``), or the report
has problems (``install``); 2 usage error or unreadable input (one line on stderr; ``--debug``
adds the traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "kernels"))

from bench.harness.cli import (  # noqa: E402
    EXIT_FINDINGS,
    EXIT_OK,
    ArgumentParser,
    UsageError,
    add_debug,
    positive_int,
    run_cli,
)

PROG = "release_runs"
SCHEMA = "vllm-kimi-ext/release-gpu-runs/1"
REPORT = "verify_graph_vs_vllm_h200"
FOLDED_REPORT = "verify_folded"
STEPS = ("tests", "bench", "folded")
#: The folded escalation's benchmark: Kimi's two top-p settings (the modes that escalate).
FOLDED_ARGS = ("--escalation", "folded", "--modes", "top_p_T1,top_p_T0.6", "--ks", "3,7",
               "--rows", "4,16,64,256")
#: Each step's log (the folded benchmark appends to the benchmark's: 8 files come back).
LOGS = {"tests": "tests_gpu.log", "bench": "bench.log", "folded": "bench.log"}
#: The serving-safety replay test (the verify step's: StepGraphs over 1,000 steps of 1-256
#: requests) and the line it prints (``steps N, replayed R, uncaptured {reason: count}``).
REPLAY_TEST = ("tests/gpu/test_verify_step_graphs_gpu.py::"
               "test_thousand_steps_of_changing_batch_sizes_replay_captured_graphs")
REPLAY_RE = re.compile(r"steps (\d+), replayed (\d+), uncaptured (\{[^}]*\})")
PATCH_0002_FILE = "tests/gpu/test_patch_0002_gpu.py"
#: Default per-step limits (s). Measured on one H100 (2026-12-07, cold Triton cache): tests
#: 29 in 182 s with ``--test-workers 8`` and over 280 s in one process (they compile most of
#: the time), bench 110 s, folded 86-138 s: with ``--test-workers 8`` and ``--step-timeout
#: 190`` all three fit one 10-minute call.
TIMEOUTS = {"tests": 420, "bench": 540, "folded": 300}
CARRY = ".vllm_src"
#: The package's copy of the folded report (what the installed cost model prices from),
#: relative to the checkout that holds ``--reports``.
PACKAGE_COPY = "vllm_kimi_ext/costmodel/profiles/verify/verify_folded.json"
#: Real logits rows for the benchmark (git-ignored; carried when present). The committed
#: report was measured on SmolLM2-135M rows made by this command (CPU, minutes):
ROWS_FILE = "bench/out/verify_rows_smollm2.pt"
ROWS_COMMAND = ("python bench/topp_fallback.py --per-dataset 8 --answer-tokens 48 "
                f"--save-rows 384 --save-logits {ROWS_FILE} --out-dir bench/out/topp_fallback")


# ---------------------------------------------------------------------------------------------
# which vLLM files travel
# ---------------------------------------------------------------------------------------------
def _load(path: Path, name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def vllm_files() -> list[str]:
    """Every vLLM 0.34.0 source file the runs load (the benchmark's list, patch 0002's GPU
    test's list; the kimi_tli GPU test uses a subset of the benchmark's)."""
    bench = _load(ROOT / "bench" / "kernels" / "bench_verify_graph.py", "_release_bvg")
    test = _load(ROOT / PATCH_0002_FILE, "_release_t0002")
    return list(dict.fromkeys(list(bench.vllm_files()) + list(test.SOURCES.values())))


def prepare(args) -> int:
    tree = args.vllm_tree
    files = vllm_files()
    missing = [f for f in files if not (tree / f).is_file()]
    if missing:
        raise UsageError(f"--vllm-tree {tree}: lacks {missing[0]} ({len(missing)} of the "
                         f"{len(files)} files the runs load; run `nox -s apply-patches` "
                         "first)")
    dest = args.dest
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for f in files:
            (tmp / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(tree / f, tmp / f)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    size = sum((dest / f).stat().st_size for f in files)
    print(f"{PROG}: copied {len(files)} vLLM source files ({size / 1e6:.2f} MB) from {tree} "
          f"into {dest}")
    carry = [str(dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest)]
    rows = ROOT / ROWS_FILE
    if rows.is_file():
        carry.append(ROWS_FILE)
        print(f"{PROG}: real logits rows for the benchmark: {ROWS_FILE} "
              f"({rows.stat().st_size / 1e6:.1f} MB)")
    else:
        print(f"{PROG}: no {ROWS_FILE}: the benchmark would use synthetic rows (the committed "
              f"report used real ones); to make them first: {ROWS_COMMAND}")
    print("carry to the GPU machine (with the working tree): " + ", ".join(carry))
    print("check the copy first (CPU): python bench/gpu/release_runs.py run --dry-run "
          "--out /tmp/release-dry-run")
    print("run there, from the repository root, in one call (the tests on 8 processes and "
          "190 s per step keep it under 10 minutes):")
    print("  python3 bench/gpu/release_runs.py run --out \"$OUT\" --test-workers 8 "
          "--step-timeout 190")
    print("or one call per step (--steps tests, --steps bench, --steps folded)")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------------
def step_command(step: str, args) -> list[str]:
    py, out = sys.executable, str(args.out)
    if step == "tests":
        cmd = [py, "-m", "pytest", "tests/gpu", "-rA", "-p", "no:cacheprovider",
               f"--junitxml={out}/tests_gpu.xml"]
        if args.dry_run:
            return cmd + ["--collect-only", "-q"]
        # one process prints as it goes (-s); workers' output comes back in -rA's PASSES
        workers = args.test_workers or 0
        return cmd + (["-n", str(workers), "--dist", "load"] if workers > 1 else ["-s"])
    name = FOLDED_REPORT if step == "folded" else REPORT
    cmd = [py, "bench/kernels/bench_verify_graph.py", "--out-dir", out, "--name", name]
    if (ROOT / CARRY).is_dir():
        cmd += ["--vllm-src", str(ROOT / CARRY)]
    rows = args.logits or (ROOT / ROWS_FILE if (ROOT / ROWS_FILE).is_file() else None)
    if rows is not None:
        cmd += ["--logits", str(rows)]
    if step == "folded":  # the CPU form: 16 rows (4 requests: the folded plan, not rows)
        cmd += list(FOLDED_ARGS)
        return cmd + (["--dry-run", "--rows", "4,16", "--ks", "3"] if args.dry_run else [])
    if args.dry_run:  # the CPU form, kept short: the four modes at k = 3, 4 rows
        return cmd + ["--dry-run", "--rows", "4", "--ks", "3"]
    return cmd + (["--quick"] if args.quick else [])


def run_step(step: str, args) -> dict:
    cmd = step_command(step, args)
    log = args.out / LOGS[step]
    limit = args.step_timeout or TIMEOUTS[step]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])),
        "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    with open(log, "a" if step == "folded" else "w", encoding="utf-8") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
        try:
            rc, timed_out = p.wait(timeout=limit), False
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            rc, timed_out = p.wait(), True
    return {"step": step, "command": cmd, "rc": rc, "timed_out": timed_out,
            "limit_s": limit, "seconds": round(time.monotonic() - t0, 1), "log": log.name}


def test_outcomes(xml: Path) -> dict:
    """Per test id: outcome (passed / failed / error / skipped) and the skip or failure
    message, from pytest's JUnit XML."""
    out: dict[str, dict] = {}
    if not xml.is_file():
        return out
    for case in ET.parse(xml).getroot().iter("testcase"):
        nodeid = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, msg = "passed", None
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                msg = (el.get("message") or "")[:300]
                break
        out[nodeid] = {"outcome": outcome, "message": msg}
    return out


def summarize_tests(out_dir: Path, dry_run: bool) -> dict:
    log = out_dir / "tests_gpu.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    if dry_run:  # --collect-only -q: one test id per line
        cases = {line.strip(): {"outcome": "collected", "message": None}
                 for line in text.splitlines() if line.startswith("tests/gpu/") and "::" in line}
    else:
        cases = test_outcomes(out_dir / "tests_gpu.xml")
    counts: dict[str, int] = {}
    for c in cases.values():
        counts[c["outcome"]] = counts.get(c["outcome"], 0) + 1
    m = REPLAY_RE.search(text)
    test_file, test_name = REPLAY_TEST.split("::")
    replay = {k: v for k, v in cases.items()
              if Path(test_file).stem in k and k.endswith(test_name)}
    return {
        "counts": counts, "cases": cases,
        "patch_0002": {k: v for k, v in cases.items()
                       if Path(PATCH_0002_FILE).stem in k},
        "replay": {"test": REPLAY_TEST, "cases": replay,
                   "steps": int(m.group(1)) if m else None,
                   "uncaptured_steps": int(m.group(1)) - int(m.group(2)) if m else None,
                   "uncaptured_by_reason": m.group(3) if m else None,
                   "line": m.group(0) if m else None},
    }


def summarize_bench(out_dir: Path, name: str = REPORT) -> dict:
    path = out_dir / f"{name}.json"
    if not path.is_file():
        return {"report": None}
    doc = json.loads(path.read_text())
    bvg = _load(ROOT / "bench" / "kernels" / "bench_verify_graph.py", "_release_bvg")
    return {"report": path.name, "cases": len(doc.get("cases", [])),
            "failed_cases": sum(1 for c in doc.get("cases", []) if bvg.failed(c)),
            "dry_run": doc.get("dry_run")}


def write_summary(summary: dict, out_dir: Path) -> None:
    path = out_dir / "release_runs.json"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(summary, indent=1) + "\n")
    os.replace(tmp, path)


def run(args) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    cuda = torch.cuda.is_available()
    summary = {"schema": SCHEMA, "dry_run": args.dry_run, "steps": [],
               "python": sys.version.split()[0], "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name(0) if cuda else None,
               "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_summary(summary, args.out)
    for step in args.steps:
        print(f"{PROG}: {step} ...", flush=True)
        rec = run_step(step, args)
        summary["steps"].append(rec)
        if step == "tests":
            summary["tests"] = summarize_tests(args.out, args.dry_run)
        elif step == "bench":
            summary["bench"] = summarize_bench(args.out)
        else:
            summary["folded"] = summarize_bench(args.out, FOLDED_REPORT)
        write_summary(summary, args.out)
        print(f"{PROG}: {step}: exit {rec['rc']}{' (timed out)' if rec['timed_out'] else ''} "
              f"in {rec['seconds']} s", flush=True)
    bad = [r for r in summary["steps"] if r["rc"] != 0 or r["timed_out"]]
    return EXIT_FINDINGS if bad else EXIT_OK


# ---------------------------------------------------------------------------------------------
# install
# ---------------------------------------------------------------------------------------------
def _read_report(src: Path) -> dict:
    try:
        return json.loads(src.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{src}: not valid JSON ({e})") from None


def report_findings(doc, src: Path, folded: bool) -> list[str]:
    """What keeps a returned report out: its schema, a dry run, a failed case, the cost
    model's refusal (for the folded report also its whole-row times and its escalation)."""
    schema = _load(ROOT / "bench" / "kernels" / "_verify_graph_schema.py", "_release_schema")
    bvg = _load(ROOT / "bench" / "kernels" / "bench_verify_graph.py", "_release_bvg")
    from vllm_kimi_ext.costmodel import verify_folded_cost as vf
    from vllm_kimi_ext.costmodel.verify_measured import VerifyReportError, parse_report

    findings = list(schema.problems(doc))
    if isinstance(doc, dict) and doc.get("dry_run"):
        findings.append("a dry run (nothing timed): not a measurement")
    if not findings:
        findings += [f"cases[{i}] ({c['k']}, {c['rows']}, {c['mode']}) failed a check or raised"
                     for i, c in enumerate(doc["cases"]) if bvg.failed(c)]
    if not findings and folded:
        findings += [f"cases[{i}] ({c['k']}, {c['rows']}, {c['mode']}): not a folded-escalation "
                     "case (its plan has no escalation-folded round and no whole-row step "
                     "beside it)" for i, c in enumerate(doc["cases"])
                     if "escalation-folded" not in str(c.get("plan"))
                     and c.get("ours_rows_us") is None]
    if not findings:
        try:
            meas = parse_report(doc, str(src))
            if folded:
                vf.parse_folded(doc, meas, str(src))
        except VerifyReportError as e:
            findings.append(f"the cost model refuses it: {e}")
    return findings


def _copy(src: Path, dest: Path) -> None:
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dest)


def _folded_docs(src_dir: Path, docs: Path) -> str:
    """docs/sharded-verification.md with the folded table priced from the returned report
    (a missing generated block is a usage error, before anything is written)."""
    from vllm_kimi_ext.costmodel import verify_folded_cost as vf
    from vllm_kimi_ext.costmodel.catalog import DEFAULT_HARDWARE
    from vllm_kimi_ext.costmodel.model import CostModel

    fm = vf.load_folded(src_dir / f"{FOLDED_REPORT}.json")
    try:
        return vf.docs_text(docs.read_text(encoding="utf-8"),
                            CostModel.build(DEFAULT_HARDWARE), fm)
    except ValueError as e:
        raise UsageError(f"{docs}: {e} (expected the generated folded-escalation table)"
                         ) from None


def install(args) -> int:
    names = [n for n in (REPORT, FOLDED_REPORT) if (args.dir / f"{n}.json").is_file()]
    if not names:
        names = [REPORT]  # the missing file named below
    docs = args.reports.resolve().parents[1] / "docs" / "sharded-verification.md"
    package = args.reports.resolve().parents[1] / PACKAGE_COPY
    for n in names:
        for p in (args.dir / f"{n}.json", args.dir / f"{n}.md"):
            if not p.is_file():
                raise UsageError(f"{p}: no such file (expected the verify report `run` wrote)")
    docs_by_name, bad = {n: _read_report(args.dir / f"{n}.json") for n in names}, 0
    for n, doc in docs_by_name.items():
        for f in report_findings(doc, args.dir / f"{n}.json", n == FOLDED_REPORT):
            print(f"{PROG}: {args.dir / f'{n}.json'}: {f}", file=sys.stderr)
            bad += 1
    if bad:
        return EXIT_FINDINGS
    if FOLDED_REPORT in names:
        for need in (docs, package.parent):
            if not need.exists():
                raise UsageError(f"--reports {args.reports}: the checkout above it lacks "
                                 f"{need} (the folded report updates it)")
    new_docs = _folded_docs(args.dir, docs) if FOLDED_REPORT in names else None
    for n in names:
        for suffix in ("json", "md"):
            _copy(args.dir / f"{n}.{suffix}", args.reports / f"{n}.{suffix}")
        print(f"{PROG}: replaced {args.reports / n}.json and .md "
              f"({len(docs_by_name[n]['cases'])} cases)")
    if new_docs is not None:
        _copy(args.dir / f"{FOLDED_REPORT}.json", package)
        tmp = docs.with_name(f".{docs.name}.tmp")
        tmp.write_text(new_docs, encoding="utf-8")
        os.replace(tmp, docs)
        print(f"{PROG}: copied it to {package} and regenerated the priced table in {docs}")
    if REPORT in names:
        print(f"{PROG}: now run `nox -s docs` (the cost model's copy, its crossover and the "
              "docs)")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# arguments
# ---------------------------------------------------------------------------------------------
def _steps(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",")]
    if not items or any(x not in STEPS for x in items):
        raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(STEPS)}, "
                                         f"got {text!r}")
    return list(dict.fromkeys(items))


_steps.__name__ = "a comma list of steps"


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0],
                        epilog="exit status: 0 clean; 1 a step failed or timed out (run) or "
                               "the report has problems (install); 2 usage error or "
                               "unreadable input (one line on stderr)")
    add_debug(ap)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="copy vLLM's source files into .vllm_src/ (here)")
    p.add_argument("--vllm-tree", type=Path, default=ROOT / "build" / "vllm-0.34.0",
                   help="the patched vLLM 0.34.0 tree (default build/vllm-0.34.0)")
    p.add_argument("--dest", type=Path, default=ROOT / CARRY)
    add_debug(p, sub=True)
    r = sub.add_parser("run", help="the runs (on the GPU machine; --dry-run anywhere)")
    r.add_argument("--out", type=Path, required=True, help="output directory")
    r.add_argument("--steps", type=_steps, default=list(STEPS),
                   help=f"comma list of {', '.join(STEPS)} (default all)")
    r.add_argument("--step-timeout", type=positive_int, default=None,
                   help="seconds per step (default tests "
                        f"{TIMEOUTS['tests']}, bench {TIMEOUTS['bench']}, folded "
                        f"{TIMEOUTS['folded']})")
    r.add_argument("--test-workers", type=positive_int, default=None,
                   help="run tests/gpu on N pytest-xdist processes (they compile Triton "
                        "kernels in parallel; needs pytest-xdist); default one process")
    r.add_argument("--quick", action="store_true", help="the benchmark's --quick")
    r.add_argument("--logits", type=Path, default=None,
                   help=f"the benchmark's --logits (default {ROWS_FILE} when it exists)")
    r.add_argument("--dry-run", action="store_true",
                   help="the steps' CPU forms (collect tests/gpu; the benchmark's dry run)")
    add_debug(r, sub=True)
    i = sub.add_parser("install", help="check a returned report, copy it into bench/reports/")
    i.add_argument("dir", type=Path, help="the directory `run --out` wrote")
    i.add_argument("--reports", type=Path, default=ROOT / "bench" / "reports",
                   help="where the report goes (default bench/reports/)")
    add_debug(i, sub=True)
    return ap


def parse_args(argv: list[str]) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.cmd == "prepare":
        if not args.vllm_tree.is_dir():
            raise UsageError(f"--vllm-tree {args.vllm_tree}: not a directory (expected the "
                             "patched vLLM 0.34.0 tree; run `nox -s apply-patches`)")
        if args.dest.exists() and not args.dest.is_dir():
            raise UsageError(f"--dest {args.dest}: exists and is not a directory")
    elif args.cmd == "run":
        for parent in [args.out, *args.out.parents]:
            if parent.exists() and not parent.is_dir():
                raise UsageError(f"--out {args.out}: {parent} is not a directory")
        if args.logits is not None and not args.logits.is_file():
            raise UsageError(f"--logits {args.logits}: no such file")
    else:
        if not args.dir.is_dir():
            raise UsageError(f"{args.dir}: not a directory (expected what `run --out` wrote)")
        if not args.reports.is_dir():
            raise UsageError(f"--reports {args.reports}: not a directory")
    return args


def body(args: argparse.Namespace) -> int:
    return {"prepare": prepare, "run": run, "install": install}[args.cmd](args)


def main(argv=None) -> int:
    return run_cli(PROG, parse_args, body, argv)


if __name__ == "__main__":
    sys.exit(main())
