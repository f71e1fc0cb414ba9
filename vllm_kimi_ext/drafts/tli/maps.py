"""Index maps that let a draft with *another tokenizer* draft for a Kimi target.

:mod:`vllm_kimi_ext.drafts.tli.cross_tokenizer` holds the algorithm (Token-Level
Intersection: restrict the draft distribution to the tokens both vocabularies
share, renormalize, map to target ids, verify with standard rejection sampling).
This module builds what a serving engine needs to run it:

* ``shared_draft_ids`` / ``shared_target_ids``: the intersection as two aligned
  index vectors.  The proposal logits over the target vocabulary are the draft's
  logits scattered to ``shared_target_ids`` with ``-inf`` elsewhere; a softmax of
  that row *is* the restricted, renormalized TLI distribution, so vLLM's own
  Gumbel sampler, draft-logits cache and rejection sampler run unchanged on it.
* ``target_to_draft_input``: one draft id per target id, to feed the draft the
  context it has to condition on.  The draft runs position-aligned with the
  target (same positions, same KV slots), so each target token becomes exactly
  one draft token: its exact counterpart when the token is shared, otherwise the
  draft token that is the *longest suffix* of its bytes (the most recent text is
  what predicts the next token best).  This projection is a heuristic for
  acceptance only -- whatever the draft conditions on, the proposal is drawn from
  the distribution the verifier is given, so the output distribution is the
  target's (see the proof in :mod:`~vllm_kimi_ext.drafts.tli.cross_tokenizer`).

Tokenizers are read from disk by :mod:`vllm_kimi_ext.tokenizers.loading`:
Kimi-format directories (``tiktoken.model`` + ``tokenizer_config.json``) and
Hugging Face ``tokenizer.json`` BPE vocabularies (byte-level as in Qwen /
Llama-3, or SentencePiece-style ``▁`` with byte fallback as in Llama-2 /
Mistral).  Regular tokens are keyed by their byte strings; special and added
tokens by their names, so Kimi's ``<|im_end|>`` matches another family's
``<|im_end|>`` but never the text "<|im_end|>".

No vLLM import here: the maps are built and tested without it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vllm_kimi_ext.tokenizers.errors import TokenizerInputError
from vllm_kimi_ext.tokenizers.loading import Key, drop_reserved, vocab_keys
from vllm_kimi_ext.user_input import MAX_VOCAB_SIZE, UserInputError

from .cross_tokenizer import VocabIntersection, build_intersection

__all__ = [
    "TLIConfigError",
    "TLIMaps",
    "build_tli_maps",
    "gather_table",
    "gather_to_target",
    "scatter_to_target",
]


class TLIConfigError(UserInputError):
    """A cross-tokenizer draft that cannot be set up (named reason)."""


# ------------------------------------------------------------------ vocabulary keys


def _vocab_keys(directory: str | Path, size: int | None, role: str) -> list[Key]:
    """Per-id keys of a tokenizer directory, reserved fillers made holes, sized to
    the model's logits width; any unreadable tokenizer, or one giving two ids the same
    token (colliding ids), is a :class:`TLIConfigError`."""
    if size is not None and not 0 < size <= MAX_VOCAB_SIZE:
        raise TLIConfigError(f"{role} vocab size must be in [1, {MAX_VOCAB_SIZE}], got {size}",
                             field=f"{role}_vocab_size", expected="a model's logits width")
    try:
        keys = drop_reserved(vocab_keys(directory))
    except TokenizerInputError as exc:
        raise TLIConfigError(str(exc), file=exc.file, field=exc.field,
                             expected=exc.expected) from exc
    first: dict[Key, int] = {}
    for i, k in enumerate(keys):
        if k is not None and first.setdefault(k, i) != i:
            raise TLIConfigError(
                f"{role} tokenizer {directory}: token {k!r} has ids {first[k]} and {i} "
                "(colliding ids: one token must have one id)", file=directory,
                expected="one id per token")
    return _sized(keys, size, str(directory), role)


# ----------------------------------------------------------------------------- maps


def _sized(keys: list[Key], size: int | None, where: str, role: str) -> list[Key]:
    if size is None:
        return keys
    limit = 2 * len(keys) + 1024  # logits widths pad the tokenizer's ids by a few hundred
    if size > limit:
        raise TLIConfigError(
            f"{role} vocab size {size} is more than twice the {len(keys)} ids of the {role} "
            f"tokenizer {where}: a model's logits width is its tokenizer's id count rounded "
            f"up (at most {limit} here); check --{role}-vocab-size",
            field=f"{role}_vocab_size", expected=f"at most {limit}")
    extra = [i for i in range(size, len(keys)) if keys[i] is not None]
    if extra:
        raise TLIConfigError(
            f"{role} tokenizer {where} defines ids up to {extra[-1]} but the {role} model's "
            f"vocab_size is {size}: the tokenizer does not belong to this model")
    return keys[:size] + [None] * (size - len(keys))


@dataclass(frozen=True)
class TLIMaps:
    """What the engine needs for Token-Level-Intersection drafting."""

    intersection: VocabIntersection
    target_to_draft_input: torch.Tensor  # int64 [target_vocab]: the draft id fed per target id
    num_exact_inputs: int  # target ids whose draft input is their exact counterpart
    num_suffix_inputs: int  # ... the longest draft suffix of their bytes
    num_default_inputs: int  # ... the default id (no byte overlap / holes)
    target_regular: int  # target ids keyed by bytes
    shared_regular: int
    shared_special: list[str] = field(default_factory=list)
    default_input_id: int = 0

    @property
    def shared_draft_ids(self) -> torch.Tensor:
        return self.intersection.shared_draft_ids

    @property
    def shared_target_ids(self) -> torch.Tensor:
        return self.intersection.shared_target_ids

    @property
    def target_vocab_size(self) -> int:
        return self.intersection.target_vocab_size

    @property
    def draft_vocab_size(self) -> int:
        return self.intersection.draft_vocab_size

    def summary(self) -> dict[str, Any]:
        return {
            "target_vocab_size": self.target_vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "shared_tokens": self.intersection.size,
            "shared_regular_tokens": self.shared_regular,
            "target_regular_tokens": self.target_regular,
            "shared_regular_fraction": (
                self.shared_regular / self.target_regular if self.target_regular else 0.0),
            "shared_special_tokens": self.shared_special,
            "draft_inputs_exact": self.num_exact_inputs,
            "draft_inputs_longest_suffix": self.num_suffix_inputs,
            "draft_inputs_default": self.num_default_inputs,
        }

    def describe(self) -> str:
        s = self.summary()
        return (f"{s['shared_tokens']} shared tokens ({s['shared_regular_tokens']}/"
                f"{s['target_regular_tokens']} = {100 * s['shared_regular_fraction']:.1f}% of "
                f"the target's regular tokens, {len(self.shared_special)} special); draft "
                f"inputs: {s['draft_inputs_exact']} exact, {s['draft_inputs_longest_suffix']} "
                f"by longest suffix, {s['draft_inputs_default']} default")

    # -- the two operations the speculator performs on device ---------------------

    def scatter_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """``[N, Vd]`` draft logits -> ``[N, Vt]`` proposal logits (``-inf`` off the
        intersection).  Softmax of the result = the TLI distribution."""
        dev = draft_logits.device
        return scatter_to_target(draft_logits, self.shared_draft_ids.to(dev),
                                 self.shared_target_ids.to(dev), self.target_vocab_size)

    def draft_inputs(self, target_ids: torch.Tensor) -> torch.Tensor:
        return project_inputs(target_ids, self.target_to_draft_input.to(target_ids.device))


def scatter_to_target(draft_logits: torch.Tensor, shared_draft: torch.Tensor,
                      shared_target: torch.Tensor, target_vocab_size: int) -> torch.Tensor:
    """Reference: ``[N, Vd]`` -> ``[N, Vt]``, ``-inf`` off the intersection."""
    out = draft_logits.new_full((draft_logits.shape[0], target_vocab_size), float("-inf"))
    out[:, shared_target] = draft_logits.index_select(1, shared_draft)
    return out


def gather_table(intersection: VocabIntersection) -> torch.Tensor:
    """``[Vt]`` int32: the draft id whose logit lands at each target id, or ``Vd``
    (one past the draft vocabulary: ``-inf``) for target-only ids."""
    t2d = intersection.target_to_draft
    return torch.where(t2d >= 0, t2d, intersection.draft_vocab_size).to(torch.int32)


def gather_to_target_torch(draft_logits: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """:func:`gather_to_target` in plain torch: ``pad + index_select``."""
    padded = torch.nn.functional.pad(draft_logits, (0, 1), value=float("-inf"))
    return padded.index_select(1, table.long())


@functools.cache
def _triton_gather():
    try:
        from ._triton import gather_logits_triton
    except ImportError:  # no Triton: the torch path serves CUDA too
        return None
    return gather_logits_triton


def gather_to_target(draft_logits: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Same result as :func:`scatter_to_target`, as one gather per target id (the
    form the speculator runs): a Triton kernel on CUDA, ``pad + index_select``
    elsewhere."""
    triton_gather = _triton_gather() if draft_logits.is_cuda else None
    if triton_gather is not None:
        return triton_gather(draft_logits.contiguous(), table)
    return gather_to_target_torch(draft_logits, table)


def project_inputs(target_ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Draft ids for target ids (same dtype); ids outside the table (padding) -> clamped."""
    idx = target_ids.long().clamp(0, table.numel() - 1)
    return table.index_select(0, idx).to(target_ids.dtype)


def _fill_by_longest_suffix(table: list[int], t_keys: list[Key], d_keys: list[Key],
                            default_id: int) -> tuple[int, int]:
    """Fill the ``-1`` entries of ``table`` (target id -> draft input id) with the
    draft token that is the longest suffix of the target token's bytes (a special
    token's name counts as its text; a hole has none), else ``default_id``.
    Returns ``(filled by suffix, filled by default)``."""
    draft_bytes = {k: i for i, k in enumerate(d_keys) if isinstance(k, bytes)}
    max_len = max((len(k) for k in draft_bytes), default=0)
    n_suffix = n_default = 0
    for tid, key in enumerate(t_keys):
        if table[tid] >= 0:
            continue
        if isinstance(key, bytes):
            raw = key
        else:  # a special token's name, or b"" for a hole
            raw = key.encode("utf-8") if isinstance(key, str) else b""
        found = None
        for start in range(max(0, len(raw) - max_len), len(raw)):
            found = draft_bytes.get(raw[start:])
            if found is not None:
                break
        if found is None:
            table[tid] = default_id
            n_default += 1
        else:
            table[tid] = found
            n_suffix += 1
    return n_suffix, n_default


def build_tli_maps(
    target_dir: str | Path,
    draft_dir: str | Path,
    *,
    target_vocab_size: int | None = None,
    draft_vocab_size: int | None = None,
    min_shared_tokens: int = 1,
) -> TLIMaps:
    """Build the maps for a target and a draft tokenizer directory.

    ``*_vocab_size`` are the models' logits widths (ids past the tokenizer are
    holes); a tokenizer with ids beyond its model's width is refused.  Fewer than
    ``min_shared_tokens`` shared tokens is refused: the draft could propose
    almost nothing.
    """
    t_keys = _vocab_keys(target_dir, target_vocab_size, "target")
    d_keys = _vocab_keys(draft_dir, draft_vocab_size, "draft")
    try:
        inter = build_intersection(d_keys, t_keys)
    except ValueError as exc:
        raise TLIConfigError(str(exc)) from exc
    if inter.size < max(1, min_shared_tokens):
        raise TLIConfigError(
            f"draft tokenizer {draft_dir} and target tokenizer {target_dir} share "
            f"{inter.size} tokens (< {max(1, min_shared_tokens)} required): token-level "
            "intersection drafting would propose (almost) nothing")

    default_id = 0
    table = inter.target_to_draft.tolist()  # exact counterparts; -1 to fill below
    n_exact = sum(d >= 0 for d in table)
    n_suffix, n_default = _fill_by_longest_suffix(table, t_keys, d_keys, default_id)
    shared_ids = inter.shared_target_ids.tolist()
    return TLIMaps(
        intersection=inter,
        target_to_draft_input=torch.tensor(table, dtype=torch.int64),
        num_exact_inputs=n_exact,
        num_suffix_inputs=n_suffix,
        num_default_inputs=n_default,
        target_regular=sum(isinstance(k, bytes) for k in t_keys),
        shared_regular=sum(isinstance(t_keys[i], bytes) for i in shared_ids),
        shared_special=sorted(t_keys[i] for i in shared_ids if isinstance(t_keys[i], str)),
        default_input_id=default_id,
    )
