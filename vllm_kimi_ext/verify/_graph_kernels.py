"""Triton kernels of :mod:`.graph_step`, the twins of :mod:`.step_torch` (imported only
when Triton is available).

* ``_cand_kernel`` (grid ``rows x splits``): each program loads one slice of its
  row's shard once and produces the slice's float64 sum-exp partial, its
  Gumbel-max (greedy rows: argmax) and its first ``W`` tokens in the order
  (value desc, id asc) as sortable int64 keys (one ``tl.sort``).
* ``_cand_merge_kernel`` (one program per row): combines the splits into the
  round-1 payload row: Gumbel-max, the shard log-sum-exp (float64 as two
  float32), ``s_x``, and the row's first ``W`` values and global ids.
* ``_merge_kernel`` (one program per row): the round-1 merge of
  :func:`.step_torch.merge_round1_torch` for one-hot drafts: candidates of all
  ranks sorted once, the min-p / top-k / top-p cut with its certificate, and the
  kept set's log-sum-exp, ``s_x`` and Gumbel-max (draft excluded).

Keys: ``ordered(value) * 2**32 + (2**31 - 1 - id)`` where ``ordered`` is the
order-preserving int32 image of the float32 value, so a descending sort gives
(value desc, id asc); ids are below ``2**24``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._escalate_kernels import escalate_one_hot_bf16
from ._triton_kernels import (
    _LAUNCH_LOCK,
    _draft_col,
    _element_hash,
    _gumbel,
    _key_value,
    _okey,
    _row_keys,
    _uniform,
)
from .hashing import DOMAIN_ACCEPT, DOMAIN_GUMBEL
from .kernels import shard_local_stats_triton
from .step_torch import Merged, _logq_at, constant, merge_round1_torch

_DOM_GUMBEL = tl.constexpr(DOMAIN_GUMBEL)
#: Launch shapes (measured on an H200: ``bench/kernels/bench_verify_graph.py``).
TUNE = {"split_small": 2048, "split_large": 2048, "small_rows": 16, "cand_warps": 8,
        "cand_merge_warps": 16, "merge_warps": 16}
_DOM_ACCEPT = tl.constexpr(DOMAIN_ACCEPT)
_SENT = tl.constexpr(-(2**63) + 1)


@triton.jit
def _key(s, gid):
    bits = s.to(tl.int32, bitcast=True)
    bits = tl.where(bits == -2147483648, 0, bits)  # -0.0 sorts as +0.0 (equal values)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return ordered.to(tl.int64) * 4294967296 + (2147483647 - gid.to(tl.int64))


@triton.jit
def _unkey(k):
    ordered = (k >> 32).to(tl.int32)
    bits = ordered ^ ((ordered >> 31) & 0x7FFFFFFF)
    val = bits.to(tl.float32, bitcast=True)
    gid = 2147483647 - (k & 0xFFFFFFFF)
    val = tl.where(k == _SENT, float("-inf"), val)
    gid = tl.where(k == _SENT, -1, gid)
    return val, gid


@triton.jit
def _key16(z, col):
    """int32 key of bf16 logits ``z`` at local column ``col`` (< 65536), sorting as
    (value, then column descending)."""
    return (_okey(z) - 32768) * 65536 + (65535 - col)


@triton.jit
def _unkey16(k, t):
    """``(z / T, local column)`` of int32 keys (``-inf, -1`` for the sentinel)."""
    sent = k == -2147483648
    v = _key_value((k >> 16) + 32768, t)
    return tl.where(sent, float("-inf"), v), tl.where(sent, -1, 65535 - (k & 0xFFFF))


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
    offs = tl.arange(0, PSPLIT)
    okp = offs < nsplit
    p = row * nsplit + offs
    m = tl.load(part_m_ptr + p, mask=okp, other=float("-inf"))
    se = tl.load(part_se_ptr + p, mask=okp, other=0.0)
    gv = tl.load(part_gv_ptr + p, mask=okp, other=float("-inf"))
    gi = tl.load(part_gi_ptr + p, mask=okp, other=0)
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


def round1_payload(
    logits_shard,  # [rows, S], the logits' dtype (bf16 / fp16 / fp32), unit column stride
    inp,  # StepInputs: int64 / float32 [rows] per-row tensors
    plan,  # StepPlan (host)
    col_offset: int,
    vocab_size: int,
    q_full,  # [rows, >= V] float32 draft probabilities, or None (one-hot drafts)
):
    """Triton version of :func:`.step_torch.round1_payload_torch`; returns
    ``[rows, plan.round1_width]`` float32."""
    R, S = logits_shard.shape
    dev = logits_shard.device
    n_valid = max(0, min(S, vocab_size - col_offset))
    exclude = q_full is None
    if plan.all_greedy:
        return shard_local_stats_triton(logits_shard, inp.temperature, None, inp.draft,
                                        inp.seeds, inp.positions, col_offset, vocab_size,
                                        exclude, 2)
    if logits_shard.stride(1) != 1:
        logits_shard = logits_shard.contiguous()
    W = plan.candidates
    # small batches: more, narrower splits (fill the SMs); large: fewer top-k selections
    C = max(TUNE["split_small"] if R <= TUNE["small_rows"] else TUNE["split_large"],
            triton.next_power_of_2(max(W, 1)))
    nsplit = max(1, -(-max(n_valid, 1) // C))
    KP = triton.next_power_of_2(max(W, 1))
    PK = max(triton.next_power_of_2(max(nsplit * W, 1)), KP)
    out = torch.empty((R, plan.round1_width), dtype=torch.float32, device=dev)
    k16 = logits_shard.dtype == torch.bfloat16 and S <= 65536
    pk = torch.empty((R, nsplit, max(W, 1)), dtype=torch.int32 if k16 else torch.int64,
                     device=dev)
    pm = torch.empty((R, nsplit), dtype=torch.float32, device=dev)
    pse = torch.empty((R, nsplit), dtype=torch.float64, device=dev)
    pgv = torch.empty_like(pm)
    pgi = torch.empty((R, nsplit), dtype=torch.int32, device=dev)
    temp = inp.temperature.contiguous()
    draft = inp.draft.contiguous()
    with _LAUNCH_LOCK:
        _cand_kernel[(R, nsplit)](logits_shard, logits_shard.stride(0), temp, draft,
                                  inp.seeds.contiguous(), inp.positions.contiguous(),
                                  pk, pm, pse, pgv, pgi, n_valid, col_offset, nsplit,
                                  EXCLUDE=exclude, C=C, W=W, KP=KP, K16=k16,
                                  num_warps=TUNE["cand_warps"])
    with _LAUNCH_LOCK:
        _cand_merge_kernel[(R,)](logits_shard, logits_shard.stride(0), temp, draft,
                                 pk, pm, pse, pgv, pgi, out, out.stride(0), n_valid, col_offset,
                                 nsplit, PSPLIT=triton.next_power_of_2(nsplit),
                                 PK=PK, W=W, KP=KP, K16=k16,
                                 num_warps=TUNE["cand_merge_warps"])
    if q_full is not None:
        out[:, 4] -= _logq_at(q_full, inp.draft[:, None], vocab_size)[:, 0]
    return out


@triton.jit
def _merge_kernel(g_ptr, rank_stride, row_stride, rank_valid_ptr,
                  temp_ptr, topk_ptr, minp_ptr, topp_ptr, draft_ptr, seed_ptr, pos_ptr,
                  gval_ptr, gidx_ptr, lse_ptr, sx_ptr, unc_ptr, margin_ptr, rmax_ptr,
                  TP: tl.constexpr, PTP: tl.constexpr, W: tl.constexpr, PN: tl.constexpr):
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


def merge_round1(
    g,  # [TP, rows, round1_width] float32, the gathered round-1 payloads
    inp,  # StepInputs
    plan,  # StepPlan (host)
    vocab_size: int,
    rank_valid,  # [TP] int64: valid columns of each rank's shard
    q_full,  # [rows, >= V] float32 or None
):
    """Triton version of :func:`.step_torch.merge_round1_torch` (probabilistic drafts and
    all-greedy steps use the torch merge: their merge is a handful of ops)."""
    if q_full is not None or plan.all_greedy:
        return merge_round1_torch(g, inp, plan, vocab_size, rank_valid, q_full)
    TP, R, P1 = g.shape
    if g.stride(2) != 1:
        g = g.contiguous()
    dev = g.device
    gval = torch.empty(R, dtype=torch.float32, device=dev)
    gidx = torch.empty(R, dtype=torch.int64, device=dev)
    lse = torch.empty_like(gval)
    sx = torch.empty_like(gval)
    unc = torch.empty(R, dtype=torch.int8, device=dev)
    margin = torch.empty(R, dtype=torch.float64, device=dev)
    rmax = torch.empty_like(gval)
    W = max(plan.candidates, 1)
    with _LAUNCH_LOCK:
        _merge_kernel[(R,)](g, g.stride(0), g.stride(1), rank_valid.contiguous(),
                            inp.temperature.contiguous(), inp.top_k.contiguous(),
                            inp.min_p.contiguous(), inp.top_p.contiguous(),
                            inp.draft.contiguous(), inp.seeds.contiguous(),
                            inp.positions.contiguous(),
                            gval, gidx, lse, sx, unc, margin, rmax,
                            TP=TP, PTP=triton.next_power_of_2(TP), W=W,
                            PN=triton.next_power_of_2(TP * W),
                            num_warps=TUNE["merge_warps"])
    # int8 flags throughout the Triton path (no conversion launches); read-only "-1" ids
    return Merged(gval, gidx, lse, sx, constant(R, -1, torch.int64, dev), unc, margin, None,
                  rmax)


# ---------------------------------------------------------------------------
# decision (one program per request) and the exact cut of escalated rows
# ---------------------------------------------------------------------------
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
    seed = tl.load(seed_ptr + rows, mask=jm, other=0)
    pos = tl.load(pos_ptr + rows, mask=jm, other=0)
    h1, h2 = _row_keys(seed, pos, _DOM_ACCEPT)
    u = _uniform(_element_hash(h1, h2, tl.zeros_like(jj)))
    margin = (sx - lse) - tl.log(u)
    acc = tl.where(greedy, valid & (tok == draft), valid & (margin > 0.0))
    margin = tl.where(greedy, float("nan"), margin)
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


def decide_merged(
    merged,  # Merged: [rows] gval float32, gidx int64, lse float32, sx float32, res_tok int64
    deferred,  # [rows] int8 / bool
    inp,  # StepInputs
    plan,  # StepPlan (host)
    vocab_size: int,
):
    """Triton version of :func:`.step_torch.decide_merged_torch`; returns ``(sampled
    [reqs, max_rows_per_req] int64, num_sampled [reqs] int32, decision_row [reqs] int64,
    accept_margin [rows] float32, stopped [reqs] int8)``."""
    dev = merged.gidx.device
    Q, Lmax = plan.num_reqs, plan.max_rows_per_req
    sampled = torch.empty((Q, Lmax), dtype=torch.int64, device=dev)
    num_sampled = torch.empty(Q, dtype=torch.int32, device=dev)
    drow = torch.empty(Q, dtype=torch.int64, device=dev)
    stopped = torch.empty(Q, dtype=torch.int8, device=dev)
    margin = torch.empty(plan.num_rows, dtype=torch.float32, device=dev)
    with _LAUNCH_LOCK:
        _decide_merged_kernel[(Q,)](
            inp.cu_num_rows, inp.draft, inp.temperature, inp.seeds, inp.positions,
            merged.gidx, merged.lse, merged.sx, merged.res_tok, deferred.to(torch.int8),
            sampled, Lmax, num_sampled, drow, margin, stopped, vocab_size,
            PROB=plan.probabilistic, PLEN=triton.next_power_of_2(Lmax), num_warps=1)
    return sampled, num_sampled, drow, margin, stopped


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


def escalate_one_hot(
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
    TP, E, S = g.shape
    if g.dtype == torch.bfloat16 and merged.row_max is not None and store is not None:
        return escalate_one_hot_bf16(g, idx, real, inp, merged, vocab_size, deferred, store)
    if g.stride(2) != 1:
        g = g.contiguous()
    k16 = g.dtype == torch.bfloat16
    wbuf = torch.empty((E, vocab_size), dtype=torch.float64, device=g.device)
    kbuf = torch.empty((E, vocab_size), dtype=torch.int32, device=g.device)
    with _LAUNCH_LOCK:
        _escalate_kernel[(E,)](g, g.stride(0), g.stride(1), S, vocab_size, idx,
                               real, inp.temperature, inp.min_p, inp.top_p,
                               inp.draft, inp.seeds, inp.positions, merged.gval, merged.gidx,
                               merged.lse, merged.sx, merged.nucleus_margin, deferred,
                               wbuf, kbuf, BLOCK=8192, K16=k16, num_warps=16)
    return deferred
