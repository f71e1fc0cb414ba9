#!/usr/bin/env python
"""Run every benchmark this machine can run; say what it skipped and why.

    nox -s bench                            # = python bench/run_all.py (project env)
    nox -s bench -- --quick                 # shorter runs
    nox -s bench -- --only collectives      # one section (repeatable / comma list)
    nox -s bench -- --skip e2e

Sections (bench/README.md): costmodel, verify-cpu, collectives, engine (any machine),
gpu-kernels (one GPU), allreduce (several GPUs), e2e (the real box; elsewhere the pipeline on
a tiny checkpoint). Writes ``<out>/results.json`` (schema ``vllm-kimi-ext/bench-results/1``) and
``<out>/report.md`` with its PNG plots; a run replaces the results of an earlier one in the
same ``--out`` and says so. The work is done by ``bench/harness/`` (``suite.py`` and one
module per section in ``sections/``).

Every argument (and the --e2e-config file) is checked before anything runs.

Exit status: 0 every planned section ran or was skipped; 1 a section failed; 2 usage error,
unreadable input (a bad --e2e-config, an --e2e-python that is not an executable when the e2e
section would run, an --out under a file) or internal error: one line on stderr, never a
traceback (--debug shows it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import sections as S  # noqa: E402 - after the sys.path line above
from bench.harness.cli import (  # noqa: E402
    ArgumentParser,
    UsageError,
    add_debug,
    check_output_dir,
    run_cli,
)

PROG = "run_all.py"


def _sections(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(
            f"expected a comma list of sections ({', '.join(S.SECTION_NAMES)}), got {text!r}")
    bad = [n for n in names if n not in S.SECTION_NAMES]
    if bad:
        raise argparse.ArgumentTypeError(
            f"unknown section(s) {bad}; choose from {', '.join(S.SECTION_NAMES)}")
    return names


_sections.__name__ = "section list"


def build_parser() -> argparse.ArgumentParser:
    head, rest = __doc__.split("\n\n", 1)
    ap = ArgumentParser(prog=PROG, description=head,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=rest)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out",
                    help="output directory (default bench/out; an earlier run's results there "
                         "are replaced)")
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
    add_debug(ap)
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, checked (see :func:`check_args`)."""
    args = build_parser().parse_args(argv)
    args.only = [n for group in args.only for n in group]
    args.skip = [n for group in args.skip for n in group]
    check_args(args)
    return args


def check_args(args: argparse.Namespace) -> None:
    """Everything that can be checked before a section runs: contradicting --only/--skip,
    the output directory, and the e2e config, pythons and model (the pythons must be
    executables only when the e2e section is selected)."""
    both = sorted(set(args.only) & set(args.skip))
    if both:
        raise UsageError(f"--skip {','.join(both)}: also given to --only; expected a section "
                         "in one of them")
    check_output_dir("--out", args.out)
    from bench.harness import e2e

    config = args.e2e_config or e2e.DEFAULT_CONFIG
    cfg = e2e.load_config(config, option="--e2e-config")
    pythons = e2e.parse_pythons(args.e2e_python, option="--e2e-python")
    e2e.check_python_names(cfg, pythons, str(config), option="--e2e-python")
    e2e_selected = (not args.only or "e2e" in args.only) and "e2e" not in args.skip
    e2e.plan_matrix(cfg, args.out / "e2e", model=args.e2e_model, pythons=pythons,
                    launching=e2e_selected, where=str(config), python_option="--e2e-python",
                    model_option="--e2e-model")


def main(argv: list[str] | None = None) -> int:
    from bench.harness.suite import run_suite

    return run_cli(PROG, parse_args, run_suite, argv)


if __name__ == "__main__":
    sys.exit(main())
