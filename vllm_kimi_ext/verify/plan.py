"""Deciding, per verification step, between sharded verification and the full gather.

The sharded verifier is exact for: greedy, temperature, top-k, min-p, top-p,
one-hot and probabilistic drafts. Anything whose semantics need the whole logits row
on one rank (or state the shards do not have) falls back to vLLM's full
all-gather of ``[rows, V]`` logits. A fallback is never silent: it is returned
as a :class:`Fallback` with a reason and counted by a :class:`FallbackCounter`
(which also logs each one at debug level).

Fallback reasons (first match in this order):

``vocab_too_large``   ids are exchanged as float32 (exact below ``2**24``)
``top_p``             only when the caller has not opted in to the sharded
                      top-p cut (``top_p_sharded=False``, the default: a runner
                      that does not pass ``top_p`` into its ``VerifyBatch`` must
                      not take the sharded path)
``logprobs``          sampled/top logprobs need full rows
``penalties``         presence/frequency/repetition penalties (shard-local in
                      principle, but applied by vLLM on full logits; not ported)
``bad_words``         ``bad_words`` token sequences
``logit_bias``        per-request logit bias
``allowed_token_ids`` allow-list masks
``min_tokens``        EOS suppression before ``min_tokens``
``structured_output`` grammar/JSON masks (bitmask over the full vocabulary)
``thinking_budget``   forced end-of-thinking logits
``watermarking``      vLLM's watermark resampling
``logits_processors`` custom logits processors are registered
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .sharded import MAX_EXACT_FLOAT_ID

logger = logging.getLogger(__name__)

FALLBACK_REASONS = (
    "vocab_too_large",
    "top_p",
    "logprobs",
    "penalties",
    "bad_words",
    "logit_bias",
    "allowed_token_ids",
    "min_tokens",
    "structured_output",
    "thinking_budget",
    "watermarking",
    "logits_processors",
)


@dataclass(frozen=True)
class Fallback:
    """Use the full-vocabulary gather for this step, because of ``reason``."""

    reason: str
    detail: str = ""
    all_reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class ShardedPlan:
    """Verify this step over vocabulary shards."""

    tp_size: int
    num_reqs: int
    greedy_reqs: int
    top_k_reqs: int
    min_p_reqs: int
    probabilistic_draft: bool
    top_p_reqs: int = 0

    @property
    def num_collectives(self) -> int:
        """1 (stats) + 1 if top-k/min-p/top-p + 1 if probabilistic drafts (with sampling).

        A top-p row whose cut the first threshold round cannot certify adds one per
        wider round (data-dependent, not counted here)."""
        sampling = self.num_reqs - self.greedy_reqs
        n = 1
        if self.top_k_reqs or self.min_p_reqs or self.top_p_reqs:
            n += 1
        if self.probabilistic_draft and sampling > 0:
            n += 1
        return n


def _get(p: Any, name: str, default: Any = None) -> Any:
    if isinstance(p, dict):
        return p.get(name, default)
    return getattr(p, name, default)


def request_fallback_reasons(p: Any, top_p_sharded: bool = False) -> list[str]:
    """All reasons one request's sampling parameters need the full gather."""
    reasons: list[str] = []
    temp = float(_get(p, "temperature", 1.0) or 0.0)
    sampling = temp > 0.0
    top_p = _get(p, "top_p", 1.0)
    if sampling and not top_p_sharded and top_p is not None and float(top_p) < 1.0:
        reasons.append("top_p")
    if _get(p, "logprobs") is not None or _get(p, "logprob_token_ids"):
        reasons.append("logprobs")
    if (float(_get(p, "presence_penalty", 0.0) or 0.0) != 0.0
            or float(_get(p, "frequency_penalty", 0.0) or 0.0) != 0.0
            or float(_get(p, "repetition_penalty", 1.0) or 1.0) != 1.0):
        reasons.append("penalties")
    if _get(p, "bad_words") or _get(p, "_bad_words_token_ids"):
        reasons.append("bad_words")
    if _get(p, "logit_bias"):
        reasons.append("logit_bias")
    if _get(p, "allowed_token_ids"):
        reasons.append("allowed_token_ids")
    if int(_get(p, "min_tokens", 0) or 0) > 0:
        reasons.append("min_tokens")
    if _get(p, "structured_outputs") is not None or _get(p, "guided_decoding") is not None:
        reasons.append("structured_output")
    if _get(p, "thinking_token_budget") is not None:
        reasons.append("thinking_budget")
    if _get(p, "watermarking"):
        reasons.append("watermarking")
    return reasons


def plan_verification(
    sampling_params: Sequence[Any],
    *,
    tp_size: int,
    vocab_size: int,
    probabilistic_draft: bool = False,
    custom_logits_processors: bool = False,
    counter: FallbackCounter | None = None,
    top_p_sharded: bool = False,
) -> ShardedPlan | Fallback:
    """Sharded plan for a batch of requests, or the reason to gather full logits.

    ``sampling_params``: one object per request with vLLM ``SamplingParams``
    attribute names (dicts work too). The whole step falls back if any request
    needs it (the verification of a step is one batched operation).
    ``top_p_sharded``: the caller passes each request's ``top_p`` to the verifier
    (:attr:`.batch.VerifyBatch.top_p`), so top-p is verified sharded.
    """
    reasons: list[str] = []
    if vocab_size >= MAX_EXACT_FLOAT_ID:
        reasons.append("vocab_too_large")
    for p in sampling_params:
        reasons.extend(request_fallback_reasons(p, top_p_sharded))
    if custom_logits_processors:
        reasons.append("logits_processors")
    if reasons:
        uniq = tuple(r for r in FALLBACK_REASONS if r in reasons)
        fb = Fallback(reason=uniq[0], detail=f"{len(reasons)} request-level cause(s)",
                      all_reasons=uniq)
        if counter is not None:
            counter.record(fb)
        return fb
    greedy = top_k = min_p = top_p = 0
    for p in sampling_params:
        t = float(_get(p, "temperature", 1.0) or 0.0)
        if t == 0.0:
            greedy += 1
            continue
        k = int(_get(p, "top_k", 0) or 0)
        if 0 < k < vocab_size:
            top_k += 1
        if float(_get(p, "min_p", 0.0) or 0.0) > 0.0:
            min_p += 1
        if float(_get(p, "top_p", 1.0) or 1.0) < 1.0:
            top_p += 1
    return ShardedPlan(
        tp_size=tp_size,
        num_reqs=len(sampling_params),
        greedy_reqs=greedy,
        top_k_reqs=top_k,
        min_p_reqs=min_p,
        probabilistic_draft=probabilistic_draft,
        top_p_reqs=top_p,
    )


class FallbackCounter:
    """Counts fallbacks per reason; logs every one at debug level."""

    def __init__(self, log: logging.Logger | None = None):
        self.counts: Counter[str] = Counter()
        self._log = log or logger

    def record(self, fb: Fallback) -> None:
        self.counts[fb.reason] += 1
        self._log.debug("sharded verification fell back to the full logits gather: "
                        "reason=%s all=%s %s", fb.reason, ",".join(fb.all_reasons), fb.detail)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, int]:
        return dict(self.counts)

    def reset(self) -> None:
        self.counts.clear()
