"""Draft subcommands of ``vllm-kimi-ext``.

``register(subparsers)`` adds each draft subcommand; further subcommands of the
draft tools are added here next to ``doctor`` (keep ``register`` composable:
one ``_register_*`` helper per subcommand, heavy imports inside handlers).

``vllm-kimi-ext doctor --target T --draft D [--method M] [--max-model-len N] [--json]``
checks a draft checkpoint directory against a target directory (configs and
safetensors headers only). Exit codes: 0 no errors (warnings allowed),
1 errors found, 2 unreadable input.
"""

from __future__ import annotations

import argparse
import sys

EXIT_OK = 0
EXIT_ERRORS = 1
EXIT_BAD_INPUT = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_doctor(subparsers)


def _register_doctor(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "doctor",
        help="check an EAGLE-3 / DFlash / MTP draft against a Kimi-K2.5 target",
        description=(
            "Check a draft checkpoint directory against the target's (config.json files and "
            "safetensors headers; no weights are loaded). Reports coded findings: errors "
            "(the pair will fail or silently lose acceptance in vLLM 0.34.0) and warnings "
            "(it works with a cost, e.g. a capped context). Exit code 0 without errors, "
            "1 with errors, 2 on unreadable input."
        ),
    )
    p.add_argument("--target", required=True, help="target checkpoint directory")
    p.add_argument("--draft", required=True,
                   help="draft checkpoint directory (for --method mtp: the directory holding "
                        "the MTP layer, possibly the target itself)")
    p.add_argument("--method", choices=("eagle3", "dflash", "mtp"), default=None,
                   help="speculative method (detected from the draft when omitted)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="context the target is served with (default: its "
                        "max_position_embeddings)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    from .doctor import diagnose

    report = diagnose(args.target, args.draft, method=args.method,
                      served_max_model_len=args.max_model_len)
    print(report.to_json() if args.json else report.format_text())
    if any(f.code == "E-CONFIG" for f in report.errors):
        print(f"doctor: error: {report.errors[0].message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_ERRORS if report.errors else EXIT_OK
