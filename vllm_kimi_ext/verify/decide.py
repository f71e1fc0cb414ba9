"""The decision: the first rejection (or deferral) per request, the recovered / bonus
token and vLLM's ``(sampled, num_sampled)``, made by one program per request from the
merged per-row statistics.

:func:`decide_merged` is the round after a merge: the torch body (:func:`decide_merged_torch`) or
the Triton launcher (:func:`decide_merged_triton`). A stats-only step (no cut, one-hot
drafts) merges its ``(gval, gidx[, lse, s_x])`` statistics and decides in one
(:func:`decide_stats_only`; Triton: one kernel). Kernels in :mod:`._kernels.decide`.
"""

from __future__ import annotations

import torch

from .hashing import accept_uniform
from .protocol import StepPlan
from .rowmath import merge_argmax
from .step_io import Merged, StepInputs, StepOutput, constant

NEG_INF = float("-inf")


def decide_merged(merged: Merged, deferred: torch.Tensor, inp: StepInputs, plan: StepPlan,
                  vocab_size: int, *, triton: bool):
    """``(sampled, num_sampled, decision_row, accept_margin, stopped)`` of a merged step."""
    if triton:
        return decide_merged_triton(merged, deferred, inp, plan, vocab_size)
    return decide_merged_torch(merged, deferred, inp, plan, vocab_size)


def decide_stats_only(g: torch.Tensor, inp: StepInputs, plan: StepPlan, vocab_size: int, *,
                      triton: bool) -> StepOutput:
    """A stats-only step's merge and decision from ``g [TP, rows, 2 or 4]``."""
    R, dev = plan.num_rows, g.device
    # read-only constants made once (no fill launches inside the captured step)
    nan64 = constant(R, float("nan"), torch.float64, dev)
    no = constant(R, False, torch.bool, dev)
    if triton:
        sampled, num_sampled, margin, stopped = decide_stats_triton(g, inp, plan, vocab_size)
    else:
        sampled, num_sampled, _, margin, stopped = decide_merged_torch(
            merge_stats_torch(g, plan), no, inp, plan, vocab_size)
    return StepOutput(sampled=sampled, num_sampled=num_sampled, accept_margin=margin,
                      nucleus_margin=nan64, uncertified=no, deferred=no, stopped=stopped)


def decide_merged_torch(merged: Merged, deferred: torch.Tensor, inp: StepInputs,
                        plan: StepPlan, vocab_size: int):
    """First rejection (or deferral) per request; returns ``(sampled, num_sampled,
    decision_row, accept_margin, stopped)``."""
    R, Lmax = plan.num_rows, plan.max_rows_per_req
    dev = merged.gval.device
    x = inp.draft
    greedy = inp.temperature == 0
    valid = (x >= 0) & (x < vocab_size)
    log_u = torch.log(accept_uniform(inp.seeds, inp.positions))
    margin = (merged.sx - merged.lse) - log_u
    accept = torch.where(greedy, valid & (merged.gidx == x), valid & (margin > 0))
    lens = inp.cu_num_rows[1:] - inp.cu_num_rows[:-1]
    bonus = inp.row_in_req == (lens[inp.req_of_row] - 1)
    accept = accept & ~bonus & ~deferred
    steps = torch.arange(Lmax, device=dev)
    idx = (inp.cu_num_rows[:-1, None] + steps[None, :]).clamp(max=max(R - 1, 0))
    in_req = steps[None, :] < lens[:, None]
    acc = accept[idx] & in_req
    n_acc = torch.cumprod(acc.long(), dim=1).sum(dim=1)
    drow = inp.cu_num_rows[:-1] + n_acc
    stopped = deferred[drow.clamp(max=max(R - 1, 0))] & (n_acc < lens)
    tok = merged.gidx[drow]  # argmax on greedy rows, the Gumbel-max on sampling rows
    if plan.probabilistic:
        use_res = (merged.res_tok[drow] >= 0) & valid[drow] & ~greedy[drow]
        tok = torch.where(use_res, merged.res_tok[drow], tok)
    drafts = x[idx]
    sampled = torch.where(steps[None, :] < n_acc[:, None], drafts, torch.full_like(drafts, -1))
    dec = torch.where(stopped, torch.full_like(tok, -1), tok)
    sampled.scatter_(1, n_acc.clamp(max=Lmax - 1)[:, None], dec[:, None])
    sampled = torch.where(steps[None, :] < (n_acc + (~stopped).long())[:, None], sampled,
                          torch.full_like(sampled, -1))
    num_sampled = (n_acc + (~stopped).long()).to(torch.int32)
    margin = torch.where(greedy, torch.full_like(margin, float("nan")), margin)
    return sampled, num_sampled, drow, margin, stopped


def merge_stats_torch(g: torch.Tensor, plan: StepPlan) -> Merged:
    """Merge the stats-only round ``g [TP, rows, 2 or 4]``: ``(gval, gidx)`` and, when
    sampling, ``(lse, s_x)`` (no cut, one-hot drafts)."""
    R, dev = plan.num_rows, g.device
    best, tok = merge_argmax(g[..., 0], g[..., 1])
    if plan.all_greedy:
        neg = torch.full((R,), NEG_INF, device=dev)
        lse, sx = neg, neg
    else:
        lse = torch.logsumexp(g[..., 2], dim=0)
        sx = g[..., 3].max(dim=0).values
    none = constant(R, -1, torch.int64, dev)
    no = constant(R, False, torch.bool, dev)
    return Merged(best, tok, lse, sx, none, no, constant(R, float("nan"), torch.float64, dev),
                  none)


# ---------------------------------------------------------------------------
# Triton launchers (the kernels: _kernels/decide.py)
# ---------------------------------------------------------------------------


def decide_merged_triton(
    merged,  # Merged: [rows] gval float32, gidx int64, lse float32, sx float32, res_tok int64
    deferred,  # [rows] int8 / bool
    inp,  # StepInputs
    plan,  # StepPlan (host)
    vocab_size: int,
):
    """Triton version of :func:`decide_merged_torch`; returns ``(sampled
    [reqs, max_rows_per_req] int64, num_sampled [reqs] int32, decision_row [reqs] int64,
    accept_margin [rows] float32, stopped [reqs] int8)``."""
    import triton

    from ._kernels import decide as kd

    dev = merged.gidx.device
    Q, Lmax = plan.num_reqs, plan.max_rows_per_req
    sampled = torch.empty((Q, Lmax), dtype=torch.int64, device=dev)
    num_sampled = torch.empty(Q, dtype=torch.int32, device=dev)
    drow = torch.empty(Q, dtype=torch.int64, device=dev)
    stopped = torch.empty(Q, dtype=torch.int8, device=dev)
    margin = torch.empty(plan.num_rows, dtype=torch.float32, device=dev)
    with kd._LAUNCH_LOCK:
        kd._decide_merged_kernel[(Q,)](
            inp.cu_num_rows, inp.draft, inp.temperature, inp.seeds, inp.positions,
            merged.gidx, merged.lse, merged.sx, merged.res_tok, deferred.to(torch.int8),
            sampled, Lmax, num_sampled, drow, margin, stopped, vocab_size,
            PROB=plan.probabilistic, PLEN=triton.next_power_of_2(Lmax), num_warps=1)
    return sampled, num_sampled, drow, margin, stopped


def decide_stats_triton(g: torch.Tensor, inp: StepInputs, plan: StepPlan, vocab_size: int):
    """Triton merge and decision of a stats-only step; returns ``(sampled, num_sampled,
    accept_margin, stopped)``."""
    from ._kernels import decide as kd

    Q, Lmax, R, dev = plan.num_reqs, plan.max_rows_per_req, plan.num_rows, g.device
    sampled = torch.empty((Q, Lmax), dtype=torch.int64, device=dev)
    num_sampled = torch.empty((Q,), dtype=torch.int32, device=dev)
    drow = torch.empty((Q,), dtype=torch.int64, device=dev)
    margin = torch.empty((R,), dtype=torch.float32, device=dev)
    gg = g if g.dtype == torch.float32 and g.stride(2) == 1 else g.float().contiguous()
    kd.launch_decide(gg, inp.cu_num_rows, inp.draft, inp.temperature, inp.seeds,
                     inp.positions, sampled, num_sampled, drow, margin, vocab_size)
    return sampled, num_sampled, margin, constant(Q, False, torch.bool, dev)
