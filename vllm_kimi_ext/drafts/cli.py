"""Draft subcommands of ``vllm-kimi-ext``.

``register(subparsers)`` adds each draft subcommand; further subcommands of the
draft tools are added here next to ``doctor`` (keep ``register`` composable:
one ``_register_*`` helper per subcommand, heavy imports inside handlers).
Every handler follows the exit-code contract of :mod:`vllm_kimi_ext.cli` (0 clean,
1 findings, 2 usage / unreadable input): it returns its verdict and raises
:class:`~vllm_kimi_ext.user_input.UserInputError` for input it refuses.

``vllm-kimi-ext doctor --target T --draft D [--method M] [--max-model-len N] [--json]``
checks a draft checkpoint directory against a target directory (configs and
safetensors headers only); ``doctor --list-codes`` lists every finding code.
Exit codes: 0 no errors (warnings allowed), 1 errors found, 2 unreadable input.

``vllm-kimi-ext draft tli-check --target T --draft D [--json]`` reports how a
draft tokenizer maps onto the target's for ``method: kimi_tli``
(:mod:`vllm_kimi_ext.drafts.tli.maps`). Exit codes: 0 usable, 1 below
``--min-shared-fraction``, 2 refused input.

``vllm-kimi-ext draft shrink-vocab --head H --tokenizer T --corpus F [...] --out O``
turns a full-vocabulary EAGLE-3 head into a reduced-vocabulary one
(:mod:`vllm_kimi_ext.drafts.shrink_vocab.shrink`). Exit codes: 0 written, 2 refused
input (nothing written).

``vllm-kimi-ext draft rope-config --draft D --out O [--attention-factor F]`` writes a local
copy of a YaRN draft (``config.json`` with an explicit ``rope_scaling.attention_factor``,
every other file linked) so vLLM 0.34.0 runs it at a chosen factor: one arm of the A/B that
tells which factor the draft accepts better (:mod:`vllm_kimi_ext.drafts.rope_config`;
DeepSeek / MLA heads are refused). Exit codes: 0 written, 2 refused input (nothing written).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vllm_kimi_ext.user_input import (
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_USAGE,
    MAX_VOCAB_SIZE,
    UsageError,
    UserInputError,
    bounded_float,
    bounded_int,
    one_line_errors,
)

EXIT_ERRORS = EXIT_FINDINGS
EXIT_BAD_INPUT = EXIT_USAGE


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_doctor(subparsers)
    _register_draft(subparsers)


def _register_doctor(subparsers: argparse._SubParsersAction) -> None:
    from .doctor.diagnosis import METHODS

    p = subparsers.add_parser(
        "doctor",
        help="check an EAGLE-3 / DFlash / MTP / draft_model draft against a Kimi-K2.5 target",
        description=(
            "Check a draft checkpoint directory against the target's (config.json files and "
            "safetensors headers checked against the file sizes; no weights are loaded). "
            "Reports coded findings (--list-codes lists them all): errors (the pair will "
            "fail or silently lose acceptance in vLLM 0.34.0, or a check it needs cannot "
            "run) and warnings (it works with a cost, e.g. a capped context). Exit code 0 "
            "without errors, 1 with errors, 2 on unreadable input."
        ),
    )
    p.add_argument("--target", help="target checkpoint directory")
    p.add_argument("--draft",
                   help="draft checkpoint directory (for --method mtp: the directory holding "
                        "the MTP layer, possibly the target itself)")
    p.add_argument("--method", choices=METHODS, default=None,
                   help="speculative method (detected from the draft when omitted)")
    p.add_argument("--max-model-len", type=bounded_int(1, what="an integer"),
                   default=None,
                   help="context the target is served with (default: its "
                        "max_position_embeddings)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--list-codes", action="store_true",
                   help="list every finding code with its severity and meaning, and exit")
    p.set_defaults(func=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    from .doctor.codes import FINDING_CODES, text_table
    from .doctor.diagnosis import diagnose

    if args.list_codes:
        if args.json:
            print(json.dumps([c.__dict__ for c in FINDING_CODES], indent=2))
        else:
            print(text_table())
        return EXIT_OK
    missing = [f"--{n}" for n in ("target", "draft") if not getattr(args, n)]
    if missing:
        raise UsageError(f"{' and '.join(missing)} required (or --list-codes)",
                         field=missing[0], expected="a checkpoint directory")
    report = diagnose(args.target, args.draft, method=args.method,
                      served_max_model_len=args.max_model_len)
    print(report.to_json() if args.json else report.format_text())
    if report.unreadable:
        raise UserInputError(report.errors[0].message, expected="a readable config.json")
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
    sub = p.add_subparsers(dest="draft_command", metavar="DRAFT_COMMAND")
    _register_shrink_vocab(sub)
    _register_tli_check(sub)
    _register_rope_config(sub)
    # draft regenerate ... bill: vllm_kimi_ext.cli adds them (train depends on drafts)

    def needs_a_command(args: argparse.Namespace) -> int:
        raise UsageError(f"a DRAFT_COMMAND is required ({', '.join(sub.choices)})",
                         field="DRAFT_COMMAND", expected=", ".join(sub.choices))

    p.set_defaults(func=needs_a_command)


def _register_rope_config(subparsers: argparse._SubParsersAction) -> None:
    from .rope_config import DEFAULT_FACTOR

    p = subparsers.add_parser(
        "rope-config",
        help="copy a YaRN draft with an explicit RoPE attention factor (one arm of an A/B)",
        description=(
            "Write a local copy of a YaRN draft directory whose config.json carries an "
            "explicit rope_scaling.attention_factor (every other file is linked, not copied), "
            "so vLLM 0.34.0 runs the draft's rotary embedding at that factor instead of the "
            "one it derives from mscale / mscale_all_dim. Serve the copy as the "
            "speculative config's model, beside the original, to measure which factor the "
            "draft accepts better. Refused: DeepSeek / MLA heads (vLLM 0.34.0 rewrites their "
            "rope to deepseek_yarn, which never reads attention_factor) and configs whose "
            "rope_scaling and rope_parameters differ. Exit code 0 written, 2 refused input "
            "(nothing written)."),
        epilog=f"default --attention-factor: {DEFAULT_FACTOR}.")
    p.add_argument("--draft", required=True, type=Path, help="the draft checkpoint directory")
    p.add_argument("--out", required=True, type=Path,
                   help="the copy to write (a new directory, or an empty one)")
    p.add_argument("--attention-factor", default=None,
                   type=bounded_float(0.0, 16.0, lo_open=True, what="an attention factor"),
                   help="the factor to write (a number in [0.0001, 16]; default: plain YaRN, "
                        "see below)")
    p.set_defaults(func=run_rope_config)
    one_line_errors(p)


def run_rope_config(args: argparse.Namespace) -> int:
    from .rope_config import write_copy

    done = write_copy(args.draft, args.out, args.attention_factor)
    how = ("the plain-YaRN value 0.1 * ln(factor) + 1 (vLLM <= 0.29, SGLang), the default"
           if done["default"] else "--attention-factor")
    print(f"wrote {done['out']}: config.json with rope_scaling.attention_factor = "
          f"{done['attention_factor']:.4f} ({how}; vLLM 0.34.0 runs the original at "
          f"{done['vllm_0_34_factor']:.4f} from {done['vllm_0_34_why']}; which factor the "
          f"draft was trained with is not established: serve both and compare acceptance), "
          f"{done['linked']} other entries linked from {args.draft}")
    return EXIT_OK


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
    vocab = bounded_int(1, MAX_VOCAB_SIZE, what="a vocabulary size")
    p.add_argument("--target", required=True, help="target tokenizer directory")
    p.add_argument("--draft", required=True, help="draft tokenizer directory")
    p.add_argument("--target-vocab-size", type=vocab, default=None,
                   help="the target model's logits width (default: the tokenizer's ids)")
    p.add_argument("--draft-vocab-size", type=vocab, default=None,
                   help="the draft model's logits width (default: the tokenizer's ids)")
    p.add_argument("--min-shared-fraction", type=bounded_float(0.0, 1.0, what="a fraction"),
                   default=0.0,
                   help="exit 1 when fewer of the target's regular tokens are shared "
                        "(a number in [0, 1])")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run_tli_check)


def run_tli_check(args: argparse.Namespace) -> int:
    from .tli.maps import build_tli_maps

    maps = build_tli_maps(args.target, args.draft, target_vocab_size=args.target_vocab_size,
                          draft_vocab_size=args.draft_vocab_size)
    summary = maps.summary()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"target {args.target}\ndraft  {args.draft}\n{maps.describe()}")
        print("special tokens matched by name: " + (", ".join(summary["shared_special_tokens"])
                                                    or "none"))
    if summary["shared_regular_fraction"] < args.min_shared_fraction:
        import sys

        print(f"tli-check: {100 * summary['shared_regular_fraction']:.1f}% of the target's "
              f"regular tokens are shared, below --min-shared-fraction "
              f"{100 * args.min_shared_fraction:.1f}%", file=sys.stderr)
        return EXIT_ERRORS
    return EXIT_OK


def _register_shrink_vocab(subparsers: argparse._SubParsersAction) -> None:
    from .shrink_vocab.corpus import DEFAULT_FIELDS
    from .shrink_vocab.shrink import DEFAULT_SIZE  # light module (no torch import)

    p = subparsers.add_parser(
        "shrink-vocab",
        help="reduce a full-vocabulary EAGLE-3 head to the most frequent tokens",
        description=(
            "Write a reduced-vocabulary copy of a full-vocabulary EAGLE-3 head: lm_head cut "
            "to SIZE rows (special, added and chat-template tokens always kept, the rest "
            "chosen by frequency on the corpora tokenized with the target's tokenizer), "
            "d2t/t2d maps added, draft_vocab_size set, coverage.json / coverage.md written. "
            "The output appears atomically (written next to --out, renamed at the end; an "
            "interrupted run leaves nothing, and a killed run's leftovers are removed by the "
            "next). Exit code 0 written, 2 refused input."
        ),
    )
    p.add_argument("--head", required=True, help="full-vocabulary EAGLE-3 head directory")
    p.add_argument("--tokenizer", required=True,
                   help="the target's tokenizer (directory or name for AutoTokenizer)")
    p.add_argument("--corpus", required=True, action="append", metavar="FILE",
                   help="corpus file (JSONL, a JSON array of records, or plain text; "
                        "optionally .gz); repeatable")
    p.add_argument("--field", action="append", default=[], metavar="[FILE:]FIELD",
                   help="record field holding the text, for every JSON corpus or (FILE:FIELD, "
                        "FILE as given to --corpus) for one; repeatable (default: first "
                        "present of " + ", ".join(DEFAULT_FIELDS) + ")")
    p.add_argument("--text-unit", choices=("line", "file"), default="line",
                   help="plain-text corpora: one document per line (default) or per file")
    p.add_argument("--size", type=bounded_int(1, MAX_VOCAB_SIZE, what="a vocabulary size"),
                   default=DEFAULT_SIZE,
                   help=f"draft vocabulary size (default {DEFAULT_SIZE}; < the vocab size)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow the tokenizer's own code (Kimi tokenizers need it)")
    p.add_argument("--out", required=True, help="output head directory")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--json", action="store_true", help="print the coverage report as JSON")
    p.set_defaults(func=run_shrink_vocab)


def parse_fields(specs: list[str], corpora: list[str]) -> tuple[str | None, dict[str, str]]:
    """``--field`` values as (field for every corpus, {corpus path: field})."""
    default: str | None = None
    per_file: dict[str, str] = {}
    for spec in specs:
        path, sep, name = spec.rpartition(":")
        if sep and path in corpora:
            per_file[path] = name
        elif sep and path:
            raise UsageError(
                f"--field {spec}: {path!r} is not one of the --corpus files "
                f"({', '.join(corpora)})", field="--field",
                expected="FIELD or FILE:FIELD with FILE as given to --corpus")
        elif default is not None:
            raise UsageError(f"--field given twice for every corpus ({default!r}, {spec!r})",
                             field="--field", expected="one FIELD, or FILE:FIELD per file")
        else:
            default = spec
    if (default is not None and not default) or any(not v for v in per_file.values()):
        raise UsageError("--field names an empty field", field="--field",
                         expected="a record field name")
    return default, per_file


def _refuse_remote_code_without_trust(tokenizer: str, trust: bool) -> None:
    """A tokenizer directory that ships its own code would be replaced by transformers'
    generic conversion without --trust-remote-code, tokenizing differently."""
    config = Path(tokenizer) / "tokenizer_config.json"
    if trust or not config.is_file():
        return
    try:
        auto_map = json.loads(config.read_text(encoding="utf-8")).get("auto_map") or {}
    except (OSError, ValueError, AttributeError) as exc:
        raise UserInputError(f"tokenizer {config} is not a readable JSON object ({exc})",
                             file=config, expected="a JSON tokenizer config") from None
    entry = auto_map.get("AutoTokenizer") if isinstance(auto_map, dict) else None
    if entry:
        raise UserInputError(
            f"tokenizer {tokenizer} ships its own code (tokenizer_config.json auto_map."
            f"AutoTokenizer = {entry}); without --trust-remote-code transformers would "
            "fall back to a generic conversion that tokenizes differently. Pass "
            "--trust-remote-code (after reading the code) to use it.", file=config,
            field="auto_map", expected="--trust-remote-code for a tokenizer with auto_map")


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


def _load_tokenizer(name: str, trust_remote_code: bool) -> _HFTokenizer:
    _refuse_remote_code_without_trust(name, trust_remote_code)
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - any loader failure is bad input
        raise UserInputError(f"cannot load tokenizer {name}: {type(exc).__name__}: {exc}",
                             file=name, expected="a tokenizer AutoTokenizer can load") from None
    return _HFTokenizer(tok)


def run_shrink_vocab(args: argparse.Namespace) -> int:
    from .shrink_vocab.output_dir import terminate_as_interrupt
    from .shrink_vocab.shrink import check_inputs, shrink_vocab

    field, per_file = parse_fields(args.field, args.corpus)
    # everything cheap first: the output path, the head, the corpus files' first bytes
    check_inputs(args.head, args.corpus, args.out, force=args.force, fields_by_file=per_file)
    tokenizer = _load_tokenizer(args.tokenizer, args.trust_remote_code)
    with terminate_as_interrupt():  # SIGTERM cleans up like Ctrl-C
        report = shrink_vocab(args.head, tokenizer, args.corpus, args.size, args.out,
                              field=field, force=args.force, text_unit=args.text_unit,
                              progress=True, fields_by_file=per_file)
    print(report.to_json() if args.json else report.format_text())
    return EXIT_OK
