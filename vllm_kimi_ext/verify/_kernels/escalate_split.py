"""Triton kernels of the whole-row escalation's cut for bf16 logits (launched from
:mod:`..escalate.rows`), split over many programs per row.

Two launches per step, each ``slots x chunks`` programs (a slot that is not
real returns at once, so a step where no row escalates costs two empty launches):

``_esc_hist_kernel``
    Each program reads one chunk of its slot's gathered row (``z``, bf16) and adds
    the chunk's tokens to the slot's **count** histogram over the 65536 ordered
    bf16 keys (integer atomics: the same counts on every rank and every run),
    stores the chunk's float64 mass ``sum exp(s - m)`` (``m``: the row's maximum,
    known from round 1) over the min-p set, and raises the slot's highest key.
    The last program of a slot to finish (an acquire/release counter) then walks
    the histogram from the highest key down: the mass of a key is
    ``count x exp(s_key - m)`` (all its tokens share one value), so the first key at
    which the running mass reaches ``top_p x Z`` is the cut's value and
    ``need = ceil((target - above) / w)`` is how many of the tokens tied at it are
    kept, in id order (the reference's stable sort). Only this walk is serial, and
    it stops at the cut (usually a few hundred keys below the top).

``_esc_stats_kernel``
    Each program computes its chunk's statistics under the cut, split into the
    tokens strictly above the cut value (max, float64 sum-exp, Gumbel-max without
    the draft, ``s_x``) and the tokens tied at it (count, Gumbel-max, and the
    draft's rank among them); it also clears the histogram bins it added to. The
    last program of a slot merges the chunks in chunk order: the first ``need``
    tied tokens in id order are kept, whole chunks of them from their partials and
    the one chunk where the ``need``-th falls by re-reading that chunk. It writes
    the row's Gumbel-max, kept-set log-sum-exp, ``s_x`` and nucleus margin over
    the round-1 merge and clears the row's deferral.

Every reduction runs in a fixed order, so every rank makes the same decision from
the same gathered bytes. The histogram, the highest key and the two counters are
persistent zero-initialised scratch that each step leaves zeroed again, owned by the
verification step (its graphs never run concurrently) and allocated by its first,
eager call, before any capture.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..hashing import DOMAIN_GUMBEL
from .common import (
    _LAUNCH_LOCK,  # noqa: F401  (the launchers take the lock from here)
    _gumbel,
    _key_value,
    _okey,
    _row_keys,
)

_DOM_GUMBEL = tl.constexpr(DOMAIN_GUMBEL)



#: Ordered 16-bit keys: one bin per bf16 bit pattern.
BINS = 65536

_BINS = tl.constexpr(BINS)

#: Columns per program.
CHUNK = 2048

#: Histogram keys per step of the walk.
WALK = 256

#: Warps of the histogram and of the statistics launch.
HIST_WARPS = 4

STATS_WARPS = 8

#: float64 partials per chunk of ``_esc_stats_kernel``.
NPART = 9



@triton.jit
def _band(m, tp, n_cols):
    """Lowest ``s`` the histogram needs: tokens below ``m - ln(n / (1 - top_p)) - 1`` weigh
    less than ``(1 - top_p) / e`` together (each ``< exp(-delta)``, ``Z >= 1``), so the mass
    at or above the band exceeds ``top_p x Z`` and the cut lies inside it (rows without
    top-p need no histogram: ``+inf``)."""
    tp64 = tp.to(tl.float64)
    delta = tl.log(n_cols.to(tl.float64) / tl.maximum(1.0 - tp64, 1e-30)) + 1.0
    return tl.where(tp < 1.0, (m.to(tl.float64) - delta).to(tl.float32), float("inf"))



@triton.jit
def _chunk(g_ptr, rank_stride, slot_off, S, n_cols, chunk, C: tl.constexpr):
    """Columns, validity and bf16 logits of one chunk of a gathered ``[TP, E, S]`` row."""
    c = chunk * C + tl.arange(0, C)
    ok = c < n_cols
    r = c // S
    z = tl.load(g_ptr + r.to(tl.int64) * rank_stride + slot_off + (c - r * S), mask=ok,
                other=0.0)
    return c, ok, z



@triton.jit
def _load_chunk(g_ptr, rank_stride, slot_stride, S, n_cols, slot, chunk, idx_ptr, temp_ptr,
                minp_ptr, topp_ptr, rmax_ptr, C: tl.constexpr):
    """One chunk of an escalated row: ``(row, t, tp, m, cut, cols, valid, z, s, key, in
    the min-p set, in the histogram band)``."""
    row = tl.load(idx_ptr + slot)
    t = tl.load(temp_ptr + row)
    mp = tl.load(minp_ptr + row)
    tp = tl.load(topp_ptr + row)
    m = tl.load(rmax_ptr + row)
    cutv = tl.where(mp > 0.0, m + tl.log(tl.where(mp > 0.0, mp, 1.0)), float("-inf"))
    c, ok, z = _chunk(g_ptr, rank_stride, slot * slot_stride, S, n_cols, chunk, C)
    s = tl.div_rn(z.to(tl.float32), t)
    inset = ok & (s >= cutv) & (s > float("-inf"))
    hin = inset & (s >= _band(m, tp, n_cols))
    return row, t, tp, m, cutv, c, ok, z, s, _okey(z), inset, hin



@triton.jit
def _esc_hist_kernel(g_ptr, rank_stride, slot_stride, S, n_cols, idx_ptr, real_ptr,
                     temp_ptr, minp_ptr, topp_ptr, rmax_ptr,
                     hist_ptr, top_ptr, done_ptr, partz_ptr, lo_ptr, need_ptr, slo_ptr,
                     margin_ptr, nch,
                     C: tl.constexpr, PCH: tl.constexpr, BK: tl.constexpr):
    """Long because: the histogram and the serial walk over it share one launch (the
    walk runs in the slot's last program), one fewer launch in every captured step."""
    slot = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    if tl.load(real_ptr + slot) == 0:
        return
    row, t, tp32, m, cutv, c, ok, z, s, key, inset, hin = _load_chunk(
        g_ptr, rank_stride, slot_stride, S, n_cols, slot, chunk, idx_ptr, temp_ptr, minp_ptr,
        topp_ptr, rmax_ptr, C)
    hrow = hist_ptr + slot * _BINS
    tl.atomic_add(hrow + key, tl.full(key.shape, 1, tl.int32), mask=hin, sem="relaxed")
    w = tl.where(inset, tl.exp(s.to(tl.float64) - m.to(tl.float64)), 0.0)
    tl.store(partz_ptr + slot * nch + chunk, tl.sum(w, axis=0))
    tl.atomic_max(top_ptr + slot, tl.max(tl.where(hin, key, 0), axis=0), sem="relaxed")
    tl.debug_barrier()
    if tl.atomic_add(done_ptr + slot, 1, sem="acq_rel", scope="gpu") != nch - 1:
        return
    # the slot's last program: the cut
    tl.store(done_ptr + slot, 0)
    top = tl.atomic_xchg(top_ptr + slot, 0, sem="acq_rel", scope="gpu")
    tp = tp32.to(tl.float64)
    ch = tl.arange(0, PCH)
    zt = tl.sum(tl.load(partz_ptr + slot * nch + ch, mask=ch < nch, other=0.0,
                        cache_modifier=".cg"), axis=0)
    lo = tl.full((), -1, tl.int32)
    need = tl.full((), 0, tl.int32)
    slo = tl.full((), float("-inf"), tl.float32)
    margin = tl.full((), float("nan"), tl.float64)
    if tp < 1.0:
        target = tp * zt
        pos = tl.arange(0, BK)
        running = tl.zeros((), tl.float64)
        above = tl.zeros((), tl.float64)
        wv = tl.full((), 1.0, tl.float64)
        nlo = tl.full((), 0, tl.int32)
        found = tl.full((), 0, tl.int32)
        b = top // BK
        while (found == 0) & (b >= 0):
            keys = b * BK + (BK - 1) - pos  # descending
            cnt = tl.load(hrow + keys, cache_modifier=".cg")
            sk = _key_value(keys, t)
            use = (cnt > 0) & (sk >= cutv)
            w1 = tl.where(use, tl.exp(sk.to(tl.float64) - m.to(tl.float64)), 0.0)
            wk = cnt.to(tl.float64) * w1
            cum = running + tl.cumsum(wk, axis=0)
            hit = use & (cum >= target)
            p = tl.min(tl.where(hit, pos, BK), axis=0)
            # the lowest used key so far (the cut if rounding never reaches the target)
            p = tl.where(p < BK, p, tl.max(tl.where(use, pos, -1), axis=0))
            if p >= 0:
                sel = pos == p
                lo = tl.sum(tl.where(sel, keys, 0), axis=0)
                wsel = tl.sum(tl.where(sel, wk, 0.0), axis=0)
                above = tl.sum(tl.where(sel, cum, 0.0), axis=0) - wsel
                wv = tl.sum(tl.where(sel, w1, 0.0), axis=0)
                nlo = tl.sum(tl.where(sel, cnt, 0), axis=0)
                slo = tl.sum(tl.where(sel, sk, 0.0), axis=0)
                found = tl.where(tl.sum(hit.to(tl.int32), axis=0) > 0, 1, 0)
            running += tl.sum(wk, axis=0)
            b -= 1
        # tied token i (1-based, id order) is kept iff above + (i - 1) * wv < target
        needf = tl.minimum(tl.maximum(tl.ceil((target - above) / wv), 1.0),
                           nlo.to(tl.float64))
        need = needf.to(tl.int32)
        before = above + (needf - 1.0) * wv
        through = before + wv
        up = tl.where(through >= target, (through - target) / zt, float("inf"))
        margin = tl.minimum((target - before) / zt, up)
    tl.store(lo_ptr + slot, lo)
    tl.store(need_ptr + slot, need)
    tl.store(slo_ptr + slot, slo)
    tl.store(margin_ptr + row, margin)



@triton.jit
def _esc_stats_kernel(g_ptr, rank_stride, slot_stride, S, n_cols, idx_ptr, real_ptr,
                      temp_ptr, minp_ptr, topp_ptr, rmax_ptr, draft_ptr, seed_ptr, pos_ptr,
                      hist_ptr, done_ptr, lo_ptr, need_ptr, slo_ptr, part_ptr, nch,
                      gval_ptr, gidx_ptr, lse_ptr, sx_ptr, defer_ptr,
                      C: tl.constexpr, PCH: tl.constexpr, NPART: tl.constexpr):
    """Long because: the per-chunk statistics and their merge share one launch (the
    merge runs in the slot's last program); the tied tokens are kept in id order, which
    needs the chunk where the ``need``-th falls re-read by that last program."""
    slot = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    lo = tl.load(lo_ptr + slot)  # the cut's key (-1: none), from the histogram launch
    if tl.load(real_ptr + slot) == 0:
        return
    row, t, tp32, m, cutv, c, ok, z, s, key, inset, hin = _load_chunk(
        g_ptr, rank_stride, slot_stride, S, n_cols, slot, chunk, idx_ptr, temp_ptr, minp_ptr,
        topp_ptr, rmax_ptr, C)
    x = tl.load(draft_ptr + row)
    h1, h2 = _row_keys(tl.load(seed_ptr + row), tl.load(pos_ptr + row), _DOM_GUMBEL)
    hrow = hist_ptr + slot * _BINS
    tl.store(hrow + key, tl.zeros(key.shape, tl.int32), mask=hin)  # leave it zeroed
    isx = c.to(tl.int64) == x
    g = _gumbel(h1, h2, c)
    # tokens strictly above the cut value
    ab = inset & (key > lo)
    sa = tl.where(ab, s, float("-inf"))
    am = tl.max(sa, axis=0)
    safe = tl.where(am > float("-inf"), am, 0.0).to(tl.float64)
    ase = tl.sum(tl.where(ab, tl.exp(sa.to(tl.float64) - safe), 0.0), axis=0)
    sc = tl.where(ab & ~isx, s + g, float("-inf"))
    agv, agi = tl.max(sc, axis=0, return_indices=True, return_indices_tie_break_left=True)
    asx = tl.max(tl.where(ab & isx, s, float("-inf")), axis=0)
    # tokens tied at it
    tie = inset & (key == lo)
    tcnt = tl.sum(tie.to(tl.int32), axis=0)
    tsc = tl.where(tie & ~isx, s + g, float("-inf"))
    tgv, tgi = tl.max(tsc, axis=0, return_indices=True, return_indices_tie_break_left=True)
    xin = tl.where(tl.sum((tie & isx).to(tl.int32), axis=0) > 0,
                   tl.sum((tie & (c.to(tl.int64) < x)).to(tl.int32), axis=0), -1)
    base = part_ptr + (slot * nch + chunk) * NPART
    tl.store(base + 0, am.to(tl.float64))
    tl.store(base + 1, ase)
    tl.store(base + 2, agv.to(tl.float64))
    tl.store(base + 3, (chunk * C + agi).to(tl.float64))
    tl.store(base + 4, asx.to(tl.float64))
    tl.store(base + 5, tcnt.to(tl.float64))
    tl.store(base + 6, tgv.to(tl.float64))
    tl.store(base + 7, (chunk * C + tgi).to(tl.float64))
    tl.store(base + 8, xin.to(tl.float64))
    tl.debug_barrier()
    if tl.atomic_add(done_ptr + slot, 1, sem="acq_rel", scope="gpu") != nch - 1:
        return
    # the slot's last program: merge the chunks in chunk order
    tl.store(done_ptr + slot, 0)
    need = tl.load(need_ptr + slot)
    slo = tl.load(slo_ptr + slot)
    ch = tl.arange(0, PCH)
    okc = ch < nch
    pb = part_ptr + (slot * nch + ch) * NPART
    pam = tl.load(pb + 0, mask=okc, other=float("-inf"), cache_modifier=".cg")
    pase = tl.load(pb + 1, mask=okc, other=0.0, cache_modifier=".cg")
    pagv = tl.load(pb + 2, mask=okc, other=float("-inf"), cache_modifier=".cg")
    pagi = tl.load(pb + 3, mask=okc, other=0.0, cache_modifier=".cg").to(tl.int64)
    pasx = tl.load(pb + 4, mask=okc, other=float("-inf"), cache_modifier=".cg")
    ptc = tl.load(pb + 5, mask=okc, other=0.0, cache_modifier=".cg").to(tl.int32)
    ptgv = tl.load(pb + 6, mask=okc, other=float("-inf"), cache_modifier=".cg")
    ptgi = tl.load(pb + 7, mask=okc, other=0.0, cache_modifier=".cg").to(tl.int64)
    pxin = tl.load(pb + 8, mask=okc, other=-1.0, cache_modifier=".cg").to(tl.int32)
    incl = tl.cumsum(ptc, axis=0)
    excl = incl - ptc
    # chunks whose tied tokens are all kept, and the chunk holding the need-th
    whole = incl <= need
    jb = tl.min(tl.where(okc & (incl > need) & (excl < need), ch, PCH), axis=0)
    # the kept set's log-sum-exp (tied tokens share the value slo)
    mm = tl.max(pam, axis=0)
    mm = tl.where(need > 0, tl.maximum(mm, slo.to(tl.float64)), mm)
    msafe = tl.where(mm > float("-inf"), mm, 0.0)
    tot = tl.sum(tl.where(pam > float("-inf"), pase * tl.exp(pam - msafe), 0.0), axis=0)
    tot += need.to(tl.float64) * tl.where(need > 0, tl.exp(slo.to(tl.float64) - msafe), 0.0)
    lse = tl.where(mm > float("-inf"), mm + tl.log(tl.maximum(tot, 1e-300)), float("-inf"))
    # s_x: above the cut, or tied and among the first need
    sx = tl.max(pasx, axis=0)
    xrank = tl.max(pxin, axis=0)  # tied tokens before x in its chunk (-1: x not tied)
    xch = tl.where(x >= 0, (x // C).to(tl.int32), -1)
    xrank = tl.where(xrank >= 0, xrank + tl.sum(tl.where(ch < xch, ptc, 0), axis=0) + 1, -1)
    sx = tl.where((xrank > 0) & (xrank <= need), tl.maximum(sx.to(tl.float32), slo),
                  sx.to(tl.float32))
    # Gumbel-max: above-cut partials, whole tied chunks, and the boundary chunk re-read
    vals = tl.where(whole & okc, tl.maximum(pagv, ptgv), pagv)
    best = tl.max(vals, axis=0)
    cola = tl.where(pagv == best, pagi, 2**40)
    colt = tl.where(whole & okc & (ptgv == best), ptgi, 2**40)
    bcol = tl.minimum(tl.min(cola, axis=0), tl.min(colt, axis=0))
    bval = best.to(tl.float32)
    if jb < PCH:
        c, ok, z = _chunk(g_ptr, rank_stride, slot * slot_stride, S, n_cols, jb, C)
        s = tl.div_rn(z.to(tl.float32), t)
        key = _okey(z)
        tie = ok & (s >= cutv) & (s > float("-inf")) & (key == lo)
        rank = tl.sum(tl.where(ch < jb, ptc, 0), axis=0) + tl.cumsum(tie.to(tl.int32), axis=0)
        kept = tie & (rank <= need) & (c.to(tl.int64) != x)
        sc = tl.where(kept, s + _gumbel(h1, h2, c), float("-inf"))
        bv, bi = tl.max(sc, axis=0, return_indices=True, return_indices_tie_break_left=True)
        bc = (jb * C + bi).to(tl.int64)
        better = (bv > bval) | ((bv == bval) & (bv > float("-inf")) & (bc < bcol))
        bval = tl.where(better, bv, bval)
        bcol = tl.where(better, bc, bcol)
    bcol = tl.where(bval > float("-inf"), bcol, -1)
    tl.store(gval_ptr + row, bval)
    tl.store(gidx_ptr + row, bcol)
    tl.store(lse_ptr + row, lse.to(tl.float32))
    tl.store(sx_ptr + row, sx)
    tl.store(defer_ptr + row, tl.zeros((), tl.int8))
