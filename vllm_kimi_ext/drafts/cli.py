"""Draft subcommands of ``vllm-kimi-ext``.

``register(subparsers)`` adds each draft subcommand; further subcommands of the
draft tools are added here next to ``doctor`` (keep ``register`` composable:
one ``_register_*`` helper per subcommand, heavy imports inside handlers).

``vllm-kimi-ext doctor --target T --draft D [--method M] [--max-model-len N] [--json]``
checks a draft checkpoint directory against a target directory (configs and
safetensors headers only). Exit codes: 0 no errors (warnings allowed),
1 errors found, 2 unreadable input.

``vllm-kimi-ext draft tli-check --target T --draft D [--json]`` reports how a
draft tokenizer maps onto the target's for ``method: kimi_tli``
(:mod:`vllm_kimi_ext.drafts.tli`). Exit codes: 0 usable, 1 below
``--min-shared-fraction``, 2 refused input.

``vllm-kimi-ext draft shrink-vocab --head H --tokenizer T --corpus F [...] --out O``
turns a full-vocabulary EAGLE-3 head into a reduced-vocabulary one
(:mod:`vllm_kimi_ext.drafts.shrink_vocab`). Exit codes: 0 written, 2 refused
input (nothing written).
"""

from __future__ import annotations

import argparse
import sys

EXIT_OK = 0
EXIT_ERRORS = 1
EXIT_BAD_INPUT = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_doctor(subparsers)
    _register_draft(subparsers)


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


# --------------------------------------------------------------------------- #
# draft command group                                                          #
# --------------------------------------------------------------------------- #


def _register_draft(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "draft",
        help="build or transform draft checkpoints",
        description="Tools that write draft checkpoints.",
    )
    p.set_defaults(func=lambda args: (p.print_help(), EXIT_BAD_INPUT)[1])
    sub = p.add_subparsers(dest="draft_command", metavar="DRAFT_COMMAND")
    _register_shrink_vocab(sub)
    _register_tli_check(sub)
    from vllm_kimi_ext.train.cli import register_draft_subcommands  # regenerate ... bill

    register_draft_subcommands(sub)


def _register_tli_check(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "tli-check",
        help="how well a draft with another tokenizer maps onto the target's (kimi_tli)",
        description=(
            "Build the Token-Level-Intersection maps that `method: kimi_tli` uses for a "
            "target and a draft tokenizer (Kimi-format tiktoken.model or Hugging Face "
            "tokenizer.json): shared tokens, the share of the target's regular tokens the "
            "draft can propose, the special tokens matched by name, and how the draft's "
            "inputs are projected. Nothing is loaded but the tokenizer files. Exit code 0 "
            "usable, 1 below --min-shared-fraction, 2 refused input."
        ),
    )
    p.add_argument("--target", required=True, help="target tokenizer directory")
    p.add_argument("--draft", required=True, help="draft tokenizer directory")
    p.add_argument("--target-vocab-size", type=int, default=None,
                   help="the target model's logits width (default: the tokenizer's ids)")
    p.add_argument("--draft-vocab-size", type=int, default=None,
                   help="the draft model's logits width (default: the tokenizer's ids)")
    p.add_argument("--min-shared-fraction", type=float, default=0.0,
                   help="exit 1 when fewer of the target's regular tokens are shared")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run_tli_check)


def run_tli_check(args: argparse.Namespace) -> int:
    import json

    from .tli import TLIConfigError, build_tli_maps

    try:
        maps = build_tli_maps(args.target, args.draft, target_vocab_size=args.target_vocab_size,
                              draft_vocab_size=args.draft_vocab_size)
    except TLIConfigError as exc:
        print(f"tli-check: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    summary = maps.summary()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"target {args.target}\ndraft  {args.draft}\n{maps.describe()}")
        print("special tokens matched by name: " + (", ".join(summary["shared_special_tokens"])
                                                    or "none"))
    if summary["shared_regular_fraction"] < args.min_shared_fraction:
        print(f"tli-check: {100 * summary['shared_regular_fraction']:.1f}% of the target's "
              f"regular tokens are shared, below --min-shared-fraction "
              f"{100 * args.min_shared_fraction:.1f}%", file=sys.stderr)
        return EXIT_ERRORS
    return EXIT_OK


def _register_shrink_vocab(subparsers: argparse._SubParsersAction) -> None:
    from .shrink_vocab import DEFAULT_FIELDS, DEFAULT_SIZE  # light module (no torch import)

    p = subparsers.add_parser(
        "shrink-vocab",
        help="reduce a full-vocabulary EAGLE-3 head to the most frequent tokens",
        description=(
            "Write a reduced-vocabulary copy of a full-vocabulary EAGLE-3 head: lm_head cut "
            "to SIZE rows (special, added and chat-template tokens always kept, the rest "
            "chosen by frequency on the corpora tokenized with the target's tokenizer), "
            "d2t/t2d maps added, draft_vocab_size set, coverage.json / coverage.md written. "
            "The output appears atomically. Exit code 0 written, 2 refused input."
        ),
    )
    p.add_argument("--head", required=True, help="full-vocabulary EAGLE-3 head directory")
    p.add_argument("--tokenizer", required=True,
                   help="the target's tokenizer (directory or name for AutoTokenizer)")
    p.add_argument("--corpus", required=True, action="append", metavar="FILE",
                   help="corpus file (JSONL or plain text, optionally .gz); repeatable")
    p.add_argument("--field", default=None,
                   help="JSONL record field holding the text (default: first present of "
                        + ", ".join(DEFAULT_FIELDS) + ")")
    p.add_argument("--text-unit", choices=("line", "file"), default="line",
                   help="plain-text corpora: one document per line (default) or per file")
    p.add_argument("--size", type=int, default=DEFAULT_SIZE,
                   help=f"draft vocabulary size (default {DEFAULT_SIZE}; < the vocab size)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow the tokenizer's own code (Kimi tokenizers need it)")
    p.add_argument("--out", required=True, help="output head directory")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--json", action="store_true", help="print the coverage report as JSON")
    p.set_defaults(func=run_shrink_vocab)


class _HFTokenizer:
    """A transformers tokenizer seen through shrink_vocab's interface: counts
    the text's own tokens (no BOS/EOS added)."""

    def __init__(self, tok) -> None:
        self._tok = tok
        self.all_special_ids = list(tok.all_special_ids)
        self.added_tokens_decoder = dict(getattr(tok, "added_tokens_decoder", {}) or {})
        self.chat_template = getattr(tok, "chat_template", None)
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            setattr(self, name, getattr(tok, name, None))

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)

    def __len__(self) -> int:
        return len(self._tok)


def run_shrink_vocab(args: argparse.Namespace) -> int:
    from .shrink_vocab import ShrinkVocabError, shrink_vocab

    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.tokenizer,
                                            trust_remote_code=args.trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - any loader failure is bad input
        print(f"shrink-vocab: error: cannot load tokenizer {args.tokenizer}: {exc}",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        report = shrink_vocab(args.head, _HFTokenizer(tok), args.corpus, args.size, args.out,
                              field=args.field, force=args.force, text_unit=args.text_unit,
                              progress=True)
    except (ShrinkVocabError, OSError) as exc:
        print(f"shrink-vocab: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(report.to_json() if args.json else report.format_text())
    return EXIT_OK
