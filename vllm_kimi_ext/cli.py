"""``vllm-kimi-ext`` command line.

Each feature module contributes its subcommands through a ``register(subparsers)``
function listed in ``_SUBCOMMAND_MODULES``; modules are imported when the parser
is built, so they must keep heavy imports (torch, vLLM) inside their handlers.
"""

from __future__ import annotations

import argparse
import importlib
import sys

_SUBCOMMAND_MODULES = (
    "vllm_kimi_ext.costmodel.cli",  # plan
    "vllm_kimi_ext.drafts.cli",  # doctor, draft shrink-vocab
    "vllm_kimi_ext.tokenizers.cli",  # tokenizer-check
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-kimi-ext",
        description="Tools for speculative decoding of Kimi-K2.5 on PCIe-only GPUs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a real missing dependency, not an unbuilt feature
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
