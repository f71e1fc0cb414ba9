"""The ``"rows"`` escalation: whole shard rows for the picked uncertified rows.

A fixed number ``E`` of slots (:attr:`.protocol.StepPlan.escalation_slots`); each rank sends
its whole shard row (the logits' own dtype) for the uncertified rows picked on the device,
in order of (row within request, row): every request's first row first. On the gathered
full rows the cut is exact by construction (a sort), and the statistics of those rows
replace round 1's. An uncertified row left without a slot is *deferred* (see
:mod:`.graph_step`).

:func:`resolve` is the variant: the torch body (:func:`escalate_torch`, any draft kind)
or, for one-hot drafts, the Triton launchers (:func:`pick_slots_triton`,
:func:`escalate_one_hot_triton` and its split bf16 form :func:`escalate_one_hot_bf16`;
kernels in :mod:`.._kernels.escalate_rows` and :mod:`.._kernels.escalate_split`).
"""

from __future__ import annotations

import torch

from ..protocol import StepPlan
from ..ranks import AllGather, ShardedRank
from ..rowmath import (
    argmax_lowest_id,
    exclusive_cumsum,
    gumbel_at,
    logq_at,
    min_p_threshold,
    nucleus_margin,
    residual_log_weights,
    scale_logits,
)
from ..shard_stats import shard_local_stats
from ..step_io import Merged, StepInputs

NEG_INF = float("-inf")


def resolve(rank: ShardedRank, logits_shard: torch.Tensor, inp: StepInputs, plan: StepPlan,
            merged: Merged, q_full: torch.Tensor | None, *, g: torch.Tensor, scratch: dict,
            triton: bool) -> torch.Tensor:
    """Whole rows for the picked uncertified rows; updates ``merged`` in place and returns
    the deferred rows (uncertified, no slot). One-hot drafts on the Triton path: the split
    bf16 escalation with the step's persistent ``scratch``. ``g`` (round 1's gathered
    payload, the variants' common signature) is not needed here."""
    all_gather, vocab_size = rank.all_gather, rank.vocab_size
    if triton and q_full is None:
        idx, real8, deferred = pick_slots_triton(merged.uncertified, inp.row_in_req,
                                                 plan.escalation_slots)
        g = all_gather(logits_shard.index_select(0, idx))  # [TP, E, S]
        return escalate_one_hot_triton(g, idx, real8, inp, merged, vocab_size, deferred,
                                       scratch)
    return escalate_torch(logits_shard, inp, plan, merged, all_gather, vocab_size, q_full,
                          "triton" if triton else "torch")


def pick_slots(uncertified: torch.Tensor, row_in_req: torch.Tensor, slots: int):
    """``slots`` uncertified rows in (row within request, row) order, and which are real."""
    R = uncertified.shape[0]
    big = torch.iinfo(torch.int64).max // 4
    key = torch.where(uncertified, row_in_req * (R + 1) + torch.arange(R, device=row_in_req.device),
                      torch.full_like(row_in_req, big))
    top = torch.topk(-key, slots, dim=0)
    return top.indices, (-top.values) < big


def exact_cut(s: torch.Tensor, top_k: torch.Tensor, min_p: torch.Tensor, top_p: torch.Tensor):
    """The exact ``(threshold, tie_col)`` of whole rows ``s [n, V]`` (no host reads) and
    the nucleus margin: the kept prefix in (value desc, id asc) order."""
    n, V = s.shape
    sv, sid = torch.sort(s, dim=1, descending=True, stable=True)
    pos = torch.arange(V, device=s.device)
    finite = sv > NEG_INF
    cutv = min_p_threshold(sv[:, 0], min_p)
    n_kept = ((sv >= cutv[:, None]) & finite).sum(dim=1)
    n_kept = torch.where(top_k > 0, torch.minimum(n_kept, top_k), n_kept)
    tp = top_p.double()
    cand = pos[None, :] < n_kept[:, None]
    w = torch.where(cand, sv.double(), torch.full_like(sv, NEG_INF, dtype=torch.float64))
    prob = torch.exp(w - torch.logsumexp(w, dim=1, keepdim=True))
    before, cum = exclusive_cumsum(prob)
    n_nuc = ((before < tp[:, None]) & cand).sum(dim=1).clamp(min=1)
    nucleus = tp < 1
    margin = torch.where(nucleus, nucleus_margin(before, cum, tp, n_nuc),
                         torch.full_like(tp, float("nan")))
    n_kept = torch.where(nucleus, n_nuc, n_kept).clamp(min=1)
    last = (n_kept - 1)[:, None]
    return sv.gather(1, last).squeeze(1), sid.gather(1, last).squeeze(1), margin


def escalate_torch(logits_shard: torch.Tensor, inp: StepInputs, plan: StepPlan, merged: Merged,
                   all_gather: AllGather, vocab_size: int, q_full: torch.Tensor | None,
                   backend: str = "torch") -> torch.Tensor:
    """Round 2 on whole rows for the picked uncertified rows (any draft kind); updates
    ``merged`` in place and returns the deferred rows (uncertified, no slot). ``backend``
    runs the statistics of the gathered rows (the Triton path's probabilistic drafts)."""
    E = plan.escalation_slots
    idx, real = pick_slots(merged.uncertified, inp.row_in_req, E)
    rows = logits_shard.index_select(0, idx)
    g = all_gather(rows.contiguous())  # [TP, E, S]
    TP, _, S = g.shape
    full = g.permute(1, 0, 2).reshape(E, TP * S)[:, :vocab_size]
    t = inp.temperature[idx]
    # probabilistic drafts (and the torch backend): the whole-row cut by a sort
    thr, tie, margin = exact_cut(scale_logits(full, t), inp.top_k[idx], inp.min_p[idx],
                                 inp.top_p[idx])
    st = shard_local_stats(full, t, thr, inp.draft[idx], inp.seeds[idx], inp.positions[idx], 0,
                           vocab_size, exclude_draft=q_full is None, backend=backend, width=4,
                           tie_col=tie)
    sx = st[:, 3]
    res_tok = torch.full_like(idx, -1)
    if q_full is not None:
        s = scale_logits(full, t)
        q = q_full[idx, :vocab_size].float()
        x = inp.draft[idx]
        sx = sx - logq_at(q_full.index_select(0, idx), x[:, None], vocab_size)[:, 0]
        keep = (s > thr[:, None]) | ((s == thr[:, None]) & (
            torch.arange(vocab_size, device=s.device)[None, :] <= tie[:, None]))
        sm = torch.where(keep, s, NEG_INF)
        res = residual_log_weights(sm - st[:, 2:3], torch.log(q))
        ids = torch.arange(vocab_size, device=s.device).expand(E, -1)
        rbest, rtok = argmax_lowest_id(res + gumbel_at(inp.seeds[idx], inp.positions[idx], ids),
                                        ids)
        res_tok = torch.where(rbest > NEG_INF, rtok, res_tok)

    def put(dst: torch.Tensor, val: torch.Tensor) -> None:
        dst[idx] = torch.where(real, val.to(dst.dtype), dst[idx])

    put(merged.gval, st[:, 0])
    put(merged.gidx, st[:, 1].round().long())
    put(merged.lse, st[:, 2])
    put(merged.sx, sx)
    put(merged.res_tok, res_tok)
    put(merged.nucleus_margin, margin)
    assigned = torch.zeros_like(merged.uncertified)
    assigned[idx] = real
    return merged.uncertified & ~assigned


# ---------------------------------------------------------------------------
# Triton launchers (the kernels: _kernels/escalate_rows.py, escalate_split.py)
# ---------------------------------------------------------------------------


def pick_slots_triton(
    uncertified,  # [rows] int8 / bool
    row_in_req,  # [rows] int64
    slots: int,
):
    """Triton :func:`pick_slots`; returns ``(idx, real, deferred int8)``."""
    import triton

    from .._kernels import escalate_rows as kr

    R = uncertified.shape[0]
    dev = uncertified.device
    idx = torch.empty(slots, dtype=torch.int64, device=dev)
    real = torch.empty(slots, dtype=torch.int8, device=dev)
    deferred = torch.empty(R, dtype=torch.int8, device=dev)
    with kr._LAUNCH_LOCK:
        kr._pick_kernel[(1,)](uncertified.to(torch.int8), row_in_req.contiguous(), R, idx, real,
                              deferred, E=slots, RP=triton.next_power_of_2(max(R, slots)),
                              num_warps=4)
    return idx, real, deferred


def escalate_one_hot_triton(
    g,  # [TP, E, S] the logits' dtype: the gathered shard rows of the E slots
    idx,  # [E] int64: the row of each slot
    real,  # [E] int8: the slot holds an uncertified row
    inp,  # StepInputs
    merged,  # Merged (updated in place)
    vocab_size: int,
    deferred,  # [rows] int8, the uncertified rows on entry
    store=None,  # the step's persistent scratch (dict) for the split bf16 escalation
):
    """Triton escalation for one-hot drafts: updates ``merged`` and ``deferred`` (int8,
    initialised to the uncertified rows) in place; returns the deferred rows."""
    from .._kernels import escalate_rows as kr

    TP, E, S = g.shape
    if g.dtype == torch.bfloat16 and merged.row_max is not None and store is not None:
        return escalate_one_hot_bf16(g, idx, real, inp, merged, vocab_size, deferred, store)
    if g.stride(2) != 1:
        g = g.contiguous()
    k16 = g.dtype == torch.bfloat16
    wbuf = torch.empty((E, vocab_size), dtype=torch.float64, device=g.device)
    kbuf = torch.empty((E, vocab_size), dtype=torch.int32, device=g.device)
    with kr._LAUNCH_LOCK:
        kr._escalate_kernel[(E,)](g, g.stride(0), g.stride(1), S, vocab_size, idx,
                                  real, inp.temperature, inp.min_p, inp.top_p,
                                  inp.draft, inp.seeds, inp.positions, merged.gval, merged.gidx,
                                  merged.lse, merged.sx, merged.nucleus_margin, deferred,
                                  wbuf, kbuf, BLOCK=8192, K16=k16, num_warps=16)
    return deferred


def _scratch(store: dict, dev: torch.device, slots: int) -> dict:
    """The persistent zeroed histogram, highest keys and counters for ``slots`` slots,
    kept in ``store`` (one per verification step: simulated ranks sharing a device must
    not share it)."""
    from .._kernels.escalate_split import BINS

    key = str(dev)
    cur = store.get(key)
    if cur is None or cur["hist"].shape[0] < slots:
        if cur is not None:  # a captured graph may still use it: keep it alive
            store.setdefault("retired", []).append(cur)
        n = max(slots, 1)
        cur = store[key] = {
            "hist": torch.zeros((n, BINS), dtype=torch.int32, device=dev),
            "top": torch.zeros(n, dtype=torch.int32, device=dev),
            "done": torch.zeros((2, n), dtype=torch.int32, device=dev),
        }
    return cur


def escalate_one_hot_bf16(
    g,  # [TP, E, S] bf16: the gathered shard rows of the E slots
    idx,  # [E] int64: the row of each slot
    real,  # [E] int8: the slot holds an uncertified row
    inp,  # StepInputs
    merged,  # Merged (updated in place; row_max [rows] float32 required)
    vocab_size: int,
    deferred,  # [rows] int8
    store: dict,  # the step's persistent scratch
):
    """The escalation of one-hot drafts on gathered bf16 rows ``g [TP, E, S]``; updates
    ``merged`` and ``deferred`` (int8) in place. ``merged.row_max`` must hold each row's
    maximum of ``z / T`` (round 1's merge); ``store`` keeps the step's scratch."""
    import triton

    from .._kernels import escalate_split as ksp

    TP, E, S = g.shape
    if g.stride(2) != 1:
        g = g.contiguous()
    dev = g.device
    sc = _scratch(store, dev, E)
    nch = triton.cdiv(vocab_size, ksp.CHUNK)
    pch = triton.next_power_of_2(nch)
    partz = torch.empty((E, nch), dtype=torch.float64, device=dev)
    lo = torch.empty(E, dtype=torch.int32, device=dev)
    need = torch.empty(E, dtype=torch.int32, device=dev)
    slo = torch.empty(E, dtype=torch.float32, device=dev)
    part = torch.empty((E, nch, ksp.NPART), dtype=torch.float64, device=dev)
    temp, minp = inp.temperature.contiguous(), inp.min_p.contiguous()
    with ksp._LAUNCH_LOCK:
        ksp._esc_hist_kernel[(E, nch)](
            g, g.stride(0), g.stride(1), S, vocab_size, idx, real, temp, minp,
            inp.top_p.contiguous(), merged.row_max, sc["hist"], sc["top"], sc["done"][0],
            partz, lo, need, slo, merged.nucleus_margin, nch,
            C=ksp.CHUNK, PCH=pch, BK=ksp.WALK, num_warps=ksp.HIST_WARPS)
    with ksp._LAUNCH_LOCK:
        ksp._esc_stats_kernel[(E, nch)](
            g, g.stride(0), g.stride(1), S, vocab_size, idx, real, temp, minp,
            inp.top_p.contiguous(), merged.row_max, inp.draft.contiguous(), inp.seeds.contiguous(),
            inp.positions.contiguous(), sc["hist"], sc["done"][1], lo, need, slo, part, nch,
            merged.gval, merged.gidx, merged.lse, merged.sx, deferred,
            C=ksp.CHUNK, PCH=pch, NPART=ksp.NPART, num_warps=ksp.STATS_WARPS)
    return deferred
