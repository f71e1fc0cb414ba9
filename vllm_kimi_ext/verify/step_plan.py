"""The host-side plan of one verification step: sharded (a :class:`StepPlan`) or the full
logits gather (a :class:`Fallback` with its reason), from facts the host already has.

:func:`plan_from_params` is the one entry point: the runner's gate calls it with the
requests' ``SamplingParams`` (host objects) and the step runs the plan it returns, so
nothing here reads a device value. :class:`StepInputs` holds the step's per-row
device tensors (fixed shapes, built with device ops only).

The sharded step is exact for greedy, temperature, top-k, min-p, top-p, one-hot and
probabilistic drafts. Anything whose semantics need the whole logits row on one rank
(or state the shards do not have) falls back to vLLM's full all-gather of ``[rows, V]``
logits. A fallback is never silent: it is returned as a :class:`Fallback` with a
reason and counted by a :class:`FallbackCounter` (which also logs each one at debug
level).

Fallback reasons (first match in this order):

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

import torch

from .batch import RowLayout
from .ranks import MAX_EXACT_FLOAT_ID

logger = logging.getLogger(__name__)

#: Round-1 columns before the candidates: gval, gidx, lse (hi, lo), s_x.
STAT_COLUMNS = 5
#: Candidates per rank and row when a cut is present (at least the largest top-k).
DEFAULT_CANDIDATES = 128
FLOAT_BYTES = 4

#: Escalation kinds (a :class:`StepPlan` field): ``"rows"`` gathers the picked rows' whole
#: shard rows; ``"hist"`` exchanges histograms of 16-bit float rows
#: (:mod:`.step_hist`) and keeps ``row_fallback_slots`` whole-row slots for the rows it
#: cannot cut exactly; ``"folded"`` sends ``folded_candidates`` further candidates per
#: picked row and ``row_fallback_slots`` whole rows in one all-gather (:mod:`.escalate_folded`).
ESCALATIONS = ("rows", "hist", "folded")
#: Whole-row slots of a ``"hist"`` escalation unless the caller says otherwise.
DEFAULT_ROW_FALLBACK_SLOTS = 1
#: The escalation a plan gets unless the caller names one. ``"rows"``: measured on one H200
#: (``bench/reports/verify_hist_h200.json`` against ``verify_graph_vs_vllm_h200.json``, k = 3,
#: Kimi's top-p modes, CUDA graphs) the step with ``"hist"`` took 674-1,224 us per rank at
#: 4-256 rows against 43-274 us with ``"rows"``, so its smaller exchange (3,088 B instead
#: of 40,960 B per escalated row per rank) does not pay for its compute; ``"hist"`` stays
#: selectable (``escalation="hist"``) and is not the default anywhere.
DEFAULT_ESCALATION = "rows"
#: The ``"hist"`` escalation's all-gathers per picked row and rank, as
#: ``(name, elements, element bytes)``: the coarse bins' float64 masses (the high byte of
#: the 16-bit ordered key), the boundary bin's int32 per-key counts (its low byte). Then
#: one all-gather of bytes: the shard statistics under the found cut and the whole-row
#: slots. :mod:`.step_hist` allocates exactly these.
HIST_BINS = 256
KEYS_PER_BIN = 256
HIST_ROUNDS = (("hist-coarse", HIST_BINS, 8), ("hist-boundary", KEYS_PER_BIN, 4))
#: Round 3's statistics per picked row (float32); the round is sent as bytes together with
#: the whole-row slots' shard rows.
HIST_STATS = 4
# --- the folded escalation (``escalation == "folded"``, :mod:`.escalate_folded`) ---------
#: Further candidates per rank and picked row: the tokens ranked ``W .. W + FOLDED - 1`` of
#: the shard in (value desc, id asc) order, each one int32 (its 16-bit ordered value key and
#: local column), so the round-1 certificate runs again over ``W + FOLDED`` per rank.
#: 384 (``W + FOLDED = 512``): on real rows (bench/reports/topp_fallback_smollm2.md, Kimi's
#: padded layout, T = 1.0) 1.04 % of rows need more than 256 per rank, 0.05 % more than 1024.
FOLDED_CANDIDATES = 384
#: Whole-row slots sent in the same all-gather (the first picked slots: first rows first).
DEFAULT_FOLDED_ROW_SLOTS = 1
FOLDED_KEY_BYTES = 4


def folded_round_bytes(slots: int, folded: int, row_slots: int, shard_width: int,
                       logits_bytes: int) -> int:
    """Bytes one rank sends in the folded escalation's one all-gather: ``slots x folded``
    int32 keys, then ``row_slots`` whole shard rows, padded to a multiple of 4."""
    n = slots * folded * FOLDED_KEY_BYTES + row_slots * shard_width * logits_bytes
    return -(-n // 4) * 4

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


# ---------------------------------------------------------------------------
# the step's device inputs and its host-side plan
# ---------------------------------------------------------------------------
@dataclass
class StepInputs:
    """Per-row device tensors of one step (fixed shapes; built without host reads)."""

    #: int64 [num_reqs + 1]
    cu_num_rows: torch.Tensor
    #: int64 [rows]: draft verified at each row, -1 on bonus rows / placeholders.
    draft: torch.Tensor
    req_of_row: torch.Tensor
    row_in_req: torch.Tensor
    temperature: torch.Tensor  # float32 [rows], 0 = greedy
    seeds: torch.Tensor  # int64 [rows]
    positions: torch.Tensor  # int64 [rows]
    top_k: torch.Tensor  # int64 [rows], 0 = off (greedy rows off)
    min_p: torch.Tensor  # float32 [rows], 0 = off
    top_p: torch.Tensor  # float32 [rows], 1 = off

    @property
    def num_rows(self) -> int:
        return int(self.draft.shape[0])

    @property
    def num_reqs(self) -> int:
        return int(self.cu_num_rows.shape[0]) - 1

    @staticmethod
    def from_layout(L: RowLayout, vocab_size: int) -> StepInputs:
        """From a :class:`~.batch.RowLayout` (tests, benchmarks)."""
        r = L.req_of_row
        return StepInputs(
            cu_num_rows=L.cu_num_rows, draft=L.draft, req_of_row=r, row_in_req=L.row_in_req,
            temperature=L.temperature, seeds=L.seeds, positions=L.positions,
            top_k=L.effective_top_k(vocab_size)[r], min_p=L.effective_min_p()[r],
            top_p=L.effective_top_p()[r])

    @staticmethod
    def from_requests(cu_num_rows: torch.Tensor, draft: torch.Tensor, temperature: torch.Tensor,
                      seeds: torch.Tensor, positions: torch.Tensor, top_k: torch.Tensor,
                      min_p: torch.Tensor, top_p: torch.Tensor, vocab_size: int) -> StepInputs:
        """From per-request parameters and per-row drafts/positions, with device ops only
        (``searchsorted`` instead of ``repeat_interleave``): safe inside graph capture.
        ``draft`` must already be -1 on bonus rows."""
        cu = cu_num_rows.long()
        R = draft.shape[0]
        rows = torch.arange(R, device=draft.device)
        req = torch.searchsorted(cu[1:], rows, right=True).clamp(max=cu.shape[0] - 2)
        t = temperature.float()[req]
        greedy = t == 0
        k = top_k.long()[req]
        k = torch.where(greedy | (k >= vocab_size) | (k < 0), torch.zeros_like(k), k)
        mp = torch.where(greedy, torch.zeros_like(t), min_p.float()[req])
        tp = torch.where(greedy, torch.ones_like(t), top_p.float()[req])
        return StepInputs(cu_num_rows=cu, draft=draft.long(), req_of_row=req,
                          row_in_req=rows - cu[req], temperature=t, seeds=seeds.long()[req],
                          positions=positions.long(), top_k=k, min_p=mp, top_p=tp)


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
    #: Whole-row slots inside a ``"hist"`` escalation (rows it cannot cut exactly) or a
    #: ``"folded"`` one (its first picked slots).
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
            return 2
        if self.stats_only:
            return 4
        return STAT_COLUMNS + 2 * self.candidates

    @property
    def rounds(self) -> tuple[Round, ...]:
        out = [Round("stats" if self.stats_only else "stats+candidates", self.num_rows,
                     self.round1_width)]
        E = self.escalation_slots
        if E and self.escalation == "hist":
            out.extend(Round(name, E, width, eb) for name, width, eb in HIST_ROUNDS)
            out.append(Round("hist-stats+rows", 1, E * HIST_STATS * FLOAT_BYTES
                             + self.row_fallback_slots * self.shard_width * self.logits_bytes,
                             1))
        elif E and self.escalation == "folded":
            out.append(Round("escalation-folded", 1, folded_round_bytes(
                E, self.folded_candidates, self.row_fallback_slots, self.shard_width,
                self.logits_bytes), 1))
        elif E:
            out.append(Round("escalation", E, self.shard_width, self.logits_bytes))
        if self.residual_round:
            out.append(Round("residual", self.num_reqs, 2))
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
                   if r.name.startswith("escalation") or r.name.startswith("hist-"))

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
              escalation: str | None = None,
              row_fallback_slots: int | None = None,
              folded_candidates: int | None = None) -> StepPlan:
    """The step plan from host-known facts of the batch.

    ``any_cut``: some sampling row has top-k, min-p or top-p; ``max_top_k``: the
    largest top-k (the candidates must hold it); ``may_escalate``: some row has
    top-p or min-p without top-k (its kept set may exceed the candidates);
    ``any_uncut_sampling``: some sampling row has no cut (probabilistic drafts then
    need the residual round). ``escalation_slots`` defaults to the number of
    requests (every request's first row has a slot). ``escalation`` (one of
    :data:`ESCALATIONS`) defaults to :data:`DEFAULT_ESCALATION` (``"rows"``, measured faster);
    ``"hist"`` needs 16-bit logits and one-hot drafts;
    ``row_fallback_slots`` (``"hist"`` only) defaults to
    :data:`DEFAULT_ROW_FALLBACK_SLOTS`.
    """
    w = 0
    if any_cut and not all_greedy:
        w = max(candidates or DEFAULT_CANDIDATES, max_top_k)
        w = min(w, shard_width)
    e = 0
    if may_escalate and not all_greedy:
        e = max(num_reqs, escalation_slots or 0)
        e = min(e, num_rows)
    esc, fb = choose_escalation(e, logits_bytes, probabilistic, escalation, row_fallback_slots)
    fc = 0
    if esc == "folded":
        fc = FOLDED_CANDIDATES if folded_candidates is None else int(folded_candidates)
        if fc < 1:
            raise ValueError(f"folded_candidates must be >= 1, got {fc}")
    return StepPlan(tp_size=tp_size, num_rows=num_rows, num_reqs=num_reqs,
                    max_rows_per_req=max_rows_per_req, candidates=w, escalation_slots=e,
                    all_greedy=all_greedy,
                    residual_round=probabilistic and not all_greedy and any_uncut_sampling,
                    probabilistic=probabilistic, shard_width=shard_width,
                    logits_bytes=logits_bytes, escalation=esc, row_fallback_slots=fb,
                    folded_candidates=fc)


def choose_escalation(slots: int, logits_bytes: int, probabilistic: bool,
                      escalation: str | None, row_fallback_slots: int | None) -> tuple[str, int]:
    """``(escalation, row_fallback_slots)`` of a plan with ``slots`` escalation slots."""
    if escalation is not None and escalation not in ESCALATIONS:
        raise ValueError(f"escalation must be one of {ESCALATIONS}, got {escalation!r}")
    exact = logits_bytes == 2 and not probabilistic
    if escalation in ("hist", "folded") and not exact and slots:
        raise ValueError(f"the {'histogram' if escalation == 'hist' else 'folded'} escalation "
                         "needs 16-bit logits and one-hot drafts")
    if escalation is None:
        escalation = DEFAULT_ESCALATION
    default_fb = DEFAULT_FOLDED_ROW_SLOTS if escalation == "folded" else DEFAULT_ROW_FALLBACK_SLOTS
    fb = default_fb if row_fallback_slots is None else int(row_fallback_slots)
    fb = max(0, min(fb, slots))
    return escalation, (fb if escalation in ("hist", "folded") else 0)




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
    greedy = [float(_get(p, "temperature", 1.0) or 0.0) == 0.0 for p in sampling_params]
    any_cut = may_escalate = uncut = False
    max_k = 0
    for p, g in zip(sampling_params, greedy):
        if g:
            continue
        k = int(_get(p, "top_k", 0) or 0)
        k = k if 0 < k < vocab_size else 0
        mp = float(_get(p, "min_p", 0.0) or 0.0)
        tp = _get(p, "top_p", 1.0)
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


@dataclass
class StepOutput:
    """vLLM's ``(sampled, num_sampled)`` plus diagnostics (all device tensors)."""

    sampled: torch.Tensor  # int64 [num_reqs, max_rows_per_req], -1 padded
    num_sampled: torch.Tensor  # int32 [num_reqs]
    #: float32 [rows]: accept margin (see :class:`~.batch.VerifyOutput`); NaN on greedy rows.
    accept_margin: torch.Tensor
    #: float64 [rows]: nucleus margin (NaN without top-p).
    nucleus_margin: torch.Tensor
    #: [rows], bool (int8 on the Triton path): the cut was not certified by round 1.
    uncertified: torch.Tensor
    #: [rows], bool or int8: uncertified and no escalation slot.
    deferred: torch.Tensor
    #: [num_reqs], bool or int8: this request stopped at a deferred row.
    stopped: torch.Tensor

    def tokens(self) -> list[list[int]]:
        return [row[:n] for row, n in zip(self.sampled.tolist(), self.num_sampled.tolist())]



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
