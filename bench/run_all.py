#!/usr/bin/env python
"""Run every benchmark this machine can run; say what it skipped and why.

    nox -s bench                            # = python bench/run_all.py (project env)
    nox -s bench -- --quick                 # shorter runs
    nox -s bench -- --only collectives      # one section (repeatable / comma list)
    nox -s bench -- --skip e2e

Sections (bench/README.md): costmodel, verify-cpu, collectives (any machine), gpu-kernels
(one GPU), allreduce (several GPUs), e2e (the real box; elsewhere the pipeline on a tiny
checkpoint). Writes ``<out>/results.json`` (schema ``vllm-kimi-ext/bench-results/1``) and
``<out>/report.md`` with its PNG plots. Exit status 0 unless a section failed. The work is
done by ``bench/harness/`` (``suite.py`` and one module per section in ``sections/``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import sections as S
from bench.harness.suite import run_suite


def _sections(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in S.SECTION_NAMES]
    if bad:
        raise argparse.ArgumentTypeError(
            f"unknown section(s) {bad}; choose from {', '.join(S.SECTION_NAMES)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="run_all.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out",
                    help="output directory (default bench/out)")
    ap.add_argument("--only", type=_sections, action="append", default=[], metavar="SECTION",
                    help=f"run only these sections ({', '.join(S.SECTION_NAMES)})")
    ap.add_argument("--skip", type=_sections, action="append", default=[], metavar="SECTION",
                    help="skip these sections")
    ap.add_argument("--quick", action="store_true",
                    help="shorter runs: fewer benchmark rounds, no draft cases, fewer requests")
    ap.add_argument("--no-git", action="store_true",
                    help="record the commit from .git files only; run no git command (the "
                         "dirty flag is then unknown)")
    ap.add_argument("--e2e-config", type=Path, default=None,
                    help="e2e matrix (default: bench/configs/e2e-tiny.yaml, a tiny checkpoint)")
    ap.add_argument("--e2e-model", default=None, help="e2e model path or id")
    ap.add_argument("--e2e-python", action="append", default=[], metavar="NAME=PATH",
                    help="python for @NAME in the e2e config (e.g. stock=/opt/venv)")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    args.only = [n for group in args.only for n in group]
    args.skip = [n for group in args.skip for n in group]
    return args


def main(argv: list[str] | None = None) -> int:
    return run_suite(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
