"""Triton kernels of the decision (launched from :mod:`..decide`), one program per
request.

* ``_decide_kernel``: a stats-only step's merge and decision in one: merges the
  all-gathered ``[TP, rows, W]`` statistics of all its rows at once, runs the accept
  tests, finds the first rejection and writes vLLM's ``(sampled, num_sampled)``.
* ``_decide_merged_kernel``: the decision from the merged per-row statistics
  (:func:`..decide.decide_merged_torch`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..hashing import DOMAIN_ACCEPT
from .common import _LAUNCH_LOCK, _element_hash, _row_keys, _uniform

_DOM_ACCEPT = tl.constexpr(DOMAIN_ACCEPT)


@triton.jit
def _accept(seed_ptr, pos_ptr, rows, jm, jj, sx, lse, greedy, valid, tok, draft):
    """Acceptance of each draft row and its margin: greedy rows accept the argmax, sampled
    rows accept when ``log q_x - lse - log u > 0`` (``u`` from the row's accept noise; the
    margin is NaN for greedy rows)."""
    seed = tl.load(seed_ptr + rows, mask=jm, other=0)
    pos = tl.load(pos_ptr + rows, mask=jm, other=0)
    h1, h2 = _row_keys(seed, pos, _DOM_ACCEPT)
    u = _uniform(_element_hash(h1, h2, tl.zeros_like(jj)))
    margin = (sx - lse) - tl.log(u)
    acc = tl.where(greedy, valid & (tok == draft), valid & (margin > 0.0))
    return acc, tl.where(greedy, float("nan"), margin)


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
        acc, margin = _accept(seed_ptr, pos_ptr, rows, jm, jj, sx, lse, greedy, valid, tok,
                              draft)
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



@triton.jit
def _decide_merged_kernel(cu_ptr, draft_ptr, temp_ptr, seed_ptr, pos_ptr,
                          gidx_ptr, lse_ptr, sx_ptr, res_ptr, defer_ptr,
                          sampled_ptr, max_len, num_sampled_ptr, drow_ptr, margin_ptr,
                          stopped_ptr, vocab_size,
                          PROB: tl.constexpr, PLEN: tl.constexpr):
    req = tl.program_id(0)
    start = tl.load(cu_ptr + req)
    n = tl.load(cu_ptr + req + 1) - start
    jj = tl.arange(0, PLEN)
    jm = jj < n
    rows = start + jj
    draft = tl.load(draft_ptr + rows, mask=jm, other=-1)
    temp = tl.load(temp_ptr + rows, mask=jm, other=0.0)
    tok = tl.load(gidx_ptr + rows, mask=jm, other=-1)
    lse = tl.load(lse_ptr + rows, mask=jm, other=float("-inf"))
    sx = tl.load(sx_ptr + rows, mask=jm, other=float("-inf"))
    dfr = tl.load(defer_ptr + rows, mask=jm, other=0) != 0
    valid = (draft >= 0) & (draft < vocab_size)
    greedy = temp == 0.0
    acc, margin = _accept(seed_ptr, pos_ptr, rows, jm, jj, sx, lse, greedy, valid, tok, draft)
    acc = acc & (jj < n - 1) & ~dfr
    n_acc = tl.min(tl.where(jm, tl.where(acc, PLEN, jj), PLEN), axis=0)
    dec = start + n_acc
    stop = tl.sum(tl.where((jj == n_acc) & dfr & jm, 1, 0), axis=0) > 0
    dtok = tl.sum(tl.where(jj == n_acc, tok, 0), axis=0)
    if PROB:
        res = tl.load(res_ptr + rows, mask=jm, other=-1)
        use = (res >= 0) & valid & ~greedy
        dres = tl.sum(tl.where((jj == n_acc) & use, res, 0), axis=0)
        has = tl.sum(tl.where((jj == n_acc) & use, 1, 0), axis=0) > 0
        dtok = tl.where(has, dres, dtok)
    emitted = n_acc + tl.where(stop, 0, 1)
    out = tl.where(jj < n_acc, draft, tl.where((jj == n_acc) & ~stop, dtok, -1))
    tl.store(sampled_ptr + req * max_len + jj, out, mask=jj < max_len)
    tl.store(num_sampled_ptr + req, emitted.to(tl.int32))
    tl.store(drow_ptr + req, dec)
    tl.store(stopped_ptr + req, stop.to(tl.int8))
    tl.store(margin_ptr + rows, margin, mask=jm)
