"""The verify step's contract, torch-free: what one step sends and in which rounds.

A step is sharded (a :class:`StepPlan`: its shapes and its :class:`Round` s, one
all-gather each) or the full logits gather (a :class:`Fallback` with its reason), planned
from facts the host already has. The step (``verify/``), the runner's gate
(``integration/``) and the cost model's verify price (``costmodel/verify_cost.py``) all
read the round sizes from here; nothing else defines them. This module imports no torch,
so the cost model stays importable without it.

:func:`plan_from_params` is the one entry point: the runner's gate calls it with the
requests' ``SamplingParams`` (host objects) and the step runs the plan it returns, so
nothing here reads a device value (the step's device tensors are
:class:`~.step_io.StepInputs` and :class:`~.step_io.StepOutput`).

The sharded step is exact for greedy, temperature, top-k, min-p, top-p, one-hot and
probabilistic drafts. Anything whose semantics need the whole logits row on one rank
(or state the shards do not have) falls back to vLLM's full all-gather of ``[rows, V]``
logits. A fallback is never silent: it is returned as a :class:`Fallback` with a
reason and counted by a :class:`FallbackCounter` (which also logs each one at debug
level).

Fallback reasons (first match in this order):

``vocab_too_large``   ids are exchanged as float32 (exact below ``2**24``)
``top_p``             only when the caller has not opted in to the sharded
                      top-p cut (``top_p_sharded=False``: a caller that does not
                      pass ``top_p`` into the step's inputs must not take the
                      sharded path)
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

logger = logging.getLogger(__name__)

#: Token ids are exchanged as float32: exact below this.
MAX_EXACT_FLOAT_ID = 2**24
#: Round-1 columns of an all-greedy step: (max, argmax).
GREEDY_COLUMNS = 2
#: Round-1 columns of a step without a cut: gval, gidx, lse, s_x.
STATS_ONLY_COLUMNS = 4
#: Round-1 columns before the candidates: gval, gidx, lse (hi, lo), s_x.
STAT_COLUMNS = 5
#: Round-1 float32 columns carrying the shard log-sum-exp (float64 split as hi + lo).
LSE_COLUMNS = 2
#: Candidates per rank and row when a cut is present (at least the largest top-k).
DEFAULT_CANDIDATES = 128
FLOAT_BYTES = 4

#: Escalation kinds the package ships (:attr:`StepPlan.escalation`): ``"rows"`` gathers the
#: picked uncertified rows' whole shard rows. A histogram escalation (three small
#: all-gathers instead of a shard row) was built and measured on one H200 at 674-1,224 us
#: per rank at 4-256 rows against 43-274 us for ``"rows"`` (``bench/reports/
#: verify_hist_h200.json`` against ``verify_graph_vs_vllm_h200.json``, k = 3, Kimi's top-p
#: modes, CUDA graphs); it lives in the test kit (``testkit/verify_hist_step.py``), not here.
#: ``"folded"`` (:mod:`.escalate.folded`, never the default): the first
#: ``row_fallback_slots`` picked rows' whole shard rows and, for every further picked row,
#: ``folded_candidates`` more round-1 candidates as int32 keys, in one all-gather.
ESCALATIONS = ("rows", "folded")
#: The folded escalation: further candidates per rank and picked row (the tokens ranked
#: ``W .. W + FOLDED_CANDIDATES - 1`` of the shard in (value desc, id asc) order, each one
#: int32: its 16-bit ordered value key and its local column), so round 1's certificate runs
#: again over ``W + FOLDED_CANDIDATES`` per rank; 384 (512 in all): on real rows
#: (``bench/reports/topp_fallback_smollm2.md``, Kimi's padded layout, T = 1.0) 1.04 % of
#: rows need more than 256 per rank, 0.05 % more than 1024.
FOLDED_CANDIDATES = 384
#: The folded escalation's whole-row slots (its first picked slots: first rows first).
DEFAULT_FOLDED_ROW_SLOTS = 1
FOLDED_KEY_BYTES = 4
#: The residual round's float32 columns per request: the Gumbel-max (value, id).
RESIDUAL_COLUMNS = 2

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


def param(p: Any, name: str, default: Any = None) -> Any:
    """One sampling parameter of a request: a vLLM ``SamplingParams`` attribute or a dict key."""
    if isinstance(p, dict):
        return p.get(name, default)
    return getattr(p, name, default)


def request_fallback_reasons(p: Any, top_p_sharded: bool = False) -> list[str]:
    """All reasons one request's sampling parameters need the full gather."""
    reasons: list[str] = []
    temp = float(param(p, "temperature", 1.0) or 0.0)
    sampling = temp > 0.0
    top_p = param(p, "top_p", 1.0)
    if sampling and not top_p_sharded and top_p is not None and float(top_p) < 1.0:
        reasons.append("top_p")
    if param(p, "logprobs") is not None or param(p, "logprob_token_ids"):
        reasons.append("logprobs")
    if (float(param(p, "presence_penalty", 0.0) or 0.0) != 0.0
            or float(param(p, "frequency_penalty", 0.0) or 0.0) != 0.0
            or float(param(p, "repetition_penalty", 1.0) or 1.0) != 1.0):
        reasons.append("penalties")
    if param(p, "bad_words") or param(p, "_bad_words_token_ids"):
        reasons.append("bad_words")
    if param(p, "logit_bias"):
        reasons.append("logit_bias")
    if param(p, "allowed_token_ids"):
        reasons.append("allowed_token_ids")
    if int(param(p, "min_tokens", 0) or 0) > 0:
        reasons.append("min_tokens")
    if param(p, "structured_outputs") is not None or param(p, "guided_decoding") is not None:
        reasons.append("structured_output")
    if param(p, "thinking_token_budget") is not None:
        reasons.append("thinking_budget")
    if param(p, "watermarking"):
        reasons.append("watermarking")
    return reasons


# ---------------------------------------------------------------------------
# the sampling modes a step is measured and priced in
# ---------------------------------------------------------------------------
#: The measured top-p modes and their temperatures (Kimi's two API settings, top_p 0.95).
TOP_P_MODES = {"top_p_T1": 1.0, "top_p_T0.6": 0.6}
#: The modes of a step that cannot escalate: every row greedy, or a cut round 1 certifies.
GREEDY_MODE, CUT_MODE = "greedy", "topk_minp"
#: Every mode a step can be measured and priced in.
STEP_MODES = (*TOP_P_MODES, GREEDY_MODE, CUT_MODE)


def step_mode(plan: StepPlan, params: Sequence[Any]) -> str:
    """The sampling mode whose measurements price this step.

    A step with escalation slots (a top-p or min-p row without top-k) is priced as top-p
    at the measured temperature nearest the highest temperature among its sampling rows
    (ties go to the higher, slower one); a step without is ``greedy`` when every row is
    greedy, else ``topk_minp``.
    """
    if plan.escalation_slots == 0:
        return GREEDY_MODE if plan.all_greedy else CUT_MODE
    # the plan's own reading of a request's temperature (None or 0: greedy)
    temps = [float(param(p, "temperature", 1.0) or 0.0) for p in params]
    t = max((x for x in temps if x > 0), default=1.0)
    return min(TOP_P_MODES, key=lambda m: (abs(TOP_P_MODES[m] - t), -TOP_P_MODES[m]))


def round1_columns(candidates: int) -> int:
    """Round-1 float32 columns per row of a step with a cut: the statistics and
    ``candidates`` (value, id) pairs."""
    return STAT_COLUMNS + 2 * candidates


def folded_round_bytes(slots: int, folded: int, row_slots: int, shard_width: int,
                       logits_bytes: int) -> int:
    """Bytes one rank sends in the folded escalation's one all-gather: ``folded`` int32 keys
    for each slot after the first ``min(row_slots, slots)``, then those slots' whole shard
    rows, padded to a multiple of 4 (a slot with a whole row needs no keys)."""
    f = min(row_slots, slots)
    n = (slots - f) * folded * FOLDED_KEY_BYTES + f * shard_width * logits_bytes
    return -(-n // 4) * 4


def round1_bytes_per_row(candidates: int = DEFAULT_CANDIDATES) -> int:
    """Bytes one rank sends per row in round 1 of a step with a cut."""
    return round1_columns(candidates) * FLOAT_BYTES



@dataclass(frozen=True)
class Round:
    """One all-gather of a step: every rank sends ``rows x width`` elements."""

    name: str
    rows: int
    width: int
    element_bytes: int = FLOAT_BYTES

    @property
    def bytes_per_rank(self) -> int:
        return self.rows * self.width * self.element_bytes


@dataclass(frozen=True)
class StepPlan:
    """Everything host-side a step needs: shapes, widths and the collectives it issues.

    Built once per distinct batch shape from facts the host already has (the
    requests' sampling parameters), never from device data; the graph of a step
    is keyed by it.
    """

    tp_size: int
    num_rows: int
    num_reqs: int
    max_rows_per_req: int
    #: Candidates per rank and row in round 1 (0: no row has a cut).
    candidates: int
    #: Escalation slots (0: no row can be uncertified).
    escalation_slots: int
    #: Every row is greedy: round 1 sends only (max, argmax).
    all_greedy: bool
    #: Probabilistic drafts and sampling rows without a cut: the residual round runs.
    residual_round: bool
    probabilistic: bool
    shard_width: int
    logits_bytes: int = 2
    #: How uncertified rows are cut (one of :data:`ESCALATIONS`).
    escalation: str = "rows"
    #: Whole-row slots of a ``"folded"`` escalation (its first picked slots).
    row_fallback_slots: int = 0
    #: Further candidates per rank and picked row of a ``"folded"`` escalation.
    folded_candidates: int = 0

    @property
    def stats_only(self) -> bool:
        """No cut and one-hot drafts: round 1 is the statistics alone and the decision
        merges them directly (``(gval, gidx)``, + ``(lse, s_x)`` when sampling)."""
        return self.candidates == 0 and not self.probabilistic

    @property
    def round1_width(self) -> int:
        if self.all_greedy:
            return GREEDY_COLUMNS
        if self.stats_only:
            return STATS_ONLY_COLUMNS
        return round1_columns(self.candidates)

    @property
    def rounds(self) -> tuple[Round, ...]:
        out = [Round("stats" if self.stats_only else "stats+candidates", self.num_rows,
                     self.round1_width)]
        E = self.escalation_slots
        if E and self.escalation == "folded":
            out.append(Round("escalation-folded", 1, folded_round_bytes(
                E, self.folded_candidates, self.row_fallback_slots, self.shard_width,
                self.logits_bytes), 1))
        elif E:
            out.append(Round("escalation", E, self.shard_width, self.logits_bytes))
        if self.residual_round:
            out.append(Round("residual", self.num_reqs, RESIDUAL_COLUMNS))
        return tuple(out)

    @property
    def num_collectives(self) -> int:
        return len(self.rounds)

    @property
    def bytes_sent_per_rank(self) -> int:
        return sum(r.bytes_per_rank for r in self.rounds)

    @property
    def bytes_received_per_rank(self) -> int:
        """All-gather output size on each rank (``TP x`` what each rank sends)."""
        return self.bytes_sent_per_rank * self.tp_size

    @property
    def escalation_bytes_per_rank(self) -> int:
        """Bytes each rank sends in the escalation's rounds."""
        return sum(r.bytes_per_rank for r in self.rounds
                   if r.name.startswith("escalation"))

    @property
    def bytes_per_escalated_row_per_rank(self) -> float:
        """The escalation's bytes per slot and rank (0 without an escalation)."""
        return self.escalation_bytes_per_rank / max(self.escalation_slots, 1)

    @property
    def bytes_per_row_per_rank(self) -> float:
        return self.bytes_sent_per_rank / max(self.num_rows, 1)

    def describe(self) -> str:
        parts = [f"{r.name}[{r.rows}x{r.width}]" for r in self.rounds]
        return (f"{len(self.rounds)} all-gather(s): " + ", ".join(parts)
                + f"; {self.bytes_sent_per_rank} B sent/rank")


def plan_step(*, tp_size: int, shard_width: int, num_rows: int, num_reqs: int,
              max_rows_per_req: int, all_greedy: bool, any_cut: bool, max_top_k: int = 0,
              may_escalate: bool = False, probabilistic: bool = False,
              any_uncut_sampling: bool = False, candidates: int | None = None,
              escalation_slots: int | None = None, logits_bytes: int = 2,
              escalation: str | None = None, row_fallback_slots: int | None = None,
              folded_candidates: int | None = None) -> StepPlan:
    """The step plan from host-known facts of the batch.

    ``any_cut``: some sampling row has top-k, min-p or top-p; ``max_top_k``: the
    largest top-k (the candidates must hold it); ``may_escalate``: some row has
    top-p or min-p without top-k (its kept set may exceed the candidates);
    ``any_uncut_sampling``: some sampling row has no cut (probabilistic drafts then
    need the residual round). ``escalation_slots`` defaults to the number of
    requests (every request's first row has a slot). ``escalation="folded"`` (see
    :data:`ESCALATIONS`; 16-bit logits and one-hot drafts only) with ``row_fallback_slots``
    and ``folded_candidates`` (defaults :data:`DEFAULT_FOLDED_ROW_SLOTS`,
    :data:`FOLDED_CANDIDATES`); with no more slots than whole-row slots it is the
    ``"rows"`` plan (every slot has its whole row: nothing to fold).
    """
    w = 0
    if any_cut and not all_greedy:
        w = max(candidates or DEFAULT_CANDIDATES, max_top_k)
        w = min(w, shard_width)
    e = 0
    if may_escalate and not all_greedy:
        e = max(num_reqs, escalation_slots or 0)
        e = min(e, num_rows)
    fold = folded_fields(escalation, e, logits_bytes, probabilistic, row_fallback_slots,
                         folded_candidates)
    return StepPlan(tp_size=tp_size, num_rows=num_rows, num_reqs=num_reqs,
                    max_rows_per_req=max_rows_per_req, candidates=w, escalation_slots=e,
                    all_greedy=all_greedy,
                    residual_round=probabilistic and not all_greedy and any_uncut_sampling,
                    probabilistic=probabilistic, shard_width=shard_width,
                    logits_bytes=logits_bytes, **fold)


def folded_fields(escalation: str | None, slots: int, logits_bytes: int, probabilistic: bool,
                  row_fallback_slots: int | None, folded_candidates: int | None) -> dict:
    """The plan's escalation fields; ``"folded"`` with ``slots <= row_fallback_slots`` is the
    ``"rows"`` plan. Refuses an unknown kind, and ``"folded"`` with float32 logits,
    probabilistic drafts or fewer than one further candidate."""
    if escalation is not None and escalation not in ESCALATIONS:
        raise ValueError(f"escalation must be one of {ESCALATIONS}, got {escalation!r}")
    if escalation != "folded":
        return {}
    if slots and (logits_bytes != 2 or probabilistic):
        raise ValueError("the folded escalation needs 16-bit logits and one-hot drafts")
    fc = FOLDED_CANDIDATES if folded_candidates is None else int(folded_candidates)
    if fc < 1:
        raise ValueError(f"folded_candidates must be >= 1, got {fc}")
    fb = DEFAULT_FOLDED_ROW_SLOTS if row_fallback_slots is None else int(row_fallback_slots)
    if fb < 0:
        raise ValueError(f"row_fallback_slots must be >= 0, got {fb}")
    if slots <= fb:
        return {}
    return {"escalation": "folded", "row_fallback_slots": fb, "folded_candidates": fc}


def plan_from_params(sampling_params: Sequence[Any], *, tp_size: int, vocab_size: int,
                     num_rows: int, max_rows_per_req: int, shard_width: int | None = None,
                     probabilistic: bool = False, logits_bytes: int = 2,
                     custom_logits_processors: bool = False, top_p_sharded: bool = True,
                     counter: FallbackCounter | None = None,
                     candidates: int | None = None,
                     escalation_slots: int | None = None, escalation: str | None = None,
                     row_fallback_slots: int | None = None,
                     folded_candidates: int | None = None) -> StepPlan | Fallback:
    """The step's :class:`StepPlan`, or the :class:`Fallback` that sends it to the full
    logits gather, from the requests' sampling parameters (host objects: no device read).

    ``sampling_params``: one object per request with vLLM ``SamplingParams`` attribute
    names (dicts work too). The whole step falls back if any request needs it (the
    verification of a step is one batched operation). ``shard_width`` defaults to
    ``ceil(V / TP)``. ``top_p_sharded=False``: the caller cannot pass ``top_p`` into the
    step's inputs, so top-p requests fall back.
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
    greedy = [float(param(p, "temperature", 1.0) or 0.0) == 0.0 for p in sampling_params]
    any_cut = may_escalate = uncut = False
    max_k = 0
    for p, g in zip(sampling_params, greedy):
        if g:
            continue
        k = int(param(p, "top_k", 0) or 0)
        k = k if 0 < k < vocab_size else 0
        mp = float(param(p, "min_p", 0.0) or 0.0)
        tp = param(p, "top_p", 1.0)
        tp = 1.0 if tp is None else float(tp)
        cut = k > 0 or mp > 0 or tp < 1
        any_cut |= cut
        uncut |= not cut
        max_k = max(max_k, k)
        may_escalate |= cut and k == 0 and (tp < 1 or mp > 0)
    width = int(shard_width) if shard_width else -(-vocab_size // tp_size)
    return plan_step(tp_size=tp_size, shard_width=width, num_rows=num_rows,
                     num_reqs=len(sampling_params), max_rows_per_req=max_rows_per_req,
                     all_greedy=all(greedy), any_cut=any_cut, max_top_k=max_k,
                     may_escalate=may_escalate, probabilistic=probabilistic,
                     any_uncut_sampling=uncut, logits_bytes=logits_bytes,
                     candidates=candidates, escalation_slots=escalation_slots,
                     escalation=escalation, row_fallback_slots=row_fallback_slots,
                     folded_candidates=folded_candidates)


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
