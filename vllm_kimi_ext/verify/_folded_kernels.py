"""Triton kernels of the folded escalation (:mod:`.escalate_folded`, whose torch functions are
their reference bodies). Every launch has one program (or one row of programs) per escalation
slot, and a program whose slot holds no uncertified row returns at once on the slot's device
flag, so a step in which no row escalates runs these launches empty (no host sync, fixed
shapes: CUDA-graph safe).

* ``_fold_cand_kernel`` (``slots x splits``): one 2,048-column split of a picked row's shard,
  its first ``W + W2`` 16-bit keys (value desc, column asc) by one ``tl.topk``.
* ``_fold_top_kernel`` (``slots``): the row's first ``W + W2`` keys over the splits; writes the
  ranks ``W .. W + W2 - 1`` (the smallest last) into the send buffer.
* ``_fold_build_kernel`` (``slots``): after the all-gather, the picked rows' round-1 payloads
  with each rank's further candidates decoded after its first ``W`` (the second merge's input,
  :func:`.escalate_folded.slot_payload`) and the picked rows' inputs (temperature 0 for an
  empty slot: the merge skips it).
* the second merge is round 1's own (:func:`._graph_kernels.merge_round1`, ``W + W2`` per rank);
* ``_fold_apply_kernel`` (``slots``): the rows it certified, copied over the round-1 merge.

The first ``F`` picked rows are also cut on their gathered whole rows by the whole-row
escalation's kernels (:func:`._graph_kernels.escalate_one_hot`), which return at once on an
empty slot too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._escalate_kernels import pick_slots
from ._graph_kernels import _key16, _unkey16, escalate_one_hot, merge_round1
from ._triton_kernels import _LAUNCH_LOCK
from .escalate_folded import pack, slot_plan, unpack
from .step_plan import STAT_COLUMNS, StepInputs, folded_round_bytes

#: Columns per program of the candidate selection.
CHUNK = 2048
_SENT32 = tl.constexpr(-2147483648)
_C = tl.constexpr(STAT_COLUMNS)


@triton.jit
def _fold_cand_kernel(logits_ptr, logits_stride, idx_ptr, real_ptr, part_ptr, n_valid, nsplit,
                      C: tl.constexpr, WT: tl.constexpr, KP: tl.constexpr):
    slot = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    if tl.load(real_ptr + slot) == 0:
        return
    row = tl.load(idx_ptr + slot)
    cols = split * C + tl.arange(0, C)
    ok = cols < n_valid
    z = tl.load(logits_ptr + row * logits_stride + cols, mask=ok, other=0.0)
    keys = tl.where(ok, _key16(z, cols), _SENT32)
    top = tl.topk(keys, KP)
    offs = tl.arange(0, KP)
    tl.store(part_ptr + (slot * nsplit + split) * WT + offs, top, mask=offs < WT)


@triton.jit
def _fold_top_kernel(part_ptr, real_ptr, out_ptr, nsplit, W: tl.constexpr, W2: tl.constexpr,
                     WT: tl.constexpr, KP: tl.constexpr, PK: tl.constexpr):
    slot = tl.program_id(0).to(tl.int64)
    if tl.load(real_ptr + slot) == 0:
        return
    ko = tl.arange(0, PK)
    keys = tl.load(part_ptr + slot * nsplit * WT + ko, mask=ko < nsplit * WT, other=_SENT32)
    top = tl.topk(keys, KP)
    offs = tl.arange(0, KP)
    tl.store(out_ptr + slot * W2 + (offs - W), top, mask=(offs >= W) & (offs < WT))


@triton.jit
def _fold_build_kernel(g_ptr, g_rank_stride, g_row_stride, key_ptr, key_rank_stride,
                       idx_ptr, real_ptr, temp_ptr, topk_ptr, minp_ptr, topp_ptr, draft_ptr,
                       seed_ptr, pos_ptr, o_ptr, o_rank_stride, o_row_stride,
                       s_temp, s_topk, s_minp, s_topp, s_draft, s_seed, s_pos, shard_width,
                       TP: tl.constexpr, W: tl.constexpr, W2: tl.constexpr,
                       PW: tl.constexpr, PW2: tl.constexpr):
    slot = tl.program_id(0).to(tl.int64)
    real = tl.load(real_ptr + slot)
    row = tl.load(idx_ptr + slot)
    t = tl.load(temp_ptr + row)
    tl.store(s_temp + slot, tl.where(real != 0, t, 0.0))
    if real == 0:
        return
    tl.store(s_topk + slot, tl.load(topk_ptr + row))
    tl.store(s_minp + slot, tl.load(minp_ptr + row))
    tl.store(s_topp + slot, tl.load(topp_ptr + row))
    tl.store(s_draft + slot, tl.load(draft_ptr + row))
    tl.store(s_seed + slot, tl.load(seed_ptr + row))
    tl.store(s_pos + slot, tl.load(pos_ptr + row))
    safe_t = tl.where(t != 0.0, t, 1.0)
    c8 = tl.arange(0, 8)
    cw = tl.arange(0, PW)
    ce = tl.arange(0, PW2)
    for r in tl.static_range(TP):
        src = g_ptr + r * g_rank_stride + row * g_row_stride
        dst = o_ptr + r * o_rank_stride + slot * o_row_stride
        tl.store(dst + c8, tl.load(src + c8, mask=c8 < _C), mask=c8 < _C)
        tl.store(dst + _C + cw, tl.load(src + _C + cw, mask=cw < W), mask=cw < W)
        tl.store(dst + _C + W + W2 + cw, tl.load(src + _C + W + cw, mask=cw < W), mask=cw < W)
        k = tl.load(key_ptr + r * key_rank_stride + slot * W2 + ce, mask=ce < W2, other=_SENT32)
        val, lcol = _unkey16(k, safe_t)
        bad = (lcol < 0) | (val == float("-inf"))
        gid = tl.where(bad, -1, lcol + r * shard_width)
        tl.store(dst + _C + W + ce, tl.where(bad, float("-inf"), val), mask=ce < W2)
        tl.store(dst + _C + 2 * W + W2 + ce, gid.to(tl.float32), mask=ce < W2)


@triton.jit
def _fold_apply_kernel(idx_ptr, real_ptr, unc2_ptr, gval2, gidx2, lse2, sx2, margin2,
                       gval_ptr, gidx_ptr, lse_ptr, sx_ptr, margin_ptr, defer_ptr):
    slot = tl.program_id(0).to(tl.int64)
    if (tl.load(real_ptr + slot) == 0) | (tl.load(unc2_ptr + slot) != 0):
        return
    row = tl.load(idx_ptr + slot)
    tl.store(gval_ptr + row, tl.load(gval2 + slot))
    tl.store(gidx_ptr + row, tl.load(gidx2 + slot))
    tl.store(lse_ptr + row, tl.load(lse2 + slot))
    tl.store(sx_ptr + row, tl.load(sx2 + slot))
    tl.store(margin_ptr + row, tl.load(margin2 + slot))
    tl.store(defer_ptr + row, tl.zeros((), tl.int8))


def further_candidates(logits_shard, idx, real8, W: int, W2: int, n_valid: int, out):
    """Triton :func:`.escalate_folded.further_candidates_torch` into ``out`` (int32
    ``[E * W2]``, a view of the send buffer); empty slots write nothing."""
    E = idx.shape[0]
    WT = W + W2
    KP = triton.next_power_of_2(WT)
    C = max(CHUNK, KP)
    nsplit = max(1, triton.cdiv(max(n_valid, 1), C))
    part = torch.empty((E, nsplit, WT), dtype=torch.int32, device=logits_shard.device)
    with _LAUNCH_LOCK:
        _fold_cand_kernel[(E, nsplit)](logits_shard, logits_shard.stride(0), idx, real8, part,
                                       n_valid, nsplit, C=C, WT=WT, KP=KP, num_warps=8)
    with _LAUNCH_LOCK:
        _fold_top_kernel[(E,)](part, real8, out, nsplit, W=W, W2=W2, WT=WT, KP=KP,
                               PK=max(triton.next_power_of_2(nsplit * WT), KP), num_warps=16)


def escalate_folded_triton(step, logits_shard, inp, plan, merged, g):
    """:func:`.escalate_folded.escalate_folded` on the Triton kernels (bf16 logits)."""
    E, W, W2, F = (plan.escalation_slots, plan.candidates, plan.folded_candidates,
                   plan.row_fallback_slots)
    S, V, dev = step.shard_width, step.vocab_size, logits_shard.device
    if logits_shard.stride(1) != 1:
        logits_shard = logits_shard.contiguous()
    n_valid = max(0, min(S, V - step.col_offset))
    idx, real8, deferred = pick_slots(merged.uncertified, inp.row_in_req, E)
    keys = torch.empty(E * W2, dtype=torch.int32, device=dev)
    further_candidates(logits_shard, idx, real8, W, W2, n_valid, keys)
    rows = logits_shard.index_select(0, idx[:F]) if F else None
    nbytes = folded_round_bytes(E, W2, F, S, logits_shard.element_size())
    gb = step.all_gather(pack(keys, rows, nbytes))[:, 0]
    gkeys, grows = unpack(gb, E, W2, F, S, logits_shard.dtype)
    TP = gkeys.shape[0]
    WT = W + W2
    g = g if g.dtype == torch.float32 and g.stride(2) == 1 else g.float().contiguous()
    g2 = torch.empty((TP, E, STAT_COLUMNS + 2 * WT), dtype=torch.float32, device=dev)
    i64 = dict(dtype=torch.int64, device=dev)
    f32 = dict(dtype=torch.float32, device=dev)
    sub = StepInputs(cu_num_rows=inp.cu_num_rows, draft=torch.empty(E, **i64),
                     req_of_row=idx, row_in_req=idx, temperature=torch.empty(E, **f32),
                     seeds=torch.empty(E, **i64), positions=torch.empty(E, **i64),
                     top_k=torch.empty(E, **i64), min_p=torch.empty(E, **f32),
                     top_p=torch.empty(E, **f32))
    with _LAUNCH_LOCK:
        _fold_build_kernel[(E,)](
            g, g.stride(0), g.stride(1), gkeys, gkeys.stride(0), idx, real8, inp.temperature,
            inp.top_k, inp.min_p, inp.top_p, inp.draft, inp.seeds, inp.positions,
            g2, g2.stride(0), g2.stride(1), sub.temperature, sub.top_k, sub.min_p, sub.top_p,
            sub.draft, sub.seeds, sub.positions, S, TP=TP, W=W, W2=W2,
            PW=triton.next_power_of_2(W), PW2=triton.next_power_of_2(W2), num_warps=4)
    m2 = merge_round1(g2, sub, slot_plan(plan), V, step.rank_valid(dev), None)
    with _LAUNCH_LOCK:
        _fold_apply_kernel[(E,)](idx, real8, m2.uncertified, m2.gval, m2.gidx, m2.lse, m2.sx,
                                 m2.nucleus_margin, merged.gval, merged.gidx, merged.lse,
                                 merged.sx, merged.nucleus_margin, deferred, num_warps=1)
    if F:
        escalate_one_hot(grows, idx[:F], real8[:F], inp, merged, V, deferred,
                         step._escalation_scratch)
    return deferred
