"""``vllm-kimi-ext tokenizer-check TARGET DRAFT [--json]``.

Exit codes: 0 identical or compatible, 1 incompatible, 2 bad input (a malformed file:
duplicate, negative or colliding ids, invalid JSON ... named with file and line).
"""

from __future__ import annotations

import argparse
import json

from vllm_kimi_ext.user_input import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE

EXIT_INCOMPATIBLE = EXIT_FINDINGS
EXIT_BAD_INPUT = EXIT_USAGE


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "tokenizer-check",
        help="compare a draft's Kimi-format tokenizer directory with the target's",
        description=(
            "Compare two Kimi-format tokenizer directories (tiktoken.model + "
            "tokenizer_config.json): rank files, special tokens, the tokens the target's "
            "chat template uses, bos/eos/pad ids and vocab sizes. Verdict identical, "
            "compatible (every id the target can emit or its template uses means the same "
            "in the draft) or incompatible. Exit code 0 identical/compatible, "
            "1 incompatible, 2 bad input."
        ),
    )
    p.add_argument("target", help="target tokenizer directory")
    p.add_argument("draft", help="draft tokenizer directory")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .compare import check_tokenizers
    from .errors import TokenizerInputError

    try:
        report = check_tokenizers(args.target, args.draft)
    except TokenizerInputError as exc:
        if args.json:
            print(
                json.dumps(
                    {"verdict": "error", "error": str(exc), "path": exc.path, "line": exc.line}
                )
            )
        raise  # one line on stderr, exit 2 (vllm_kimi_ext.cli)
    if args.json:
        print(report.to_json(indent=2))
    else:
        print(report.format_text())
    return EXIT_INCOMPATIBLE if report.verdict == "incompatible" else EXIT_OK
