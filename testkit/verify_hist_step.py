"""The histogram escalation (a :class:`HistPlan`): the exact top-p / min-p cut of the picked
uncertified rows from three small all-gathers instead of whole shard rows.

Not shipped: measured on one H200 (``bench/reports/verify_hist_h200.json`` against
``verify_graph_vs_vllm_h200.json``, k = 3, Kimi's top-p modes, CUDA graphs) the step with
it took 674-1,224 us per rank at 4-256 rows against 43-274 us with the whole-row escalation
the package ships, and no setting or runner path selects it. It stays here, exact and
tested, as the measured alternative: :class:`HistPlan` (its rounds),
:class:`HistVerifyStep` (the step with it), :class:`HistStepGraphs` (its graphs).

For 16-bit float logits (bf16; fp16 works the same way) every value has an ordered 16-bit
key (:func:`ordered_key16`): ``key(a) < key(b)`` iff ``a < b``, ``-0.0`` and ``+0.0`` share
a key, and ``s = z / T`` (one float32 division,
:func:`vllm_kimi_ext.verify.rowmath.scale_logits`) keeps distinct values distinct, so the
tokens of one key are exactly one tie group of the whole-row sort. Per picked row
(``E = plan.escalation_slots``, shapes fixed, no host read, so the rounds run inside
CUDA-graph capture and under the CPU stand-in):

1. **Coarse** (``hist-coarse``, ``[E, 256]`` float64 per rank): the mass
   ``sum exp(s - m)`` of the row's tokens that the min-p pre-cut keeps (``m``: the row's
   maximum from round 1), binned by the key's high byte. The bins cover every key (no
   band to get wrong); every rank sums the gathered bins in rank order and walks them from
   the top to the bin where the running mass reaches ``top_p x Z``.
2. **Boundary** (``hist-boundary``, ``[E, 256]`` int32 per rank): the per-key token counts
   of that bin (the key's low byte). Tokens of one key weigh the same, so the walk inside
   the bin gives the cut key and how many of its tied tokens are kept; the per-rank counts
   say how many of them each rank keeps (ties are kept in id order, ranks own increasing
   id ranges: rank ``r`` keeps ``need - (ties on ranks < r)``, clamped).
3. **Statistics** (``hist-stats``, ``[E, 4]`` float32 per rank, as bytes): the shard
   statistics under the known cut (Gumbel-max, log-sum-exp, ``s_x``), merged as in round 1.

Fail closed: a row the rounds cannot cut exactly goes to one of ``plan.row_fallback_slots``
whole-row slots (``F``), in slot order: round 3 carries those slots' whole shard rows in the
same all-gather (``E x 16 + F x S x 2`` bytes per rank), and every rank cuts them as the
``"rows"`` escalation does (a sort of the gathered row). A row left without a slot is
deferred like a row without an escalation slot, so ``F >= 1`` keeps a request whose first
row sits on an edge from stalling. Such rows are those with
top-k (the candidates of round 1 always certify them, so only a forced escalation sees
one), a non-finite maximum, and rows whose running mass at the cut lies within
:data:`EDGE_TOL` ``x Z`` of ``top_p x Z`` on either side: there the float64 sums' rounding
(here and in the whole-row sort) could move the cut by one token.
"""

from __future__ import annotations

import dataclasses

import torch

from vllm_kimi_ext.verify.escalate import rows as escalate_rows
from vllm_kimi_ext.verify.escalate.folded import key_values, ordered_key16
from vllm_kimi_ext.verify.escalate.rows import exact_cut, pick_slots
from vllm_kimi_ext.verify.graph_step import GraphVerifyStep, StepGraphs
from vllm_kimi_ext.verify.protocol import FLOAT_BYTES, Round, StepPlan
from vllm_kimi_ext.verify.ranks import AllGather
from vllm_kimi_ext.verify.rowmath import merge_argmax, min_p_threshold, scale_logits
from vllm_kimi_ext.verify.shard_stats import shard_local_stats
from vllm_kimi_ext.verify.step_io import Merged, StepInputs

#: The ``"hist"`` escalation's all-gathers per picked row and rank, as
#: ``(name, elements, element bytes)``: the coarse bins' float64 masses (the high byte of
#: the 16-bit ordered key), the boundary bin's int32 per-key counts (its low byte). Then
#: one all-gather of bytes: the shard statistics under the found cut and the whole-row
#: slots.
HIST_BINS = 256
KEYS_PER_BIN = 256
HIST_ROUNDS = (("hist-coarse", HIST_BINS, 8), ("hist-boundary", KEYS_PER_BIN, 4))
#: Round 3's statistics per picked row (float32); the round is sent as bytes together with
#: the whole-row slots' shard rows.
HIST_STATS = 4
HIST_LAST_ROUND = "hist-stats+rows"
#: Whole-row slots of a ``"hist"`` escalation unless the caller says otherwise.
DEFAULT_ROW_FALLBACK_SLOTS = 1

#: Relative distance of ``top_p x Z`` from the running mass on either side of the cut
#: below which a row takes a whole-row slot (float64 sums of <= 2**24 terms stay far
#: within it; the reference's own rounding flips are certified at the same 1e-9).
EDGE_TOL = 1e-9
HALF_DTYPES = (torch.bfloat16, torch.float16)


def _walk(mass_desc: torch.Tensor, start: torch.Tensor, target: torch.Tensor):
    """First position (in the given descending order) where ``start`` plus the running
    mass reaches ``target``, clamped to the last non-empty position, and the running mass
    before it. ``mass_desc [E, n]`` float64."""
    n = mass_desc.shape[1]
    run = start[:, None] + mass_desc.cumsum(1)
    pos = torch.arange(n, device=mass_desc.device)
    last = torch.where(mass_desc > 0, pos, torch.zeros_like(pos)).max(dim=1).values
    j = torch.minimum((run < target[:, None]).sum(dim=1), last)
    prev = run.gather(1, (j - 1).clamp(min=0)[:, None]).squeeze(1)
    return j, torch.where(j > 0, prev, start)


def _live(z: torch.Tensor, s: torch.Tensor, n_valid: int, cutv: torch.Tensor) -> torch.Tensor:
    cols = torch.arange(z.shape[1], device=z.device)
    return (cols < n_valid)[None, :] & (s >= cutv[:, None]) & (s > float("-inf"))


def coarse_torch(z: torch.Tensor, t: torch.Tensor, m: torch.Tensor, cutv: torch.Tensor,
                 n_valid: int, bins: int = HIST_BINS) -> torch.Tensor:
    """Round 1's shard pass: float64 ``[E, bins]``, per slot ``sum exp(s - m)`` of the
    tokens the min-p cut keeps, by the ordered key's high byte (``_hist_kernels`` twin)."""
    s = scale_logits(z, t)
    w = torch.exp(s.double() - m.double()[:, None]).masked_fill(~_live(z, s, n_valid, cutv), 0.0)
    out = torch.zeros((z.shape[0], bins), dtype=torch.float64, device=z.device)
    return out.scatter_add_(1, ordered_key16(z) // KEYS_PER_BIN, w)


def boundary_torch(z: torch.Tensor, t: torch.Tensor, cutv: torch.Tensor, bin_id: torch.Tensor,
                   n_valid: int, keys: int = KEYS_PER_BIN) -> torch.Tensor:
    """Round 2's shard pass: int32 ``[E, keys]``, per slot the kept tokens of each key in
    its boundary bin ``bin_id``, by the key's low byte (``_hist_kernels`` twin)."""
    s = scale_logits(z, t)
    key = ordered_key16(z)
    inside = _live(z, s, n_valid, cutv) & (key // KEYS_PER_BIN == bin_id[:, None])
    out = torch.zeros((z.shape[0], keys), dtype=torch.int32, device=z.device)
    return out.scatter_add_(1, key % KEYS_PER_BIN, inside.to(torch.int32))


def hist_cut(gather: AllGather, z: torch.Tensor, n_valid: int, t: torch.Tensor,
             m: torch.Tensor, min_p: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
             rank: int, triton: bool = False):
    """Rounds 1-2 on this rank's picked rows ``z [E, S]`` (16-bit; the first ``n_valid``
    columns are not padding; ``triton``: the shard passes of ``_hist_kernels``). Returns
    ``(thr, tie_col, margin, exact)``: the cut's value ``s`` (float32), this shard's last
    kept tied column (local; ``-1``: none, ``S``: all), the nucleus margin (float64, NaN
    without top-p) and whether the row was cut exactly."""
    E, S = z.shape
    dev = z.device
    coarse, boundary = coarse_torch, boundary_torch
    if triton:
        from testkit import verify_hist_kernels as hk

        coarse, boundary = hk.coarse_hist, hk.boundary_counts
    s = scale_logits(z, t)
    cutv = min_p_threshold(m, min_p)
    m64 = m.double()
    g1 = gather(coarse(z, t, m, cutv, n_valid, HIST_BINS))  # [TP, E, HIST_BINS]
    bins = g1[0]
    for r in range(1, g1.shape[0]):  # rank order: every rank adds the same numbers alike
        bins = bins + g1[r]
    desc = bins.flip(1)
    Z = desc.sum(dim=1)
    tp = top_p.double()
    target = tp * Z
    b, above = _walk(desc, torch.zeros_like(Z), target)
    bin_id = (HIST_BINS - 1) - b
    g2 = gather(boundary(z, t, cutv, bin_id, n_valid, KEYS_PER_BIN))  # [TP, E, KEYS_PER_BIN]
    per_key = g2.to(torch.int64).sum(dim=0)
    keys = bin_id[:, None] * KEYS_PER_BIN + torch.arange(KEYS_PER_BIN, device=dev)
    sk = scale_logits(key_values(keys, z.dtype), t)  # [E, KEYS_PER_BIN] float32
    wk = torch.exp(sk.double() - m64[:, None])
    cnt_desc, wk_desc, sk_desc = per_key.flip(1), wk.flip(1), sk.flip(1)
    j, before = _walk(cnt_desc.double() * wk_desc, above, target)
    wj = wk_desc.gather(1, j[:, None]).squeeze(1)
    cj = cnt_desc.gather(1, j[:, None]).squeeze(1)
    need = torch.ceil((target - before) / wj).clamp(min=1)
    need = torch.minimum(need, cj.double()).long()
    before_last = before + (need - 1).double() * wj
    through_last = before + need.double() * wj
    margin = torch.minimum(target - before_last, through_last - target) / Z
    nucleus = top_p < 1
    exact = (top_k <= 0) & torch.isfinite(m) & (
        ~nucleus | ((margin >= EDGE_TOL) & (cj > 0) & (Z > 0)))
    # min-p without top-p: the cut is min-p's own, every tie at it kept
    big = torch.full_like(need, S + 1)
    thr = torch.where(nucleus, sk_desc.gather(1, j[:, None]).squeeze(1), cutv)
    need = torch.where(nucleus, need, big)
    # this rank's share of the cut key's ties: those left after the ranks before it
    col = (KEYS_PER_BIN - 1) - j
    tied = g2.to(torch.int64).gather(2, col[None, :, None].expand(g2.shape[0], E, 1))[..., 0]
    earlier = tied[:rank].sum(dim=0)
    keep = (need - earlier).clamp(min=0)
    eq = (s == thr[:, None]) & (torch.arange(S, device=dev) < n_valid)[None, :]
    tie_col = (eq.to(torch.int32).cumsum(1) < keep[:, None]).sum(dim=1)
    tie_col = torch.where(keep > 0, tie_col, torch.full_like(tie_col, -1))
    margin = torch.where(nucleus, margin, torch.full_like(margin, float("nan")))
    return thr, tie_col, margin, exact


def escalate_hist(logits_shard: torch.Tensor, inp: StepInputs, plan: StepPlan, merged: Merged,
                  all_gather: AllGather, rank: int, col_offset: int, vocab_size: int,
                  backend: str = "torch") -> torch.Tensor:
    """The ``"hist"`` escalation (see the module docstring) for one-hot drafts; updates
    ``merged`` in place (``merged.row_max`` required) and returns the deferred rows (in the
    dtype of ``merged.uncertified``: bool on the torch path, int8 on the Triton path)."""
    if logits_shard.dtype not in HALF_DTYPES:
        raise ValueError(f"the histogram escalation needs 16-bit logits, got {logits_shard.dtype}")
    E, F = plan.escalation_slots, plan.row_fallback_slots
    unc = merged.uncertified.bool()  # the Triton merge keeps int8 flags
    idx, real = pick_slots(unc, inp.row_in_req, E)
    z = logits_shard.index_select(0, idx)
    S = z.shape[1]
    n_valid = max(0, min(S, vocab_size - col_offset))
    t = inp.temperature[idx]
    thr, tie_col, margin, exact = hist_cut(all_gather, z, n_valid, t, merged.row_max[idx],
                                           inp.min_p[idx], inp.top_p[idx], inp.top_k[idx], rank,
                                           triton=backend == "triton")
    st = shard_local_stats(z, t, thr, inp.draft[idx], inp.seeds[idx], inp.positions[idx],
                           col_offset, vocab_size, exclude_draft=True, backend=backend, width=4,
                           tie_col=tie_col)
    # round 3 carries the statistics and, in the same all-gather, the whole shard rows of
    # the first F slots the rounds could not cut (bytes: float32 [E, 4] then [F, S] logits)
    fidx, freal = _fallback_slots(idx, real & ~exact, F)
    parts = [st.float().contiguous().view(torch.uint8).reshape(-1)]
    if F:
        parts.append(logits_shard.index_select(0, fidx).contiguous().view(torch.uint8)
                     .reshape(-1))
    g3 = all_gather(torch.cat(parts)[None])[:, 0]  # [TP, E * 16 + F * S * bytes] uint8
    TP = g3.shape[0]
    stats = g3[:, :E * 16].contiguous().view(torch.float32).view(TP, E, 4)
    gval, gidx = merge_argmax(stats[..., 0], stats[..., 1])
    ok = real & exact

    def put(rows, cond, dst: torch.Tensor, val: torch.Tensor) -> None:
        dst[rows] = torch.where(cond, val.to(dst.dtype), dst[rows])

    put(idx, ok, merged.gval, gval)
    put(idx, ok, merged.gidx, gidx)
    put(idx, ok, merged.lse, torch.logsumexp(stats[..., 2], dim=0))
    put(idx, ok, merged.sx, stats[..., 3].max(dim=0).values)
    put(idx, ok, merged.nucleus_margin, margin)
    assigned = torch.zeros_like(unc)
    assigned[idx] = ok
    if F:
        rows = g3[:, E * 16:].contiguous().view(logits_shard.dtype).view(TP, F, S)
        full = rows.permute(1, 0, 2).reshape(F, TP * S)[:, :vocab_size]
        _whole_row_stats(full, fidx, freal, inp, merged, vocab_size, backend)
        assigned[fidx] |= freal
    return (unc & ~assigned).to(merged.uncertified.dtype)


def _fallback_slots(idx: torch.Tensor, want: torch.Tensor, F: int):
    """The first ``F`` slots in ``want`` (in slot order): their rows and which are real."""
    E = idx.shape[0]
    slot = torch.arange(E, device=idx.device)
    pick = torch.topk(-torch.where(want, slot, slot + E), F).indices
    return idx[pick], want[pick]


def _whole_row_stats(full: torch.Tensor, fidx: torch.Tensor, freal: torch.Tensor,
                     inp: StepInputs, merged: Merged, vocab_size: int, backend: str) -> None:
    """The ``"rows"`` escalation's cut and statistics (one-hot drafts) on gathered whole
    rows ``full [F, V]`` of rows ``fidx``; updates ``merged`` where ``freal``."""
    t = inp.temperature[fidx]
    thr, tie, margin = exact_cut(scale_logits(full, t), inp.top_k[fidx], inp.min_p[fidx],
                                 inp.top_p[fidx])
    st = shard_local_stats(full, t, thr, inp.draft[fidx], inp.seeds[fidx], inp.positions[fidx],
                           0, vocab_size, exclude_draft=True, backend=backend, width=4,
                           tie_col=tie)
    for dst, val in ((merged.gval, st[:, 0]), (merged.gidx, st[:, 1].round().long()),
                     (merged.lse, st[:, 2]), (merged.sx, st[:, 3]),
                     (merged.nucleus_margin, margin)):
        dst[fidx] = torch.where(freal, val.to(dst.dtype), dst[fidx])


def hist_round_bytes() -> tuple[tuple[str, int], ...]:
    """``(round, bytes one rank sends per escalated row)`` of the escalation, without the
    whole-row slots its last round also carries."""
    return (*((name, width * eb) for name, width, eb in HIST_ROUNDS),
            (HIST_LAST_ROUND, HIST_STATS * FLOAT_BYTES))


@dataclasses.dataclass(frozen=True)
class HistPlan(StepPlan):
    """A :class:`StepPlan` whose escalation is the histogram rounds, with
    ``row_fallback_slots`` whole-row slots for the rows they cannot cut exactly."""

    escalation: str = "hist"
    row_fallback_slots: int = DEFAULT_ROW_FALLBACK_SLOTS

    @property
    def rounds(self) -> tuple[Round, ...]:
        out: list[Round] = []
        for r in super().rounds:
            if r.name != "escalation":
                out.append(r)
                continue
            E = self.escalation_slots
            out.extend(Round(name, E, width, eb) for name, width, eb in HIST_ROUNDS)
            out.append(Round(HIST_LAST_ROUND, 1, E * HIST_STATS * FLOAT_BYTES
                             + self.row_fallback_slots * self.shard_width * self.logits_bytes,
                             1))
        return tuple(out)

    @property
    def escalation_bytes_per_rank(self) -> int:
        return sum(r.bytes_per_rank for r in self.rounds if r.name.startswith("hist-"))


def hist_plan(plan: StepPlan, row_fallback_slots: int | None = None) -> StepPlan:
    """``plan`` with the histogram escalation (one-hot drafts, 16-bit logits); a plan
    without escalation slots is returned as it is."""
    if not plan.escalation_slots:
        return plan
    if plan.logits_bytes != 2 or plan.probabilistic:
        raise ValueError("the histogram escalation needs 16-bit logits and one-hot drafts")
    fb = DEFAULT_ROW_FALLBACK_SLOTS if row_fallback_slots is None else int(row_fallback_slots)
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(StepPlan)
              if f.name not in ("escalation", "row_fallback_slots", "folded_candidates")}
    return HistPlan(**fields, row_fallback_slots=max(0, min(fb, plan.escalation_slots)))


class HistEscalation:
    """The ``"hist"`` escalation kind, in the shape of the package's escalation variants
    (``vllm_kimi_ext.verify.escalate``): one-hot drafts take the histogram rounds, anything
    else the whole-row escalation."""

    @staticmethod
    def resolve(rank, logits_shard, inp, plan, merged, q_full, *, g, scratch, triton):
        if isinstance(plan, HistPlan) and q_full is None:
            return escalate_hist(logits_shard, inp, plan, merged, rank.all_gather, rank.rank,
                                 rank.col_offset, rank.vocab_size,
                                 "triton" if triton else "torch")
        return escalate_rows.resolve(rank, logits_shard, inp, plan, merged, q_full, g=g,
                                     scratch=scratch, triton=triton)


class HistVerifyStep(GraphVerifyStep):
    """The graph step with the histogram escalation for a :class:`HistPlan`."""

    escalations = {**GraphVerifyStep.escalations, "hist": HistEscalation}


class HistStepGraphs(StepGraphs):
    """:class:`StepGraphs` whose one-hot escalating plans are :class:`HistPlan` s."""

    def padded_plan(self, q, fl):
        plan = super().padded_plan(q, fl)
        return plan if plan.probabilistic else hist_plan(plan)
