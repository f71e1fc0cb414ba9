"""Triton kernels for :mod:`.kernels` (imported only when Triton is available).

* ``_stats_kernel`` (grid ``rows x splits``): each program streams one contiguous
  slice of its row's shard once, in ``BLOCK``-wide tiles, keeping an online
  log-sum-exp (running max and ``sum exp(s - max)``) and a running Gumbel-argmax
  (greedy rows: plain argmax) with left tie-break. With one split it writes the
  final ``[rows, 4]`` statistics, otherwise per-split partials that
  ``_combine_kernel`` (one program per row) merges.
* ``_decide_kernel`` (one program per request): merges the all-gathered
  ``[TP, rows, W]`` statistics of all its rows at once, runs the accept tests,
  finds the first rejection and writes vLLM's ``(sampled, num_sampled)``.

The row keys and the integer hash are those of :mod:`.hashing`, written with
``uint32`` wrap-around arithmetic (bit-identical to the masked int64 torch
version); they are derived in-kernel from ``(seed, position)``.
"""

from __future__ import annotations

import threading

import triton
import triton.language as tl

from .hashing import _H2_SALT, DOMAIN_ACCEPT, DOMAIN_GUMBEL, GOLDEN32, U_MAX

_GOLDEN = tl.constexpr(GOLDEN32)
_UMAX = tl.constexpr(U_MAX)
_C1 = tl.constexpr(0x7FEB352D)
_C2 = tl.constexpr(0x846CA68B)
_SALT = tl.constexpr(_H2_SALT)
_DOM_ACCEPT = tl.constexpr(DOMAIN_ACCEPT)
_DOM_GUMBEL = tl.constexpr(DOMAIN_GUMBEL)


@triton.jit
def _lowbias32(x):
    x = x ^ (x >> 16)
    x = x * tl.full((), _C1, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full((), _C2, tl.uint32)
    x = x ^ (x >> 16)
    return x


@triton.jit
def _absorb(h, k):
    return _lowbias32((h ^ k) + tl.full((), _GOLDEN, tl.uint32))


@triton.jit
def _row_keys(seed, pos, domain: tl.constexpr):
    """(h1, h2) of :func:`.hashing.row_keys` for int64 scalars ``seed``, ``pos``."""
    seed = seed.to(tl.int64)
    pos = pos.to(tl.int64)
    h = tl.full((), domain, tl.uint32)
    h = _absorb(h, (seed & 0xFFFFFFFF).to(tl.uint32))
    h = _absorb(h, ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
    h = _absorb(h, (pos & 0xFFFFFFFF).to(tl.uint32))
    h = _absorb(h, ((pos >> 32) & 0xFFFFFFFF).to(tl.uint32))
    h2 = _lowbias32(h ^ tl.full((), _SALT, tl.uint32))
    return h, h2


@triton.jit
def _element_hash(h1, h2, gid):
    x = h1 + gid.to(tl.uint32) * tl.full((), _GOLDEN, tl.uint32)
    x = _lowbias32(x)
    return _lowbias32(x ^ h2)


@triton.jit
def _uniform(x):
    hi16 = (x >> 16).to(tl.int32).to(tl.float32)
    lo16 = (x & 0xFFFF).to(tl.int32).to(tl.float32)
    u = hi16 * 1.52587890625e-05 + (lo16 + 0.5) * 2.3283064365386963e-10
    return tl.minimum(u, _UMAX)


@triton.jit
def _log1p(x):
    # Goldberg's accurate log1p from log (portable: no libdevice needed).
    w = 1.0 + x
    return tl.where(w == 1.0, x, tl.log(w) * (x / (w - 1.0)))


@triton.jit
def _gumbel(h1, h2, gid):
    u = _uniform(_element_hash(h1, h2, gid))
    return -tl.log(-_log1p(-u))


# bf16 order keys (shared by the round-1 and the escalation kernels)
@triton.jit
def _okey(z):
    """Ordered key in ``[0, 65536)`` of bf16 ``z``: the order of ``z`` (and of ``z / T`` for
    T > 0: distinct bf16 values stay distinct); ``-0.0`` keys as ``+0.0``."""
    b = z.to(tl.int16, bitcast=True).to(tl.int32)
    b = tl.where(b == -32768, 0, b)
    return (b ^ ((b >> 15) & 0x7FFF)) + 32768


@triton.jit
def _key_value(key, t):
    """``s = z / T`` of the bf16 value whose :func:`_okey` is ``key``."""
    o = key - 32768
    b = o ^ ((o >> 15) & 0x7FFF)
    z = b.to(tl.int16).to(tl.bfloat16, bitcast=True).to(tl.float32)
    return tl.div_rn(z, t)


@triton.jit
def hash_bits_kernel(out_ptr, seed_ptr, pos_ptr, n, BLOCK: tl.constexpr):
    """Debug kernel: raw 32-bit Gumbel-domain hash of tokens ``0..n-1`` per row."""
    r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    h1, h2 = _row_keys(tl.load(seed_ptr + r), tl.load(pos_ptr + r), _DOM_GUMBEL)
    x = _element_hash(h1, h2, cols)
    tl.store(out_ptr + r * n + cols, x.to(tl.int64), mask=cols < n)


@triton.jit
def _draft_col(draft_ptr, row, col_offset, n_valid):
    d = tl.load(draft_ptr + row).to(tl.int64)
    local = d - col_offset
    owned = (d >= 0) & (local >= 0) & (local < n_valid)
    return tl.where(owned, local, -1).to(tl.int32)


@triton.jit
def _kept(s, thr, col, lim):
    """The cut of :mod:`.cuts`: above the threshold, or tied with it up to column ``lim``."""
    return (s > thr) | ((s == thr) & (col <= lim))


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
    offs = tl.arange(0, PSPLIT)
    ok = offs < nsplit
    p = row * nsplit + offs
    m = tl.load(part_m_ptr + p, mask=ok, other=float("-inf"))
    se = tl.load(part_se_ptr + p, mask=ok, other=0.0)
    gv = tl.load(part_gv_ptr + p, mask=ok, other=float("-inf"))
    gi = tl.load(part_gi_ptr + p, mask=ok, other=0)
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


@triton.jit
def _decide_kernel(
    g_ptr,  # [TP, rows, W] float32, unit stride on the last dim
    rank_stride,
    row_stride,
    cu_ptr,  # [num_reqs + 1] int64
    draft_ptr,  # [rows] int64 (-1 on bonus rows / placeholders)
    temp_ptr,  # [rows] float32
    seed_ptr,  # [rows] int64
    pos_ptr,  # [rows] int64
    sampled_ptr,  # [num_reqs, max_len] int64
    max_len,
    num_sampled_ptr,  # [num_reqs] int32
    drow_ptr,  # [num_reqs] int64
    margin_ptr,  # [rows] float32
    vocab_size,
    TP: tl.constexpr,
    PTP: tl.constexpr,
    W: tl.constexpr,
    PLEN: tl.constexpr,
):
    """One program per request; all its rows x ranks are merged at once (no serial loop)."""
    req = tl.program_id(0)
    start = tl.load(cu_ptr + req)
    n = tl.load(cu_ptr + req + 1) - start
    jj = tl.arange(0, PLEN)
    jm = jj < n
    rows = start + jj
    ranks = tl.arange(0, PTP)
    m2 = jm[:, None] & (ranks < TP)[None, :]
    offs = ranks[None, :].to(tl.int64) * rank_stride + rows[:, None] * row_stride
    gv = tl.load(g_ptr + offs + 0, mask=m2, other=float("-inf"))
    gi = tl.load(g_ptr + offs + 1, mask=m2, other=float("inf"))
    best = tl.max(gv, axis=1)
    tokf = tl.min(tl.where(gv == best[:, None], gi, float("inf")), axis=1)
    tokf = tl.where(tokf == float("inf"), tl.min(gi, axis=1), tokf)
    tok = tokf.to(tl.int64)
    draft = tl.load(draft_ptr + rows, mask=jm, other=-1)
    temp = tl.load(temp_ptr + rows, mask=jm, other=0.0)
    valid = (draft >= 0) & (draft < vocab_size)
    greedy = temp == 0.0
    if W == 4:
        lse_r = tl.load(g_ptr + offs + 2, mask=m2, other=float("-inf"))
        sx = tl.max(tl.load(g_ptr + offs + 3, mask=m2, other=float("-inf")), axis=1)
        mx = tl.max(lse_r, axis=1)
        fin = mx > float("-inf")
        safe = tl.where(fin, mx, 0.0)
        tot = tl.sum(tl.where(lse_r > float("-inf"), tl.exp(lse_r - safe[:, None]), 0.0), axis=1)
        lse = tl.where(fin, safe + tl.log(tl.maximum(tot, 1e-30)), float("-inf"))
        seed = tl.load(seed_ptr + rows, mask=jm, other=0)
        pos = tl.load(pos_ptr + rows, mask=jm, other=0)
        h1, h2 = _row_keys(seed, pos, _DOM_ACCEPT)
        u = _uniform(_element_hash(h1, h2, tl.zeros_like(jj)))
        margin = (sx - lse) - tl.log(u)
        acc = tl.where(greedy, valid & (tok == draft), valid & (margin > 0.0))
        margin = tl.where(greedy, float("nan"), margin)
    else:
        margin = tl.full((PLEN,), float("nan"), tl.float32)
        acc = valid & (tok == draft)
    acc = acc & (jj < n - 1)
    # first rejection (the bonus row always "rejects")
    n_acc = tl.min(tl.where(jm, tl.where(acc, PLEN, jj), PLEN), axis=0)
    out = tl.where(jj < n_acc, draft, tl.where(jj == n_acc, tok, -1))
    tl.store(sampled_ptr + req * max_len + jj, out, mask=jj < max_len)
    tl.store(num_sampled_ptr + req, (n_acc + 1).to(tl.int32))
    tl.store(drow_ptr + req, start + n_acc)
    tl.store(margin_ptr + rows, margin, mask=jm)


#: Triton's CPU interpreter (TRITON_INTERPRET=1) patches ``triton.language`` globally for the
#: duration of a launch, so two threads launching at once (the threaded TP simulation in
#: ``testkit.verify_simulate``) break each other. Launches are serialised; the
#: uncontended lock costs nanoseconds on a GPU, where each rank is its own process anyway.
_LAUNCH_LOCK = threading.Lock()


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


def launch_decide(
    gathered,  # [TP, rows, 2 or 4] float32, unit last stride: the stats-only round
    cu,  # [reqs + 1] int64
    draft,  # [rows] int64
    temp,  # [rows] float32
    seeds,  # [rows] int64
    pos,  # [rows] int64
    sampled,  # [reqs, max_rows_per_req] int64 (written)
    num_sampled,  # [reqs] int32 (written)
    drow,  # [reqs] int64 (written)
    margin,  # [rows] float32 (written)
    vocab_size: int,
):
    tp, _, w = gathered.shape
    assert gathered.stride(2) == 1
    num_reqs = cu.shape[0] - 1
    with _LAUNCH_LOCK:
        _decide_kernel[(num_reqs,)](
            gathered, gathered.stride(0), gathered.stride(1), cu, draft, temp, seeds, pos,
            sampled, sampled.shape[1], num_sampled, drow, margin, vocab_size,
            TP=tp, PTP=triton.next_power_of_2(tp), W=w,
            PLEN=triton.next_power_of_2(sampled.shape[1]), num_warps=1,
        )
