"""Triton kernels of the whole-row escalation (launched from :mod:`..escalate.rows`).

* ``_pick_kernel`` (one program): the escalation slots, the uncertified rows first in
  (row within request, row) order.
* ``_escalate_kernel`` (one program per slot): the exact cut of one gathered whole row
  (any logits dtype; bf16 rows take the split kernels of :mod:`.escalate_split`) and the
  kept set's statistics, written over round 1's merge.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..hashing import DOMAIN_GUMBEL
from .common import (
    _LAUNCH_LOCK,  # noqa: F401  (the launchers take the lock from here)
    _gumbel,
    _okey,
    _row_keys,
)

_DOM_GUMBEL = tl.constexpr(DOMAIN_GUMBEL)



@triton.jit
def _pick_kernel(unc_ptr, rin_ptr, R, idx_ptr, real_ptr, defer_ptr,
                 E: tl.constexpr, RP: tl.constexpr):
    """The escalation slots: the ``E`` uncertified rows first in (row within request,
    row) order; also the deferred-rows buffer initialised to the uncertified rows."""
    r = tl.arange(0, RP)
    ok = r < R
    u = (tl.load(unc_ptr + r, mask=ok, other=0) != 0) & ok
    rin = tl.load(rin_ptr + r, mask=ok, other=0).to(tl.int64)
    big = 2**62
    key = tl.where(u, rin * (R + 1) + r, big)
    sk = tl.sort(key, dim=0)
    valid = sk < big
    row = tl.where(valid, sk % (R + 1), 0)
    tl.store(idx_ptr + r, row, mask=r < E)
    tl.store(real_ptr + r, valid.to(tl.int8), mask=r < E)
    tl.store(defer_ptr + r, u.to(tl.int8), mask=ok)



@triton.jit
def _row_val(g_ptr, rank_stride, slot_off, S, c, n_cols, t):
    """``s = z / T`` of whole-row columns ``c`` read straight from the gathered
    ``[TP, E, S]`` shards (rank ``c // S``, local column ``c % S``)."""
    r = c // S
    ok = c < n_cols
    z = tl.load(g_ptr + r.to(tl.int64) * rank_stride + slot_off + (c - r * S), mask=ok,
                other=float("-inf"))
    return tl.where(ok, tl.div_rn(z.to(tl.float32), t), float("-inf"))



@triton.jit
def _escalate_kernel(g_ptr, rank_stride, slot_stride, S, n_cols, idx_ptr, real_ptr,
                     temp_ptr, minp_ptr, topp_ptr, draft_ptr, seed_ptr, pos_ptr,
                     gval_ptr, gidx_ptr, lse_ptr, sx_ptr, margin_ptr, defer_ptr,
                     w_ptr, k_ptr, BLOCK: tl.constexpr, K16: tl.constexpr):
    """Long because: one launch per escalated row; the cut and the row's statistics under it
    share the program's scratch and scalars (split, they would need more launches in every
    captured step, also when no row escalates).

    One escalated row (one-hot drafts): its exact min-p / top-p cut from the whole row
    (top-k rows are always certified, never escalated), then the row's statistics under
    that cut, written over the round-1 merge; unused slots return at once.

    The cut: one pass stores each token's float64 weight ``exp(s - max)`` (0 outside the
    min-p set) and its order key in scratch; the key of the last kept token is then found
    by bisection over the keys (16-bit keys of bf16 logits: the order of ``z / T`` is that
    of ``z``; else the int32 image of the float32 value), comparing the weight strictly
    above a key with ``top_p`` x the total; the tokens tied at it are kept in id order."""
    slot = tl.program_id(0).to(tl.int64)
    if tl.load(real_ptr + slot) == 0:
        return
    row = tl.load(idx_ptr + slot)
    so = slot * slot_stride
    t = tl.load(temp_ptr + row)
    mp = tl.load(minp_ptr + row)
    tp = tl.load(topp_ptr + row).to(tl.float64)
    offs = tl.arange(0, BLOCK)
    m = tl.full((), float("-inf"), tl.float32)
    for start in range(0, n_cols, BLOCK):
        m = tl.maximum(m, tl.max(_row_val(g_ptr, rank_stride, so, S, start + offs, n_cols, t),
                                 axis=0))
    m64 = m.to(tl.float64)
    cut = tl.where(mp > 0.0, m + tl.log(tl.where(mp > 0.0, mp, 1.0)), float("-inf"))
    thr = cut
    tie = n_cols.to(tl.int64)
    margin = tl.full((), float("nan"), tl.float64)
    if tp < 1.0:
        wrow = w_ptr + slot * n_cols
        krow = k_ptr + slot * n_cols
        z = tl.zeros((), tl.float64)
        for start in range(0, n_cols, BLOCK):
            c = start + offs
            ok = c < n_cols
            s = _row_val(g_ptr, rank_stride, so, S, c, n_cols, t)
            w = tl.where((s >= cut) & (s > float("-inf")), tl.exp(s.to(tl.float64) - m64), 0.0)
            if K16:
                r = c // S
                zz = tl.load(g_ptr + r.to(tl.int64) * rank_stride + so + (c - r * S), mask=ok,
                             other=0.0)
                key = _okey(zz) - 32768
            else:
                b = s.to(tl.int32, bitcast=True)
                b = tl.where(b == -2147483648, 0, b)
                key = b ^ ((b >> 31) & 0x7FFFFFFF)
            tl.store(wrow + c, w, mask=ok)
            tl.store(krow + c, key, mask=ok)
            z += tl.sum(w, axis=0)
        target = tp * z
        if K16:
            lo = tl.full((), -32769, tl.int64)
            hi = tl.full((), 32767, tl.int64)
        else:
            mbits = m.to(tl.int32, bitcast=True)
            hi = (mbits ^ ((mbits >> 31) & 0x7FFFFFFF)).to(tl.int64)
            lo = tl.full((), -2139095041, tl.int64)  # below the key of -FLT_MAX
        while lo < hi:  # smallest key k with weight(key > k) < target
            mid = lo + ((hi - lo) >> 1)
            acc = tl.zeros((), tl.float64)
            for start in range(0, n_cols, BLOCK):
                c = start + offs
                ok = c < n_cols
                w = tl.load(wrow + c, mask=ok, other=0.0)
                key = tl.load(krow + c, mask=ok, other=-2147483647).to(tl.int64)
                acc += tl.sum(tl.where(key > mid, w, 0.0), axis=0)
            if acc < target:
                hi = mid
            else:
                lo = mid + 1
        above = tl.zeros((), tl.float64)
        wv = tl.zeros((), tl.float64)
        v = tl.full((), float("-inf"), tl.float32)
        seen = tl.zeros((), tl.int64)
        for start in range(0, n_cols, BLOCK):
            c = start + offs
            ok = c < n_cols
            w = tl.load(wrow + c, mask=ok, other=0.0)
            key = tl.load(krow + c, mask=ok, other=-2147483647).to(tl.int64)
            above += tl.sum(tl.where(key > lo, w, 0.0), axis=0)
            hit = (key == lo) & ok
            s = _row_val(g_ptr, rank_stride, so, S, c, n_cols, t)
            v = tl.maximum(v, tl.max(tl.where(hit, s, float("-inf")), axis=0))
            wv = tl.maximum(wv, tl.max(tl.where(hit, w, 0.0), axis=0))
        # tied token i (1-based, id order) is kept iff above + (i - 1) * wv < target
        need = tl.maximum(tl.ceil((target - above) / wv), 1.0)
        tie = tl.full((), -1, tl.int64)
        for start in range(0, n_cols, BLOCK):
            c = start + offs
            key = tl.load(krow + c, mask=c < n_cols, other=-2147483647).to(tl.int64)
            eq = ((key == lo) & (c < n_cols)).to(tl.int64)
            rank = seen + tl.cumsum(eq, axis=0)
            hit = (eq == 1) & (rank.to(tl.float64) == need)
            tie = tl.maximum(tie, tl.max(tl.where(hit, c.to(tl.int64), -1), axis=0))
            seen += tl.sum(eq, axis=0)
        kept_last = tl.minimum(need, seen.to(tl.float64))
        before = above + (kept_last - 1.0) * wv
        through = before + wv
        up = tl.where(through >= target, (through - target) / z, float("inf"))
        margin = tl.minimum((target - before) / z, up)
        tie = tl.where(tie >= 0, tie, n_cols.to(tl.int64))
        thr = v
    # statistics of the row under the cut (as _stats_kernel, one program)
    x = tl.load(draft_ptr + row)
    h1, h2 = _row_keys(tl.load(seed_ptr + row), tl.load(pos_ptr + row), _DOM_GUMBEL)
    mm = tl.full((), float("-inf"), tl.float32)
    se = tl.zeros((), tl.float32)
    best_v = tl.full((), float("-inf"), tl.float32)
    best_i = tl.full((), -1, tl.int64)
    sx = tl.full((), float("-inf"), tl.float32)
    for start in range(0, n_cols, BLOCK):
        c = start + offs
        s = _row_val(g_ptr, rank_stride, so, S, c, n_cols, t)
        keep = (s > thr) | ((s == thr) & (c.to(tl.int64) <= tie))
        s = tl.where(keep & (s > float("-inf")), s, float("-inf"))
        bm = tl.max(s, axis=0)
        m_new = tl.maximum(mm, bm)
        fin = m_new > float("-inf")
        se = se * tl.where(fin, tl.exp(mm - m_new), 0.0) + tl.where(
            fin, tl.sum(tl.exp(s - m_new), axis=0), 0.0)
        mm = m_new
        sx = tl.maximum(sx, tl.max(tl.where(c.to(tl.int64) == x, s, float("-inf")), axis=0))
        sc = tl.where((s > float("-inf")) & (c.to(tl.int64) != x), s + _gumbel(h1, h2, c),
                      float("-inf"))
        bv, bi = tl.max(sc, axis=0, return_indices=True, return_indices_tie_break_left=True)
        if bv > best_v:
            best_v = bv
            best_i = (start + bi).to(tl.int64)
    lse = tl.where(mm > float("-inf"), mm + tl.log(tl.maximum(se, 1e-30)), float("-inf"))
    tl.store(gval_ptr + row, best_v)
    tl.store(gidx_ptr + row, best_i)
    tl.store(lse_ptr + row, lse)
    tl.store(sx_ptr + row, sx)
    tl.store(margin_ptr + row, margin)
    tl.store(defer_ptr + row, tl.zeros((), tl.int8))
