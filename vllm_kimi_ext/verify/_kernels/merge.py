"""Triton kernel of round 1's merge (launched from :mod:`..merge`).

``_merge_kernel`` (one program per row): the merge of
:func:`..merge.merge_round1_torch` for one-hot drafts: candidates of all ranks sorted
once, the min-p / top-k / top-p cut with its certificate, and the kept set's
log-sum-exp, ``s_x`` and Gumbel-max (draft excluded).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..hashing import DOMAIN_GUMBEL
from .common import (
    _LAUNCH_LOCK,  # noqa: F401  (the launchers take the lock from here)
    _SENT,
    _gumbel,
    _key,
    _row_keys,
    _unkey,
)

_DOM_GUMBEL = tl.constexpr(DOMAIN_GUMBEL)



@triton.jit
def _cand_key(row_ptr, rank_stride, rr, j, W: tl.constexpr, mask):
    """Round 1's sortable key of rank ``rr``'s candidate ``j`` (``_SENT`` past the end)."""
    p = row_ptr + rr * rank_stride + 5 + j
    v = tl.load(p, mask=mask, other=float("-inf"))
    gid = tl.load(p + W, mask=mask, other=-1.0).to(tl.int64)
    return tl.where(v > float("-inf"), _key(v, gid), _SENT)


@triton.jit
def _sort_runs(row_ptr, rank_stride, keys, r, j, okc, order_ptr, offs,
               TP: tl.constexpr, W: tl.constexpr, LOGW: tl.constexpr):
    """``tl.sort(keys, descending)`` of the ``TP`` runs of ``W`` keys (rank ``r``'s
    candidate ``j`` at ``r * W + j``), each already in descending order as every rank sends
    them: a stable merge of the runs. Each key's place is its index in its run plus, per other
    run, the number of that run's keys ahead of it (a binary search of ``LOGW`` steps:
    ``>=`` for earlier runs, ``>`` for later ones, so equal keys keep run order), and the
    keys are written there (``order_ptr``: the row's ``PN`` scratch) and read back in order.
    A run out of order (not a round-1 payload) takes ``tl.sort``: the same keys either way."""
    nxt = _cand_key(row_ptr, rank_stride, r, j + 1, W, okc & (j + 1 < W))
    ok = tl.sum((okc & (j + 1 < W) & (nxt > keys)).to(tl.int32), axis=0) == 0
    if ok:
        place = j
        for rr in tl.static_range(TP):
            lo = tl.zeros_like(j)
            hi = tl.full(j.shape, W, j.dtype)
            for _ in tl.static_range(LOGW):
                live = lo < hi
                mid = (lo + hi) // 2
                km = _cand_key(row_ptr, rank_stride, rr, mid, W, okc & live)
                ahead = tl.where(r > rr, km >= keys, km > keys)
                lo = tl.where(live & ahead, mid + 1, lo)
                hi = tl.where(live & ~ahead, mid, hi)
            place += tl.where(r == rr, 0, lo)
        tl.store(order_ptr + place, keys, mask=okc)
        tl.debug_barrier()
        skeys = tl.load(order_ptr + offs, mask=okc, other=_SENT)
    else:
        skeys = tl.sort(keys, dim=0, descending=True)
    return skeys


@triton.jit
def _merge_kernel(g_ptr, rank_stride, row_stride, rank_valid_ptr,
                  temp_ptr, topk_ptr, minp_ptr, topp_ptr, draft_ptr, seed_ptr, pos_ptr,
                  gval_ptr, gidx_ptr, lse_ptr, sx_ptr, unc_ptr, margin_ptr, rmax_ptr,
                  order_ptr,
                  TP: tl.constexpr, PTP: tl.constexpr, W: tl.constexpr, PN: tl.constexpr,
                  RUNS: tl.constexpr, LOGW: tl.constexpr):
    """Long because: one program per row fuses the statistics merge, the candidate sort, the
    exact-prefix certificate, the min-p / top-k / top-p cut and the kept set's decisions into
    one launch of the captured step (the steps of ``merge_round1_torch``, in its order)."""
    row = tl.program_id(0).to(tl.int64)
    ranks = tl.arange(0, PTP)
    okr = ranks < TP
    base = g_ptr + ranks.to(tl.int64) * rank_stride + row * row_stride
    gv = tl.load(base + 0, mask=okr, other=float("-inf"))
    gi = tl.load(base + 1, mask=okr, other=float("inf"))
    best = tl.max(gv, axis=0)
    tokf = tl.min(tl.where(gv == best, gi, float("inf")), axis=0)
    tokf = tl.where(tokf == float("inf"), tl.min(gi, axis=0), tokf)
    hi = tl.load(base + 2, mask=okr, other=float("-inf"))
    lo = tl.load(base + 3, mask=okr, other=0.0)
    l64 = hi.to(tl.float64) + lo.to(tl.float64)
    mx = tl.max(l64, axis=0)
    fin = mx > float("-inf")
    safe = tl.where(fin, mx, 0.0)
    tot = tl.sum(tl.where(l64 > float("-inf"), tl.exp(l64 - safe), 0.0), axis=0)
    lse_all = tl.where(fin, safe + tl.log(tl.maximum(tot, 1e-300)), float("-inf"))
    sxm = tl.max(tl.load(base + 4, mask=okr, other=float("-inf")), axis=0)
    temp = tl.load(temp_ptr + row)
    k = tl.load(topk_ptr + row)
    mp = tl.load(minp_ptr + row)
    tp = tl.load(topp_ptr + row).to(tl.float64)
    x = tl.load(draft_ptr + row)
    has_cut = (temp != 0.0) & ((k > 0) | (mp > 0.0) | (tp < 1.0))
    out_gv = best
    out_gi = tokf.to(tl.int64)
    out_lse = lse_all.to(tl.float32)
    out_sx = sxm
    unc = tl.full((), 0, tl.int32)
    margin = tl.full((), float("nan"), tl.float64)
    rmax = tl.full((), float("-inf"), tl.float32)
    if has_cut:
        offs = tl.arange(0, PN)
        r = offs // W
        j = offs % W
        okc = offs < TP * W
        cptr = g_ptr + r.to(tl.int64) * rank_stride + row * row_stride
        vals = tl.load(cptr + 5 + j, mask=okc, other=float("-inf"))
        gids = tl.load(cptr + 5 + W + j, mask=okc, other=-1.0).to(tl.int64)
        keys = tl.where(vals > float("-inf"), _key(vals, gids), _SENT)
        if RUNS:
            skeys = _sort_runs(g_ptr + row * row_stride, rank_stride, keys, r, j, okc,
                               order_ptr + row * PN, offs, TP, W, LOGW)
        else:
            skeys = tl.sort(keys, dim=0, descending=True)
        sv, sid = _unkey(skeys)
        pos = offs
        finite = sv > float("-inf")
        # a full rank's last sent entry at sorted position p: the order is exact up to p
        last_full = offs < 0
        for rr in tl.static_range(TP):
            lv = tl.load(g_ptr + rr * rank_stride + row * row_stride + 5 + W - 1)
            lg = tl.load(g_ptr + rr * rank_stride + row * row_stride + 5 + 2 * W - 1).to(tl.int64)
            full = (lv > float("-inf")) & (W < tl.load(rank_valid_ptr + rr))
            last_full = tl.where(full, last_full | (skeys == _key(lv, lg)), last_full)
        exact_len = tl.min(tl.where(last_full, pos + 1, TP * W + 1), axis=0)
        top = tl.max(sv, axis=0)
        rmax = top
        cutv = tl.where(mp > 0.0, top + tl.log(tl.where(mp > 0.0, mp, 1.0)), float("-inf"))
        n_minp = tl.sum((finite & (sv >= cutv)).to(tl.int32), axis=0)
        has_k = k > 0
        n_kept = tl.where(has_k, tl.minimum(n_minp, k.to(tl.int32)), n_minp)
        bounded = has_k | (mp > 0.0)
        nucleus = tp < 1.0
        known = has_k | (n_minp < exact_len)
        certified = known
        if nucleus:
            cand = tl.where(bounded, pos < n_kept, finite)
            w = tl.where(cand, sv.to(tl.float64), float("-inf"))
            wm = tl.max(w, axis=0)
            wsafe = tl.where(wm > float("-inf"), wm, 0.0)
            lse_u = wsafe + tl.log(tl.sum(tl.where(cand, tl.exp(w - wsafe), 0.0), axis=0))
            norm = tl.where(bounded, lse_u, lse_all)
            prob = tl.where(cand, tl.exp(w - norm), 0.0)
            cum = tl.cumsum(prob, axis=0)
            before = cum - prob
            n_nuc = tl.maximum(tl.sum((cand & (before < tp)).to(tl.int32), axis=0), 1)
            through = tl.sum(tl.where(pos == n_nuc - 1, cum, 0.0), axis=0)
            bef = tl.sum(tl.where(pos == n_nuc - 1, before, 0.0), axis=0)
            walk_ok = (exact_len == TP * W + 1) | ((through >= tp) & (n_nuc <= exact_len))
            certified = tl.where(bounded, known, walk_ok)
            up = tl.where(through >= tp, through - tp, float("inf"))
            margin = tl.minimum(tp - bef, up)
            n_kept = n_nuc
        kept = (pos < n_kept) & finite
        ks = tl.where(kept, sv, float("-inf"))
        km = tl.max(ks, axis=0)
        out_lse = km + tl.log(tl.sum(tl.where(kept, tl.exp(ks - km), 0.0), axis=0))
        is_x = (sid == x) & (x >= 0)
        out_sx = tl.max(tl.where(kept & is_x, sv, float("-inf")), axis=0)
        h1, h2 = _row_keys(tl.load(seed_ptr + row), tl.load(pos_ptr + row), _DOM_GUMBEL)
        sc = tl.where(kept & ~is_x, sv + _gumbel(h1, h2, tl.maximum(sid, 0)), float("-inf"))
        out_gv = tl.max(sc, axis=0)
        big = 2**62
        out_gi = tl.min(tl.where(sc == out_gv, sid, big), axis=0)
        out_gi = tl.where(out_gi == big, -1, out_gi)
        unc = tl.where(certified, 0, 1)
    tl.store(gval_ptr + row, out_gv)
    tl.store(gidx_ptr + row, out_gi)
    tl.store(lse_ptr + row, out_lse)
    tl.store(sx_ptr + row, out_sx)
    tl.store(unc_ptr + row, unc.to(tl.int8))
    tl.store(margin_ptr + row, margin)
    tl.store(rmax_ptr + row, rmax)
