"""Triton kernels of the folded escalation (launched from :mod:`..escalate.folded`, whose torch
functions are their reference bodies). Every launch has one program (or one row of programs)
per slot, and a program whose slot holds no uncertified row returns at once on the slot's
device flag, so a step in which no row escalates runs these launches empty (no host sync,
fixed shapes: CUDA-graph safe).

Launches of the escalation (``E`` slots, the first ``F`` with a whole row):

* ``_pick_kernel`` (the whole-row escalation's, :mod:`.escalate_rows`);
* ``_fold_send_kernel`` (``E x splits``): writes this rank's send buffer in place. A whole-row
  slot's programs copy their 2,048 columns of the picked shard row; a key slot's programs
  each take their split's first ``W + W2`` 16-bit keys (value desc, column asc) by one
  ``tl.topk``, and the slot's last program to finish (an acquire/release counter, left zeroed)
  writes the ranks ``W .. W + W2 - 1`` over the splits: it bisects the 32-bit key range for
  the ``W``-th and ``(W + W2)``-th largest keys, compacts the keys between them (prefix sum)
  into the output, reads them back and sorts them (``SELECT``; else one ``tl.topk`` over every
  split's candidates, the same keys). It replaces the whole-row
  escalation's ``index_select`` (one launch for one launch) and reads nothing for an empty
  slot, where ``index_select`` copies every slot's row;
* the all-gather;
* with key slots (``E > F``): ``_fold_build_kernel`` (``E - F``): the key slots' round-1
  payloads with each rank's further candidates decoded after its first ``W`` (the second
  merge's input, :func:`..escalate.folded.slot_payload`) and their inputs (temperature 0 for
  an empty slot: the merge skips its cut); round 1's own merge (:mod:`.merge`, ``W + W2``
  per rank); ``_fold_apply_kernel`` (``E - F``): the rows it certified, copied over the
  round-1 merge;
* with whole-row slots (``F > 0``): the whole-row escalation's cut (:mod:`.escalate_split`,
  two launches), which returns at once on an empty slot too.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..protocol import STAT_COLUMNS
from .common import (
    _LAUNCH_LOCK,  # noqa: F401  (the launchers take the lock from here)
    _key16,
    _unkey16,
)

#: Columns per program of the send kernel.
CHUNK = 2048
_SENT32 = tl.constexpr(-2147483648)
_C = tl.constexpr(STAT_COLUMNS)


@triton.jit
def _fold_send_kernel(logits_ptr, logits_stride, idx_ptr, real_ptr, part_ptr, done_ptr,
                      keys_ptr, rows_ptr, S, n_valid, nsplit,
                      F: tl.constexpr, W: tl.constexpr, W2: tl.constexpr, WT: tl.constexpr,
                      C: tl.constexpr, KP: tl.constexpr, PK: tl.constexpr,
                      SELECT: tl.constexpr, P2: tl.constexpr):
    slot = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    if tl.load(real_ptr + slot) == 0:
        return
    row = tl.load(idx_ptr + slot)
    cols = split * C + tl.arange(0, C)
    src = logits_ptr + row * logits_stride + cols
    if slot < F:  # a whole-row slot: this split's columns of the shard row
        tl.store(rows_ptr + slot * S + cols, tl.load(src, mask=cols < S), mask=cols < S)
        return
    ks = slot - F
    ok = cols < n_valid
    keys = tl.where(ok, _key16(tl.load(src, mask=ok, other=0.0), cols), _SENT32)
    top = tl.topk(keys, KP)
    offs = tl.arange(0, KP)
    tl.store(part_ptr + (ks * nsplit + split) * WT + offs, top, mask=offs < WT)
    tl.debug_barrier()
    if tl.atomic_add(done_ptr + ks, 1, sem="acq_rel", scope="gpu") != nsplit - 1:
        return
    # the slot's last program: ranks W .. WT - 1 over the splits' first WT each
    tl.store(done_ptr + ks, 0)
    ko = tl.arange(0, PK)
    allk = tl.load(part_ptr + ks * nsplit * WT + ko, mask=ko < nsplit * WT, other=_SENT32,
                   cache_modifier=".cg")
    if SELECT:
        _send_ranks(allk, keys_ptr + ks * W2, W, W2, WT, P2)
    else:
        best = tl.topk(allk, KP)
        tl.store(keys_ptr + ks * W2 + (offs - W), best, mask=(offs >= W) & (offs < WT))


@triton.jit
def _kth_keys(x, ka, kb):
    """The ``ka``-th and ``kb``-th largest of the int32 keys ``x`` (with repeats): for each,
    the largest ``t`` with ``#(x >= t) >= k``, by bisection of the 32-bit key range."""
    lo_a = tl.full((), -2147483648, tl.int64)
    hi_a = tl.full((), 2147483647, tl.int64)
    lo_b = lo_a
    hi_b = hi_a
    x64 = x.to(tl.int64)
    for _ in tl.static_range(32):
        mid_a = (lo_a + hi_a + 1) // 2
        mid_b = (lo_b + hi_b + 1) // 2
        ca = tl.sum((x64 >= mid_a).to(tl.int32), axis=0) >= ka
        cb = tl.sum((x64 >= mid_b).to(tl.int32), axis=0) >= kb
        lo_a = tl.where(ca, mid_a, lo_a)
        hi_a = tl.where(ca, hi_a, mid_a - 1)
        lo_b = tl.where(cb, mid_b, lo_b)
        hi_b = tl.where(cb, hi_b, mid_b - 1)
    return lo_a, lo_b


@triton.jit
def _send_ranks(allk, out_ptr, W: tl.constexpr, W2: tl.constexpr, WT: tl.constexpr,
                P2: tl.constexpr):
    """Write the keys ranked ``W .. WT - 1`` of ``allk`` (valid keys unique: the column is in
    the key), descending, to ``out_ptr[0 : W2]``, :data:`_SENT32` past the valid ones: the
    two rank keys by bisection, the keys between them compacted (prefix sum) into the output,
    read back and sorted (``P2`` = next power of two of ``W2``)."""
    t_w, t_wt = _kth_keys(allk, W, WT)
    k64 = allk.to(tl.int64)
    pick = (k64 < t_w) & (k64 >= t_wt) & (allk != _SENT32)
    at = tl.cumsum(pick.to(tl.int32), axis=0) - 1
    n = tl.sum(pick.to(tl.int32), axis=0)
    tl.store(out_ptr + at, allk, mask=pick)
    tl.debug_barrier()
    o = tl.arange(0, P2)
    got = tl.load(out_ptr + o, mask=o < n, other=_SENT32, cache_modifier=".cg")
    srt = tl.sort(got, dim=0, descending=True)
    tl.debug_barrier()
    tl.store(out_ptr + o, srt, mask=o < W2)


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
