"""Every finding code of ``vllm-kimi-ext doctor``: one table, its severity and meaning.

The doctor creates findings only through :func:`finding`, which looks the code up
here, so a code cannot be reported without being listed. ``doctor --list-codes``
prints the table, ``docs/doctor.md`` carries it as Markdown between the
:data:`DOC_BEGIN` / :data:`DOC_END` markers (regenerate with
``python -m vllm_kimi_ext.drafts.doctor.codes --write-docs docs``, ``--check-docs docs``
exits 1 when it is stale, as the repository's other document generators do; a test
fails when it is stale).

Severities: ``error`` (the pair fails, or silently loses acceptance or context, in vLLM
0.34.0; or a check the pair needs cannot run: exit 1) and ``warning`` (works, with a
cost worth knowing: exit 0).

Standard library only.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from vllm_kimi_ext.findings import Finding

__all__ = ["DOC_BEGIN", "DOC_END", "FINDING_CODES", "CodeInfo", "finding", "markdown_table",
           "text_table", "write_docs"]

ERROR = "error"
WARNING = "warning"


@dataclasses.dataclass(frozen=True)
class CodeInfo:
    code: str
    severity: str
    meaning: str


FINDING_CODES: tuple[CodeInfo, ...] = (
    # ---- reading the inputs
    CodeInfo("E-CONFIG", ERROR,
             "A `config.json` is missing, not JSON or not a JSON object: nothing else can be "
             "checked (exit 2, not 1)."),
    CodeInfo("E-CONFIG-TYPE", ERROR,
             "A config field has the wrong type or an impossible value (e.g. `architectures` "
             "as a string, `vocab_size` as text or <= 0); the message names the file, the "
             "field and what was expected."),
    CodeInfo("E-CONFIG-MISSING", ERROR,
             "A config field a check needs is absent (e.g. the target's `vocab_size`); the "
             "message names the checks that could not run. Never skipped silently."),
    CodeInfo("E-WEIGHTS-MISSING", ERROR,
             "The draft directory has no `*.safetensors` file, or its "
             "`model.safetensors.index.json` names files that are absent."),
    CodeInfo("E-WEIGHTS-INDEX", ERROR,
             "`model.safetensors.index.json` is not valid JSON or has no `weight_map` object."),
    CodeInfo("E-WEIGHTS-HEADER", ERROR,
             "A safetensors header the loader would refuse: not JSON, a length past the end "
             "of the file, an entry without a dtype / shape / `data_offsets`, offsets that "
             "overlap, leave gaps or disagree with dtype x shape."),
    CodeInfo("E-WEIGHTS-SIZE", ERROR,
             "A safetensors file's size differs from what its header's data offsets require "
             "(a truncated download): vLLM would fail while loading."),
    CodeInfo("E-WEIGHTS-NONFINITE", ERROR,
             "A floating-point tensor of the draft holds NaN or infinite values (e.g. a "
             "training run that diverged): every proposal would be rejected or the "
             "logits poisoned. The message names the tensors."),
    # ---- what the draft is
    CodeInfo("E-METHOD-UNKNOWN", ERROR,
             "No `--method` given and none can be told from the draft's architecture or "
             "config: the method-specific checks cannot run."),
    CodeInfo("E-TARGET-IS-DRAFT", ERROR,
             "The `--target` checkpoint is a draft (draft architecture or draft-only config "
             "keys): `--target` and `--draft` are probably swapped."),
    CodeInfo("E-DRAFT-IS-TARGET", ERROR,
             "The draft is the target checkpoint itself (same directory or same model), "
             "which only `method: mtp` may use."),
    CodeInfo("E-DRAFT-ARCH", ERROR,
             "The draft's architecture is not one the method can load in vLLM 0.34.0 "
             "(EAGLE-3: an `Eagle3*` class; DFlash: a `DFlash*` class; `draft_model`: a "
             "`*ForCausalLM`, not a draft head)."),
    CodeInfo("E-DRAFT-NO-FC", ERROR,
             "An EAGLE-3 or DFlash draft without an `fc` weight (the layer that fuses the "
             "target's hidden states): not a draft head of that kind."),
    CodeInfo("E-ARCH-MTP-REWRITE", ERROR,
             "A DeepSeek-type EAGLE-3 head (`model_type` `deepseek_v3`) that vLLM rewrites "
             "into the non-existent `Eagle3DeepSeekMTPModel`."),
    # ---- context and positions
    CodeInfo("W-CONTEXT-CAP", WARNING,
             "The draft's shorter (yarn) `max_position_embeddings` lowers the served "
             "`max_model_len` for every request."),
    CodeInfo("W-ROPE-THETA", WARNING, "The draft's `rope_theta` differs from the target's."),
    CodeInfo("W-ROPE-SCALING", WARNING,
             "The draft's RoPE scaling type, factor or original length differs from the "
             "target's."),
    CodeInfo("W-ROPE-YARN-FACTOR", WARNING,
             "vLLM 0.34.0 runs a DFlash draft's YaRN rotary embedding at another attention "
             "factor than plain YaRN (vLLM <= 0.29, SGLang) from its `mscale` / "
             "`mscale_all_dim` (1.0 instead of 1.4159 for z-lab/Kimi-K2.5-DFlash); which one "
             "the draft was trained with is not established: `vllm-kimi-ext draft "
             "rope-config` writes the other arm of the A/B that settles it."),
    # ---- hidden states
    CodeInfo("E-AUX-COUNT", ERROR,
             "The number of aux layer ids differs from `num_aux_hidden_states` (shape error "
             "in `fc`)."),
    CodeInfo("E-FC-WIDTH", ERROR,
             "The `fc` weight's input width is not (aux layers x hidden size) as vLLM builds "
             "it."),
    CodeInfo("E-AUX-RANGE", ERROR, "An aux layer id is outside the target's layers."),
    CodeInfo("W-AUX-IDS-IGNORED", WARNING,
             "Aux layer ids given only under `eagle_config`, which vLLM 0.34.0 ignores; its "
             "defaults agree with them."),
    CodeInfo("E-AUX-IDS-IGNORED", ERROR,
             "Aux layer ids given only under `eagle_config`, which vLLM 0.34.0 ignores, and "
             "its defaults differ: the head reads the wrong layers."),
    CodeInfo("E-HIDDEN-MISMATCH", ERROR,
             "The hidden size the draft expects from the target differs from the target's."),
    # ---- vocabulary
    CodeInfo("E-VOCAB-MISMATCH", ERROR, "The draft's `vocab_size` differs from the target's."),
    CodeInfo("E-D2T-MISSING", ERROR,
             "`draft_vocab_size` < vocabulary without a `d2t` tensor: vLLM keeps an all-zero "
             "map and acceptance collapses silently."),
    CodeInfo("E-D2T-DTYPE", ERROR, "`d2t` is not an integer tensor."),
    CodeInfo("E-D2T-SHAPE", ERROR, "`d2t`'s length differs from `draft_vocab_size`."),
    CodeInfo("E-D2T-RANGE", ERROR, "`d2t` maps a draft id outside the target vocabulary."),
    CodeInfo("E-D2T-DUPLICATE", ERROR,
             "`d2t` maps two or more draft ids to the same target id (not injective): the "
             "head proposes fewer distinct tokens than it has rows."),
    CodeInfo("E-T2D-MISMATCH", ERROR,
             "`t2d` has the wrong shape or dtype, or does not mark exactly the target ids "
             "`d2t` maps to."),
    CodeInfo("E-LM-HEAD-ROWS", ERROR, "`lm_head` rows differ from `draft_vocab_size`."),
    CodeInfo("E-SPECIAL-ID", ERROR, "The draft's bos/eos id is outside the target vocabulary."),
    CodeInfo("W-PAD-ID", WARNING, "The draft's pad id is outside the target vocabulary."),
    # ---- DFlash
    CodeInfo("E-DFLASH-MASK-ID", ERROR,
             "A DFlash draft's `mask_token_id` is missing or outside its vocabulary: masked "
             "block slots would embed garbage."),
    CodeInfo("E-DFLASH-BLOCK", ERROR,
             "A DFlash draft declares no block size (`block_size`, top level or in "
             "`dflash_config`): the number of tokens it was trained to draft per step "
             "(`num_speculative_tokens` = block size - 1) is unknown."),
    # ---- MTP
    CodeInfo("E-MTP-NO-LAYERS", ERROR,
             "`method: mtp` but no MTP layers declared: vLLM would build a second full "
             "target."),
    CodeInfo("E-MTP-TENSORS-MISSING", ERROR, "MTP layers declared, their tensors absent."),
    CodeInfo("E-MTP-SHAPE", ERROR, "An MTP tensor has the wrong shape."),
    CodeInfo("E-MTP-QUANT-FORMAT", ERROR,
             "MTP experts stored unquantized where the compressed-tensors config quantizes "
             "them (or the reverse): loading fails on the first expert."),
)
BY_CODE: dict[str, CodeInfo] = {c.code: c for c in FINDING_CODES}

DOC_BEGIN = "<!-- BEGIN finding codes (generated by vllm_kimi_ext.drafts.doctor.codes) -->"
DOC_END = "<!-- END finding codes -->"
DOC_FILE = "doctor.md"


def finding(code: str, message: str, *, file: str | Path | None = None,
            field: str | None = None) -> Finding:
    """A doctor finding; its severity comes from the table (unknown codes raise)."""
    return Finding(code, BY_CODE[code].severity, message,
                   file=None if file is None else str(file), field=field)


def text_table() -> str:
    width = max(len(c.code) for c in FINDING_CODES)
    return "\n".join(f"{c.code:<{width}}  {c.severity:<7}  {c.meaning.replace('`', '')}"
                     for c in FINDING_CODES)


def markdown_table() -> str:
    rows = ["| code | severity | meaning |", "|---|---|---|"]
    rows += [f"| `{c.code}` | {c.severity} | {c.meaning} |" for c in FINDING_CODES]
    return "\n".join(rows)


def render_doc(text: str) -> str:
    """``text`` (the man page) with the generated table between the markers."""
    head, sep, rest = text.partition(DOC_BEGIN)
    _, sep2, tail = rest.partition(DOC_END)
    if not sep or not sep2:
        raise ValueError(f"{DOC_FILE} lacks the {DOC_BEGIN!r} / {DOC_END!r} markers")
    return f"{head}{DOC_BEGIN}\n{markdown_table()}\n{DOC_END}{tail}"


def write_docs(directory: str | Path) -> Path:
    """Regenerate the table in ``DIRECTORY/doctor.md`` (left alone when current)."""
    path = Path(directory) / DOC_FILE
    text = path.read_text(encoding="utf-8")
    fresh = render_doc(text)
    if fresh != text:
        path.write_text(fresh, encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    """The repository's doc-generator convention: ``--write-docs DIR`` updates the
    generated table of ``DIR/doctor.md`` in place, ``--check-docs DIR`` exits 1 when it
    is stale; without either, print the table."""
    p = argparse.ArgumentParser(description="Print or regenerate the doctor's finding codes.")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--write-docs", metavar="DIR", help=f"update the table in DIR/{DOC_FILE}")
    group.add_argument("--check-docs", metavar="DIR",
                       help=f"exit 1 when the table in DIR/{DOC_FILE} is stale")
    args = p.parse_args(argv)
    if args.write_docs:
        print(write_docs(args.write_docs))
    elif args.check_docs:
        path = Path(args.check_docs) / DOC_FILE
        text = path.read_text(encoding="utf-8")
        if render_doc(text) != text:
            print(f"{path} is stale: python -m {__name__} --write-docs {args.check_docs}",
                  file=sys.stderr)
            return 1
    else:
        print(markdown_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
