"""Triton kernels of round 1's shard pass (launched from :mod:`..shard_stats` and
:mod:`..stats`).

* ``_stats_kernel`` (grid ``rows x splits``): each program streams one contiguous
  slice of its row's shard once, in ``BLOCK``-wide tiles, keeping an online
  log-sum-exp (running max and ``sum exp(s - max)``) and a running Gumbel-argmax
  (greedy rows: plain argmax) with left tie-break. With one split it writes the
  final ``[rows, 4]`` statistics, otherwise per-split partials that
  ``_combine_kernel`` (one program per row) merges.
* ``_cand_kernel`` (grid ``rows x splits``): each program loads one slice of its
  row's shard once and produces the slice's float64 sum-exp partial, its
  Gumbel-max (greedy rows: argmax) and its first ``W`` tokens in the order
  (value desc, id asc) as sortable keys (one ``tl.sort``).
* ``_cand_merge_kernel`` (one program per row): combines the splits into the
  round-1 payload row: Gumbel-max, the shard log-sum-exp (float64 as two
  float32), ``s_x``, and the row's first ``W`` values and global ids.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..hashing import DOMAIN_GUMBEL
from .common import (
    _LAUNCH_LOCK,
    _SENT,
    _draft_col,
    _gumbel,
    _kept,
    _key,
    _key16,
    _row_keys,
    _unkey,
    _unkey16,
)

_DOM_GUMBEL = tl.constexpr(DOMAIN_GUMBEL)



@triton.jit
def _load_parts(part_m_ptr, part_se_ptr, part_gv_ptr, part_gi_ptr, row, nsplit,
                PSPLIT: tl.constexpr):
    """One row's per-split partials (max, sum of exp, Gumbel-max value and column), padded to
    ``PSPLIT`` with the neutral element of each combine."""
    offs = tl.arange(0, PSPLIT)
    ok = offs < nsplit
    p = row * nsplit + offs
    m = tl.load(part_m_ptr + p, mask=ok, other=float("-inf"))
    se = tl.load(part_se_ptr + p, mask=ok, other=0.0)
    gv = tl.load(part_gv_ptr + p, mask=ok, other=float("-inf"))
    gi = tl.load(part_gi_ptr + p, mask=ok, other=0)
    return offs, m, se, gv, gi


@triton.jit
def _stats_kernel(
    logits_ptr,
    logits_stride,
    temp_ptr,
    thr_ptr,
    lim_ptr,
    draft_ptr,
    seed_ptr,
    pos_ptr,
    part_m_ptr,
    part_se_ptr,
    part_gv_ptr,
    part_gi_ptr,
    out_ptr,
    n_valid,
    col_offset,
    chunk,
    nsplit,
    HAS_THR: tl.constexpr,
    EXCLUDE: tl.constexpr,
    SINGLE: tl.constexpr,
    BLOCK: tl.constexpr,
    W: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    temp = tl.load(temp_ptr + row)
    is_sampling = temp != 0.0
    safe_t = tl.where(is_sampling, temp, 1.0)
    thr = float("-inf")
    lim = n_valid
    if HAS_THR:
        thr = tl.load(thr_ptr + row)
        lim = tl.load(lim_ptr + row)
    dcol = _draft_col(draft_ptr, row, col_offset, n_valid)  # -1 if not owned
    lo = split * chunk
    hi = tl.minimum(lo + chunk, n_valid)
    base = logits_ptr + row * logits_stride
    m = tl.full((), float("-inf"), tl.float32)
    se = tl.zeros((), tl.float32)
    best_v = tl.full((), float("-inf"), tl.float32)
    best_i = lo
    if is_sampling:
        h1, h2 = _row_keys(tl.load(seed_ptr + row), tl.load(pos_ptr + row), _DOM_GUMBEL)
        for start in range(lo, hi, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            ok = cols < hi
            z = tl.load(base + cols, mask=ok, other=float("-inf")).to(tl.float32)
            s = tl.div_rn(z, safe_t)
            if HAS_THR:
                ok = ok & _kept(s, thr, cols, lim)
            s = tl.where(ok, s, float("-inf"))
            # online log-sum-exp
            bm = tl.max(s, axis=0)
            m_new = tl.maximum(m, bm)
            fin = m_new > float("-inf")
            scale = tl.where(fin, tl.exp(m - m_new), 0.0)
            add = tl.where(fin, tl.sum(tl.exp(s - m_new), axis=0), 0.0)
            se = se * scale + add
            m = m_new
            # Gumbel-max over the shard (draft column excluded for one-hot residuals)
            g = _gumbel(h1, h2, cols + col_offset)
            keep = s > float("-inf")
            if EXCLUDE:
                keep = keep & (cols != dcol)
            sc = tl.where(keep, s + g, float("-inf"))
            bv, bi = tl.max(sc, axis=0, return_indices=True, return_indices_tie_break_left=True)
            if bv > best_v:
                best_v = bv
                best_i = start + bi
    else:
        for start in range(lo, hi, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            ok = cols < hi
            z = tl.load(base + cols, mask=ok, other=float("-inf")).to(tl.float32)
            bv, bi = tl.max(z, axis=0, return_indices=True, return_indices_tie_break_left=True)
            if bv > best_v:
                best_v = bv
                best_i = start + bi
    if SINGLE:
        lse = tl.where(m > float("-inf"), m + tl.log(tl.maximum(se, 1e-30)), float("-inf"))
        lse = tl.where(is_sampling, lse, float("-inf"))
        sx = tl.full((), float("-inf"), tl.float32)
        if (dcol >= 0) & is_sampling:
            zx = tl.load(base + dcol).to(tl.float32)
            sx = tl.div_rn(zx, safe_t)
            if HAS_THR:
                sx = tl.where(_kept(sx, thr, dcol, lim), sx, float("-inf"))
        tl.store(out_ptr + row * W + 0, best_v)
        tl.store(out_ptr + row * W + 1, (best_i + col_offset).to(tl.float32))
        if W == 4:
            tl.store(out_ptr + row * W + 2, lse)
            tl.store(out_ptr + row * W + 3, sx)
    else:
        p = row * nsplit + split
        tl.store(part_m_ptr + p, m)
        tl.store(part_se_ptr + p, se)
        tl.store(part_gv_ptr + p, best_v)
        tl.store(part_gi_ptr + p, best_i)



@triton.jit
def _combine_kernel(
    logits_ptr,
    logits_stride,
    temp_ptr,
    thr_ptr,
    lim_ptr,
    draft_ptr,
    part_m_ptr,
    part_se_ptr,
    part_gv_ptr,
    part_gi_ptr,
    out_ptr,
    n_valid,
    col_offset,
    nsplit,
    HAS_THR: tl.constexpr,
    PSPLIT: tl.constexpr,
    W: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    temp = tl.load(temp_ptr + row)
    is_sampling = temp != 0.0
    safe_t = tl.where(is_sampling, temp, 1.0)
    thr = float("-inf")
    lim = n_valid
    if HAS_THR:
        thr = tl.load(thr_ptr + row)
        lim = tl.load(lim_ptr + row)
    offs, m, se, gv, gi = _load_parts(part_m_ptr, part_se_ptr, part_gv_ptr, part_gi_ptr, row,
                                      nsplit, PSPLIT)
    big_m = tl.max(m, axis=0)
    fin = big_m > float("-inf")
    safe_m = tl.where(fin, big_m, 0.0)
    tot = tl.sum(tl.where(m > float("-inf"), se * tl.exp(m - safe_m), 0.0), axis=0)
    lse = tl.where(fin, big_m + tl.log(tl.maximum(tot, 1e-30)), float("-inf"))
    lse = tl.where(is_sampling, lse, float("-inf"))
    # Splits are in column order: the left tie-break keeps the lowest token id.
    bv, bs = tl.max(gv, axis=0, return_indices=True, return_indices_tie_break_left=True)
    bi = tl.sum(tl.where(offs == bs, gi, 0), axis=0)
    dcol = _draft_col(draft_ptr, row, col_offset, n_valid)
    sx = tl.full((), float("-inf"), tl.float32)
    if (dcol >= 0) & is_sampling:
        zx = tl.load(logits_ptr + row * logits_stride + dcol).to(tl.float32)
        sx = tl.div_rn(zx, safe_t)
        if HAS_THR:
            sx = tl.where(_kept(sx, thr, dcol, lim), sx, float("-inf"))
    tl.store(out_ptr + row * W + 0, bv)
    tl.store(out_ptr + row * W + 1, (bi + col_offset).to(tl.float32))
    if W == 4:
        tl.store(out_ptr + row * W + 2, lse)
        tl.store(out_ptr + row * W + 3, sx)



def launch_stats(
    logits_shard,  # [rows, S] the logits' dtype, unit column stride
    temp,  # [rows] float32 (0 = greedy)
    thr,  # [rows] float32 cut on z / T (read only with has_thr)
    lim,  # [rows] int64 tie column at the cut (read only with has_thr)
    draft,  # [rows] int64 (-1: none)
    seeds,  # [rows] int64
    pos,  # [rows] int64
    out,  # [rows, width] float32 (written)
    parts,  # None, or 4 x [rows, splits] (float32 x 3, int32) split partials
    n_valid: int, col_offset: int, chunk: int, splits: int, has_thr: bool, exclude: bool,
    block: int, num_warps: int, width: int,
):
    R = logits_shard.shape[0]
    single = splits == 1
    if single:
        pm = pse = pgv = out
        pgi = draft
    else:
        pm, pse, pgv, pgi = parts
    with _LAUNCH_LOCK:
        _stats_kernel[(R, splits)](
            logits_shard, logits_shard.stride(0), temp, thr, lim, draft, seeds, pos,
            pm, pse, pgv, pgi, out,
            n_valid, col_offset, chunk, splits,
            HAS_THR=has_thr, EXCLUDE=exclude, SINGLE=single, BLOCK=block, W=width,
            num_warps=num_warps,
        )
    if not single:
        with _LAUNCH_LOCK:
            _combine_kernel[(R,)](
                logits_shard, logits_shard.stride(0), temp, thr, lim, draft, pm, pse, pgv, pgi,
                out, n_valid, col_offset, splits,
                HAS_THR=has_thr, PSPLIT=triton.next_power_of_2(splits), W=width, num_warps=1,
            )



@triton.jit
def _cand_kernel(logits_ptr, logits_stride, temp_ptr, draft_ptr, seed_ptr, pos_ptr,
                 part_keys_ptr, part_m_ptr, part_se_ptr, part_gv_ptr, part_gi_ptr,
                 n_valid, col_offset, nsplit,
                 EXCLUDE: tl.constexpr, C: tl.constexpr, W: tl.constexpr, KP: tl.constexpr,
                 K16: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    temp = tl.load(temp_ptr + row)
    sampling = temp != 0.0
    safe_t = tl.where(sampling, temp, 1.0)
    cols = split * C + tl.arange(0, C)
    ok = cols < n_valid
    z = tl.load(logits_ptr + row * logits_stride + cols, mask=ok, other=float("-inf"))
    s = tl.where(ok, tl.div_rn(z.to(tl.float32), safe_t), float("-inf"))
    m = tl.max(s, axis=0)
    fin = m > float("-inf")
    safe_m = tl.where(fin, m, 0.0).to(tl.float64)
    e = tl.where(s > float("-inf"), tl.exp(s.to(tl.float64) - safe_m), 0.0)
    se = tl.sum(e, axis=0)
    dcol = _draft_col(draft_ptr, row, col_offset, n_valid)
    if sampling:
        h1, h2 = _row_keys(tl.load(seed_ptr + row), tl.load(pos_ptr + row), _DOM_GUMBEL)
        g = _gumbel(h1, h2, cols + col_offset)
        keep = s > float("-inf")
        if EXCLUDE:
            keep = keep & (cols != dcol)
        sc = tl.where(keep, s + g, float("-inf"))
    else:
        sc = s
    bv, bi = tl.max(sc, axis=0, return_indices=True, return_indices_tie_break_left=True)
    p = row * nsplit + split
    tl.store(part_m_ptr + p, m)
    tl.store(part_se_ptr + p, se)
    tl.store(part_gv_ptr + p, bv)
    tl.store(part_gi_ptr + p, (split * C + bi).to(tl.int32))
    if W > 0:
        if K16:
            keys = tl.where(ok, _key16(z, cols), -2147483648)
        else:
            keys = tl.where(ok, _key(s, cols + col_offset), _SENT)
        top = tl.topk(keys, KP)
        offs = tl.arange(0, KP)
        tl.store(part_keys_ptr + p * W + offs, top, mask=offs < W)



@triton.jit
def _cand_merge_kernel(logits_ptr, logits_stride, temp_ptr, draft_ptr,
                       part_keys_ptr, part_m_ptr, part_se_ptr, part_gv_ptr, part_gi_ptr,
                       out_ptr, out_stride, n_valid, col_offset, nsplit,
                       PSPLIT: tl.constexpr, PK: tl.constexpr, W: tl.constexpr,
                       KP: tl.constexpr, K16: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    temp = tl.load(temp_ptr + row)
    sampling = temp != 0.0
    safe_t = tl.where(sampling, temp, 1.0)
    offs, m, se, gv, gi = _load_parts(part_m_ptr, part_se_ptr, part_gv_ptr, part_gi_ptr, row,
                                      nsplit, PSPLIT)
    big = tl.max(m, axis=0)
    fin = big > float("-inf")
    safe = tl.where(fin, big, 0.0).to(tl.float64)
    tot = tl.sum(tl.where(m > float("-inf"), se * tl.exp(m.to(tl.float64) - safe), 0.0), axis=0)
    lse = tl.where(fin, safe + tl.log(tl.maximum(tot, 1e-300)), float("-inf"))
    lse = tl.where(sampling, lse, float("-inf"))
    hi = lse.to(tl.float32)
    lo = tl.where(hi > float("-inf"), (lse - hi.to(tl.float64)).to(tl.float32), 0.0)
    bv, bs = tl.max(gv, axis=0, return_indices=True, return_indices_tie_break_left=True)
    bi = tl.sum(tl.where(offs == bs, gi, 0), axis=0)
    dcol = _draft_col(draft_ptr, row, col_offset, n_valid)
    sx = tl.full((), float("-inf"), tl.float32)
    if (dcol >= 0) & sampling:
        zx = tl.load(logits_ptr + row * logits_stride + dcol).to(tl.float32)
        sx = tl.div_rn(zx, safe_t)
    base = out_ptr + row * out_stride
    tl.store(base + 0, bv)
    tl.store(base + 1, (bi + col_offset).to(tl.float32))
    tl.store(base + 2, hi)
    tl.store(base + 3, lo)
    tl.store(base + 4, sx)
    if W > 0:
        ko = tl.arange(0, PK)
        if K16:
            keys = tl.load(part_keys_ptr + row * nsplit * W + ko, mask=ko < nsplit * W,
                           other=-2147483648)
            top = tl.topk(keys, KP)
            val, lcol = _unkey16(top, safe_t)
            gid = tl.where(lcol >= 0, lcol + col_offset, -1)
        else:
            keys = tl.load(part_keys_ptr + row * nsplit * W + ko, mask=ko < nsplit * W,
                           other=_SENT)
            top = tl.topk(keys, KP)
            val, gid = _unkey(top)
        kk = tl.arange(0, KP)
        tl.store(base + 5 + kk, val, mask=kk < W)
        tl.store(base + 5 + W + kk, gid.to(tl.float32), mask=kk < W)
