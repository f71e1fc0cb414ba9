"""Lossless cross-tokenizer drafting by Token-Level Intersection (TLI).

Timor et al., "Accelerating LLM Inference with Lossless Speculative Decoding
Algorithms for Heterogeneous Vocabularies" (ICML 2025).  When the draft's and the
target's vocabularies differ, standard speculative decoding still works if the
draft's proposal distribution is expressed over the *target's* vocabulary:

1. Intersection: a draft id and a target id correspond when their tokens are the
   same -- the same byte string for regular (rank-file) tokens, the same name for
   special tokens.  :func:`build_intersection` builds both index maps.
2. Restrict the draft distribution ``q_d`` to the intersection and renormalize:
   ``q_T(x) = q_d(x) / sum_{y in T} q_d(y)`` for ``x in T``, 0 elsewhere.  The
   draft samples its proposal from ``q_T``, so every proposal is a token the
   target knows.
3. Map ``q_T`` to target ids: ``q(t) = q_T(d(t))`` for shared ``t``, 0 elsewhere.
   ``q`` is a probability distribution over the target vocabulary.
4. Standard rejection sampling against the target's ``p``: accept ``x`` with
   probability ``min(1, p(x)/q(x))``; on rejection sample from
   ``max(0, p - q) / sum max(0, p - q)``.

Why it is lossless: for any distribution ``q`` over the target vocabulary and
``x ~ q``, ``P(out = y) = min(q(y), p(y)) + (1 - sum_v min(q(v), p(v))) *
max(0, p(y) - q(y)) / sum_v max(0, p(v) - q(v))``; since
``sum_v max(0, p - q) = 1 - sum_v min(p, q)`` the second term is
``max(0, p(y) - q(y))`` and the total is ``min(q, p) + max(0, p - q) = p(y)``.
Nothing requires ``q`` to cover the vocabulary -- only that the value used in the
accept test is the probability the proposal was actually drawn with (hence the
renormalization in step 2).  The expected acceptance of one proposal is
``sum_v min(p(v), q(v))`` (:func:`expected_acceptance`).

Everything here is plain torch over full probability rows (a reference, not a
kernel): the rejection step is self-contained so that the cross-tokenizer path
can be tested without the sharded verifier.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "VocabIntersection",
    "build_intersection",
    "expected_acceptance",
    "intersection_from_tokenizer_dirs",
    "rejection_step",
    "sample_categorical",
    "tli_propose",
    "verify_chain",
]


@dataclass(frozen=True)
class VocabIntersection:
    """Index maps between a draft and a target vocabulary (``-1`` = not shared)."""

    draft_to_target: torch.Tensor  # int64 [draft_vocab]
    target_to_draft: torch.Tensor  # int64 [target_vocab]

    @classmethod
    def from_pairs(cls, draft_ids: torch.Tensor, target_ids: torch.Tensor,
                   draft_vocab_size: int, target_vocab_size: int) -> VocabIntersection:
        """Maps from aligned vectors of corresponding draft and target ids."""
        d2t = torch.full((draft_vocab_size,), -1, dtype=torch.int64)
        t2d = torch.full((target_vocab_size,), -1, dtype=torch.int64)
        d2t[draft_ids] = target_ids.to(torch.int64)
        t2d[target_ids] = draft_ids.to(torch.int64)
        return cls(draft_to_target=d2t, target_to_draft=t2d)

    @property
    def draft_vocab_size(self) -> int:
        return int(self.draft_to_target.numel())

    @property
    def target_vocab_size(self) -> int:
        return int(self.target_to_draft.numel())

    @property
    def size(self) -> int:
        return int((self.draft_to_target >= 0).sum())

    @property
    def draft_mask(self) -> torch.Tensor:
        return self.draft_to_target >= 0

    @property
    def shared_draft_ids(self) -> torch.Tensor:
        return torch.nonzero(self.draft_mask).squeeze(1)

    @property
    def shared_target_ids(self) -> torch.Tensor:
        return self.draft_to_target[self.shared_draft_ids]

    def restrict(self, draft_probs: torch.Tensor, *, renormalize: bool = True) -> torch.Tensor:
        """Zero the draft-only tokens of ``draft_probs [..., Vd]`` and renormalize.

        Rows with no mass on the intersection cannot propose anything and are
        returned as all zeros.  ``renormalize=False`` exists only to demonstrate
        (in tests) that skipping the renormalization breaks losslessness.
        """
        self._check_last_dim(draft_probs, self.draft_vocab_size, "draft_probs")
        mask = self.draft_mask.to(draft_probs.device)
        q = torch.where(mask, draft_probs, torch.zeros_like(draft_probs))
        if renormalize:
            z = q.sum(dim=-1, keepdim=True)
            q = torch.where(z > 0, q / z.clamp_min(torch.finfo(q.dtype).tiny), torch.zeros_like(q))
        return q

    def to_target(self, draft_space: torch.Tensor) -> torch.Tensor:
        """Scatter ``[..., Vd]`` values of shared draft ids onto target ids ``[..., Vt]``."""
        self._check_last_dim(draft_space, self.draft_vocab_size, "draft_space")
        shared = self.shared_draft_ids.to(draft_space.device)
        out = draft_space.new_zeros(*draft_space.shape[:-1], self.target_vocab_size)
        out[..., self.draft_to_target.to(draft_space.device)[shared]] = draft_space[..., shared]
        return out

    def map_probs(self, draft_probs: torch.Tensor, *, renormalize: bool = True) -> torch.Tensor:
        """TLI proposal distribution over the target vocabulary: restrict, renormalize, map."""
        return self.to_target(self.restrict(draft_probs, renormalize=renormalize))

    def map_draft_tokens(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target ids of draft ids (``-1`` for draft-only tokens)."""
        return self.draft_to_target.to(draft_ids.device)[draft_ids]

    def map_target_tokens(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Draft ids of target ids (``-1`` for target-only tokens).  When every id
        of a context maps, the draft can consume it directly; otherwise the context
        has to be re-tokenized by the draft's tokenizer (decode + encode)."""
        return self.target_to_draft.to(target_ids.device)[target_ids]

    @staticmethod
    def _check_last_dim(t: torch.Tensor, n: int, name: str) -> None:
        if t.shape[-1] != n:
            raise ValueError(f"{name} has last dimension {t.shape[-1]}, expected {n}")


def _index(keys: Sequence[object | None], side: str) -> dict[object, int]:
    index: dict[object, int] = {}
    for i, k in enumerate(keys):
        if k is None:
            continue
        if k in index:
            raise ValueError(f"{side} vocabulary has token {k!r} at ids {index[k]} and {i}")
        index[k] = i
    return index


def build_intersection(
    draft_keys: Sequence[bytes | str | None],
    target_keys: Sequence[bytes | str | None],
) -> VocabIntersection:
    """Intersection by token identity.

    ``*_keys[i]`` describes id ``i``: ``bytes`` for a regular token (its byte
    string), ``str`` for a special token (its name), ``None`` for an id that must
    never be matched (a hole, or a reserved slot).  Bytes and names never match
    each other: the special token ``<think>`` is not the text "<think>".
    """
    t_index = _index(target_keys, "target")
    _index(draft_keys, "draft")  # duplicate check
    pairs = [(i, t_index[k]) for i, k in enumerate(draft_keys) if k is not None and k in t_index]
    d_ids = torch.tensor([p[0] for p in pairs], dtype=torch.int64)
    t_ids = torch.tensor([p[1] for p in pairs], dtype=torch.int64)
    return VocabIntersection.from_pairs(d_ids, t_ids, len(draft_keys), len(target_keys))


def intersection_from_tokenizer_dirs(
    draft_dir: str | Path,
    target_dir: str | Path,
    *,
    include_reserved: bool = False,
    draft_vocab_size: int | None = None,
    target_vocab_size: int | None = None,
) -> VocabIntersection:
    """Intersection of two Kimi-format tokenizer directories.

    Reserved fillers (``<|reserved_token_N|>``) are left out unless
    ``include_reserved``.  ``*_vocab_size`` pads (with unmatched ids) or checks
    the id space to the model's logits width (for Kimi-K2.5 its ``vocab_size``,
    :func:`vllm_kimi_ext.facts.target_dims`).
    """
    from vllm_kimi_ext.tokenizers.kimi_files import load_tokenizer_dir
    from vllm_kimi_ext.tokenizers.loading import drop_reserved

    def keys(directory, size):
        ks = load_tokenizer_dir(directory).id_keys()
        if not include_reserved:
            ks = drop_reserved(ks)
        if size is not None:
            if size < len(ks):
                raise ValueError(f"{directory}: vocab size {size} < tokenizer's {len(ks)} ids")
            ks = ks + [None] * (size - len(ks))
        return ks

    return build_intersection(
        keys(draft_dir, draft_vocab_size), keys(target_dir, target_vocab_size)
    )


# ------------------------------------------------------------------------------- sampling


def sample_categorical(
    probs: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One draw per row of ``probs [N, V]`` (non-negative, rows need not be
    normalized, each row must have positive mass), by inverse CDF."""
    cdf = probs.cumsum(dim=-1)
    u = torch.rand(
        probs.shape[:-1] + (1,), dtype=cdf.dtype, generator=generator, device=probs.device
    )
    idx = torch.searchsorted(cdf, u * cdf[..., -1:], right=True).squeeze(-1)
    # first index whose cdf exceeds u*total never has zero probability; guard the
    # u*total == total rounding edge by capping at the last positive entry
    positive = probs > 0
    last = probs.shape[-1] - 1 - torch.argmax(positive.flip(-1).to(torch.int8), dim=-1)
    return torch.minimum(idx, last)


def tli_propose(
    draft_probs: torch.Tensor,
    intersection: VocabIntersection,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample one TLI proposal per row of ``draft_probs [N, Vd]``.

    Returns ``(draft_ids [N], target_ids [N], q [N, Vt])`` where ``q`` is the
    distribution the proposal was drawn from, over target ids -- the ``q`` the
    verifier must use.  Rows without mass on the intersection raise.
    """
    q_d = intersection.restrict(draft_probs)
    if bool((q_d.sum(dim=-1) <= 0).any()):
        raise ValueError("a draft row has no probability mass on the vocabulary intersection")
    draft_ids = sample_categorical(q_d, generator)
    return draft_ids, intersection.map_draft_tokens(draft_ids), intersection.to_target(q_d)


def expected_acceptance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Probability that one proposal ``x ~ q`` is accepted against ``p``: ``sum min(p, q)``."""
    return torch.minimum(p, q).sum(dim=-1)


def rejection_step(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard speculative-sampling step, one proposal per row.

    ``target_probs``, ``draft_probs``: ``[N, V]`` over the same (target) ids;
    ``draft_tokens [N]`` drawn from ``draft_probs``.  Returns ``(accepted [N]
    bool, token [N])``: the draft token where accepted, else a draw from the
    normalized residual ``max(0, p - q)``.
    """
    p = target_probs.to(torch.float64)
    q = draft_probs.to(torch.float64)
    x = draft_tokens.long()[:, None]
    p_x = p.gather(1, x).squeeze(1)
    q_x = q.gather(1, x).squeeze(1)
    u = torch.rand(p.shape[0], dtype=torch.float64, generator=generator, device=p.device)
    accepted = u * q_x < p_x  # u < p/q, with q_x > 0 for a real proposal
    residual = (p - q).clamp_min(0.0)
    # p == q exactly leaves no residual, but then every proposal is accepted;
    # fall back to p so the (unused) draw is well defined.
    empty = residual.sum(dim=1) <= 0
    residual = torch.where(empty[:, None], p, residual)
    recovered = sample_categorical(residual, generator)
    return accepted, torch.where(accepted, x.squeeze(1), recovered)


def verify_chain(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify ``k`` chained proposals per request.

    ``target_probs [N, k+1, V]`` (row ``k`` = bonus), ``draft_probs [N, k, V]``,
    ``draft_tokens [N, k]``.  Returns ``(tokens [N, k+1]`` padded with ``-1``,
    ``num_accepted [N])``: accepted drafts, then the recovered (first rejection)
    or bonus token.
    """
    n, k = draft_tokens.shape
    tokens = torch.full((n, k + 1), -1, dtype=torch.int64, device=draft_tokens.device)
    alive = torch.ones(n, dtype=torch.bool, device=draft_tokens.device)
    num_accepted = torch.zeros(n, dtype=torch.int64, device=draft_tokens.device)
    for j in range(k):
        acc, tok = rejection_step(
            target_probs[:, j], draft_probs[:, j], draft_tokens[:, j], generator
        )
        tokens[:, j] = torch.where(alive, tok, tokens[:, j])
        num_accepted += (alive & acc).long()
        alive = alive & acc
    bonus = sample_categorical(target_probs[:, k].to(torch.float64), generator)
    tokens[:, k] = torch.where(alive, bonus, tokens[:, k])
    return tokens, num_accepted
