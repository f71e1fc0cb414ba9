"""The torch twins of the verification step's stages (any device; the CPU tier runs them).

Round 1's shard pass (:func:`round1_payload_torch`) and merge
(:func:`merge_round1_torch`), the escalation's slot picking (:func:`pick_slots`) and
whole-row cut (:func:`exact_cut`, :func:`escalate_torch`), the decision
(:func:`decide_merged_torch`) and the residual round's shard pass. Each is the
readable reference of a Triton kernel in :mod:`._graph_kernels` /
:mod:`._escalate_kernels` with the same contract; :class:`.graph_step.GraphVerifyStep`
picks one implementation per step (:func:`.ranks.use_triton`). Nothing here reads a
device value on the host, so every function can run inside CUDA-graph capture.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .hashing import DOMAIN_GUMBEL, accept_uniform, element_hash, gumbel_from_bits, row_keys
from .kernels import merge_argmax, shard_local_stats
from .protocol import STAT_COLUMNS, StepPlan
from .ranks import AllGather
from .rowmath import (
    exclusive_cumsum,
    min_p_threshold,
    nucleus_margin,
    residual_log_weights,
    scale_logits,
)
from .step_io import StepInputs

NEG_INF = float("-inf")

#: float32 columns carrying the shard log-sum-exp (float64 split as hi + lo).
LSE_COLUMNS = 2


# ---------------------------------------------------------------------------
# shared helpers
# ---------------------------------------------------------------------------
def local_top(s: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """First ``width`` entries of each row in the order (value desc, column asc).

    Returns ``(values [n, width] float32, columns [n, width] int64)``; rows with
    fewer columns are padded with ``(-inf, -1)``. One ``topk`` over an int64 key:
    an order-preserving integer image of the float32 value in the high 32 bits
    and the reversed column in the low bits, so equal values come out lowest
    column first (``torch.topk`` alone leaves the order of ties unspecified).
    """
    n, S = s.shape
    w = min(width, S)
    bits = (s.float() + 0.0).contiguous().view(torch.int32)  # + 0.0: -0.0 -> +0.0
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    rev_col = (S - 1) - torch.arange(S, device=s.device, dtype=torch.int64)
    key = ordered.to(torch.int64) * (1 << 32) + rev_col[None, :]
    top = torch.topk(key, w, dim=1).values
    cols = (S - 1) - (top - (top >> 32) * (1 << 32))
    vals = s.float().gather(1, cols)
    if w < width:
        vals = torch.cat([vals, vals.new_full((n, width - w), NEG_INF)], dim=1)
        cols = torch.cat([cols, cols.new_full((n, width - w), -1)], dim=1)
    return vals, cols


def split_float64(x: torch.Tensor) -> torch.Tensor:
    """float64 ``[n]`` -> float32 ``[n, 2]`` (hi, lo) with ``hi + lo == x`` to ~1e-15."""
    hi = x.to(torch.float32)
    lo = torch.where(torch.isfinite(hi), (x - hi.double()).to(torch.float32),
                     torch.zeros_like(hi))
    return torch.stack([hi, lo], dim=1)


def join_float64(hi_lo: torch.Tensor) -> torch.Tensor:
    return hi_lo[..., 0].double() + hi_lo[..., 1].double()


_CONSTANTS: dict = {}


def constant(n: int, value, dtype: torch.dtype, device) -> torch.Tensor:
    """A cached read-only ``[n]`` tensor filled with ``value``, made on first use (the
    eager warm-up, before any capture): a captured step reads it with no fill launch."""
    key = (n, value if value == value else "nan", dtype, str(device))
    if key not in _CONSTANTS:
        _CONSTANTS[key] = torch.full((n,), value, dtype=dtype, device=device)
    return _CONSTANTS[key]


def _logq_at(q_full: torch.Tensor | None, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """log q at ids ``[rows, n]`` (0 where ``q_full`` is None: one-hot drafts)."""
    if q_full is None:
        return torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
    q = q_full[:, :vocab_size].float().gather(1, ids.clamp(0, vocab_size - 1))
    return torch.log(q)


def _gumbel_at(seeds: torch.Tensor, positions: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Gumbel noise of global ``ids [rows, n]`` (the reference's numbers)."""
    h1, h2 = row_keys(seeds, positions, DOMAIN_GUMBEL)
    return gumbel_from_bits(element_hash(h1[:, None], h2[:, None], ids.clamp(min=0)))


def _argmax_lowest_id(score: torch.Tensor, ids: torch.Tensor):
    """Best score per row and the lowest id among entries attaining it."""
    best = score.max(dim=1).values
    big = torch.iinfo(torch.int64).max
    tok = torch.where(score == best[:, None], ids, torch.full_like(ids, big)).min(dim=1).values
    return best, torch.where(tok == big, torch.full_like(tok, -1), tok)


# ---------------------------------------------------------------------------
# round 1: the shard pass (torch; Triton in _graph_kernels)
# ---------------------------------------------------------------------------
def round1_payload_torch(logits_shard: torch.Tensor, inp: StepInputs, plan: StepPlan,
                         col_offset: int, vocab_size: int,
                         q_full: torch.Tensor | None) -> torch.Tensor:
    """This rank's round-1 payload ``[rows, plan.round1_width]`` float32."""
    R, S = logits_shard.shape
    dev = logits_shard.device
    n_valid = max(0, min(S, vocab_size - col_offset))
    exclude = q_full is None
    st = shard_local_stats(logits_shard, inp.temperature, None, inp.draft, inp.seeds,
                           inp.positions, col_offset, vocab_size, exclude_draft=exclude,
                           backend="torch", width=4)
    if plan.all_greedy:
        return st[:, :2].contiguous()
    out = torch.full((R, plan.round1_width), NEG_INF, dtype=torch.float32, device=dev)
    out[:, :2] = st[:, :2]
    s = scale_logits(logits_shard, inp.temperature)
    cols = torch.arange(S, device=dev)
    s = s.masked_fill((cols >= n_valid)[None, :], NEG_INF)
    sampling = inp.temperature > 0
    lse = torch.logsumexp(s.double(), dim=1)
    lse = torch.where(sampling, lse, torch.full_like(lse, NEG_INF))
    out[:, 2:2 + LSE_COLUMNS] = split_float64(lse)
    sx = st[:, 3]
    if q_full is not None:
        sx = sx - _logq_at(q_full, inp.draft[:, None], vocab_size)[:, 0]
    out[:, 4] = sx
    W = plan.candidates
    if W:
        vals, lcols = local_top(s, W)
        ok = (lcols >= 0) & (vals > NEG_INF)
        out[:, STAT_COLUMNS:STAT_COLUMNS + W] = torch.where(ok, vals, NEG_INF)
        gid = torch.where(ok, lcols + col_offset, torch.full_like(lcols, -1))
        out[:, STAT_COLUMNS + W:] = gid.to(torch.float32)
    return out


# ---------------------------------------------------------------------------
# round 1: the merge (identical on every rank)
# ---------------------------------------------------------------------------
@dataclass
class Merged:
    """Per-row merged statistics, the input of the decision."""

    gval: torch.Tensor  # float32: best Gumbel score (sampling) / max (greedy)
    gidx: torch.Tensor  # int64: its token
    lse: torch.Tensor  # float32: log-sum-exp of the kept set
    sx: torch.Tensor  # float32: s_x - log q(x) if x is kept, else -inf
    res_tok: torch.Tensor  # int64: residual sample (probabilistic drafts), -1 if none
    uncertified: torch.Tensor  # bool
    nucleus_margin: torch.Tensor  # float64
    #: int64: size of the kept set (rows with a cut; -1 elsewhere). Diagnostic only.
    n_kept: torch.Tensor | None = None
    #: float32: the row's maximum of ``z / T`` (rows with a cut; read by the split
    #: escalation and the histogram escalation).
    row_max: torch.Tensor | None = None


def merge_round1_torch(g: torch.Tensor, inp: StepInputs, plan: StepPlan, vocab_size: int,
                       rank_valid: torch.Tensor, q_full: torch.Tensor | None) -> Merged:
    """Merge ``g [TP, rows, width]`` (every rank computes the same result).

    Long because: it is the readable reference of ``_graph_kernels._merge_kernel`` and keeps
    the kernel's steps in the kernel's order (statistics, candidate sort, exact prefix, cut,
    certificate, kept-set decisions), so the two can be compared line by line."""
    TP, R, _ = g.shape
    dev = g.device
    best, tok = merge_argmax(g[..., 0], g[..., 1])
    nan64 = torch.full((R,), float("nan"), dtype=torch.float64, device=dev)
    none = torch.full((R,), -1, dtype=torch.int64, device=dev)
    no = torch.zeros(R, dtype=torch.bool, device=dev)
    if plan.all_greedy:
        neg = torch.full((R,), NEG_INF, device=dev)
        return Merged(best, tok, neg, neg, none, no, nan64, none)
    lse_all = torch.logsumexp(join_float64(g[..., 2:2 + LSE_COLUMNS]), dim=0)
    sx = g[..., 4].max(dim=0).values
    merged = Merged(best, tok, lse_all.float(), sx, none, no, nan64, none)
    W = plan.candidates
    if not W:
        return merged
    vals = g[..., STAT_COLUMNS:STAT_COLUMNS + W]  # [TP, R, W]
    gids = g[..., STAT_COLUMNS + W:].round().long()
    flat = vals.permute(1, 0, 2).reshape(R, TP * W)
    fid = gids.permute(1, 0, 2).reshape(R, TP * W)
    # rank-major and each rank in (value desc, id asc): a stable sort on the value
    # gives (value desc, id asc) because ranks own increasing id ranges.
    sv, order = torch.sort(flat, dim=1, descending=True, stable=True)
    sid = fid.gather(1, order)
    pos = torch.arange(TP * W, device=dev)
    finite = sv > NEG_INF
    inv = torch.empty_like(order)
    inv.scatter_(1, order, pos.expand(R, -1).contiguous())
    last_pos = inv[:, torch.arange(TP, device=dev) * W + (W - 1)]  # [R, TP]
    full = (vals[:, :, W - 1].T > NEG_INF) & ~(W >= rank_valid)[None, :]
    unbounded = TP * W + 1
    exact_len = torch.where(full, last_pos + 1,
                            torch.full_like(last_pos, unbounded)).min(dim=1).values
    k, mp, tp = inp.top_k, inp.min_p, inp.top_p.double()
    cutv = min_p_threshold(sv[:, 0], mp)
    n_minp = ((sv >= cutv[:, None]) & finite).sum(dim=1)
    has_k = k > 0
    n_kept = torch.where(has_k, torch.minimum(n_minp, k), n_minp)
    bounded = has_k | (mp > 0)
    nucleus = tp < 1
    # top-p over the candidate set (bounded: the min-p/top-k prefix; else every token,
    # normalised by the shard log-sum-exps)
    cand = torch.where(bounded[:, None], pos[None, :] < n_kept[:, None], finite)
    w = torch.where(cand, sv.double(), torch.full_like(sv, NEG_INF, dtype=torch.float64))
    norm = torch.where(bounded, torch.logsumexp(w, dim=1), lse_all)
    prob = torch.exp(w - norm[:, None])
    before, cum = exclusive_cumsum(prob)
    n_nuc = ((before < tp[:, None]) & cand).sum(dim=1).clamp(min=1)
    through = cum.gather(1, (n_nuc - 1)[:, None]).squeeze(1)
    walk_ok = (exact_len == unbounded) | ((through >= tp) & (n_nuc <= exact_len))
    known = has_k | (n_minp < exact_len)
    cert_p = torch.where(bounded, known, walk_ok)
    certified = torch.where(nucleus, cert_p, known)
    n_kept = torch.where(nucleus, n_nuc, n_kept)
    margin = torch.where(nucleus, nucleus_margin(before, cum, tp, n_nuc), nan64)
    kept = (pos[None, :] < n_kept[:, None]) & finite
    x = inp.draft
    is_x = (sid == x[:, None]) & (x[:, None] >= 0)
    lse_c = torch.logsumexp(torch.where(kept, sv, NEG_INF), dim=1)
    sx_c = torch.where(kept & is_x, sv, NEG_INF).max(dim=1).values
    noise = _gumbel_at(inp.seeds, inp.positions, sid)
    if q_full is None:
        score = torch.where(kept & ~is_x, sv + noise, NEG_INF)
        res_tok = none
    else:
        logq = _logq_at(q_full, sid, vocab_size)
        sx_c = sx_c - _logq_at(q_full, x[:, None], vocab_size)[:, 0]
        score = torch.where(kept, sv + noise, NEG_INF)
        res = residual_log_weights(sv - lse_c[:, None], logq)
        rbest, rtok = _argmax_lowest_id(torch.where(kept, res + noise, NEG_INF), sid)
        res_tok = torch.where(rbest > NEG_INF, rtok, none)
    cbest, ctok = _argmax_lowest_id(score, sid)
    has_cut = (inp.temperature > 0) & (has_k | (mp > 0) | nucleus)
    return Merged(
        gval=torch.where(has_cut, cbest, merged.gval),
        gidx=torch.where(has_cut, ctok, merged.gidx),
        lse=torch.where(has_cut, lse_c, merged.lse),
        sx=torch.where(has_cut, sx_c, merged.sx),
        res_tok=torch.where(has_cut, res_tok, none),
        uncertified=has_cut & ~certified,
        nucleus_margin=torch.where(has_cut, margin, nan64),
        n_kept=torch.where(has_cut, n_kept, none),
        row_max=sv[:, 0],
    )


# ---------------------------------------------------------------------------
# round 2: escalation on whole rows
# ---------------------------------------------------------------------------
def pick_slots(uncertified: torch.Tensor, row_in_req: torch.Tensor, slots: int):
    """``slots`` uncertified rows in (row within request, row) order, and which are real."""
    R = uncertified.shape[0]
    big = torch.iinfo(torch.int64).max // 4
    key = torch.where(uncertified, row_in_req * (R + 1) + torch.arange(R, device=row_in_req.device),
                      torch.full_like(row_in_req, big))
    top = torch.topk(-key, slots, dim=0)
    return top.indices, (-top.values) < big


def exact_cut(s: torch.Tensor, top_k: torch.Tensor, min_p: torch.Tensor, top_p: torch.Tensor):
    """The exact ``(threshold, tie_col)`` of whole rows ``s [n, V]`` (no host reads) and
    the nucleus margin: the kept prefix in (value desc, id asc) order."""
    n, V = s.shape
    sv, sid = torch.sort(s, dim=1, descending=True, stable=True)
    pos = torch.arange(V, device=s.device)
    finite = sv > NEG_INF
    cutv = min_p_threshold(sv[:, 0], min_p)
    n_kept = ((sv >= cutv[:, None]) & finite).sum(dim=1)
    n_kept = torch.where(top_k > 0, torch.minimum(n_kept, top_k), n_kept)
    tp = top_p.double()
    cand = pos[None, :] < n_kept[:, None]
    w = torch.where(cand, sv.double(), torch.full_like(sv, NEG_INF, dtype=torch.float64))
    prob = torch.exp(w - torch.logsumexp(w, dim=1, keepdim=True))
    before, cum = exclusive_cumsum(prob)
    n_nuc = ((before < tp[:, None]) & cand).sum(dim=1).clamp(min=1)
    nucleus = tp < 1
    margin = torch.where(nucleus, nucleus_margin(before, cum, tp, n_nuc),
                         torch.full_like(tp, float("nan")))
    n_kept = torch.where(nucleus, n_nuc, n_kept).clamp(min=1)
    last = (n_kept - 1)[:, None]
    return sv.gather(1, last).squeeze(1), sid.gather(1, last).squeeze(1), margin


def escalate_torch(logits_shard: torch.Tensor, inp: StepInputs, plan: StepPlan, merged: Merged,
                   all_gather: AllGather, vocab_size: int, q_full: torch.Tensor | None,
                   backend: str = "torch") -> torch.Tensor:
    """Round 2 on whole rows for the picked uncertified rows (any draft kind); updates
    ``merged`` in place and returns the deferred rows (uncertified, no slot). ``backend``
    runs the statistics of the gathered rows (the Triton path's probabilistic drafts)."""
    E = plan.escalation_slots
    idx, real = pick_slots(merged.uncertified, inp.row_in_req, E)
    rows = logits_shard.index_select(0, idx)
    g = all_gather(rows.contiguous())  # [TP, E, S]
    TP, _, S = g.shape
    full = g.permute(1, 0, 2).reshape(E, TP * S)[:, :vocab_size]
    t = inp.temperature[idx]
    # probabilistic drafts (and the torch backend): the whole-row cut by a sort
    thr, tie, margin = exact_cut(scale_logits(full, t), inp.top_k[idx], inp.min_p[idx],
                                 inp.top_p[idx])
    st = shard_local_stats(full, t, thr, inp.draft[idx], inp.seeds[idx], inp.positions[idx], 0,
                           vocab_size, exclude_draft=q_full is None, backend=backend, width=4,
                           tie_col=tie)
    sx = st[:, 3]
    res_tok = torch.full_like(idx, -1)
    if q_full is not None:
        s = scale_logits(full, t)
        q = q_full[idx, :vocab_size].float()
        x = inp.draft[idx]
        sx = sx - _logq_at(q_full.index_select(0, idx), x[:, None], vocab_size)[:, 0]
        keep = (s > thr[:, None]) | ((s == thr[:, None]) & (
            torch.arange(vocab_size, device=s.device)[None, :] <= tie[:, None]))
        sm = torch.where(keep, s, NEG_INF)
        res = residual_log_weights(sm - st[:, 2:3], torch.log(q))
        ids = torch.arange(vocab_size, device=s.device).expand(E, -1)
        rbest, rtok = _argmax_lowest_id(res + _gumbel_at(inp.seeds[idx], inp.positions[idx], ids),
                                        ids)
        res_tok = torch.where(rbest > NEG_INF, rtok, res_tok)

    def put(dst: torch.Tensor, val: torch.Tensor) -> None:
        dst[idx] = torch.where(real, val.to(dst.dtype), dst[idx])

    put(merged.gval, st[:, 0])
    put(merged.gidx, st[:, 1].round().long())
    put(merged.lse, st[:, 2])
    put(merged.sx, sx)
    put(merged.res_tok, res_tok)
    put(merged.nucleus_margin, margin)
    assigned = torch.zeros_like(merged.uncertified)
    assigned[idx] = real
    return merged.uncertified & ~assigned


# ---------------------------------------------------------------------------
# decision
# ---------------------------------------------------------------------------
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




# ---------------------------------------------------------------------------
# stats-only steps and the residual round
# ---------------------------------------------------------------------------
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


def residual_payload_torch(logits_shard: torch.Tensor, inp: StepInputs, merged: Merged,
                           rows: torch.Tensor, q_full: torch.Tensor, col_offset: int,
                           vocab_size: int) -> torch.Tensor:
    """Round 3's payload ``[len(rows), 2]``: this shard's Gumbel-max ``(value, id)`` of the
    residual ``max(0, p - q)`` at the given decision rows."""
    S = logits_shard.shape[1]
    t = inp.temperature[rows]
    s = scale_logits(logits_shard.index_select(0, rows), t)
    cols = torch.arange(S, device=s.device)
    s = s.masked_fill((cols + col_offset >= vocab_size)[None, :], NEG_INF)
    logp = s - merged.lse[rows][:, None]
    hi = min(col_offset + S, vocab_size)
    q = torch.zeros_like(s)
    if hi > col_offset:
        q[:, :hi - col_offset] = q_full[rows, col_offset:hi].float()
    res = residual_log_weights(logp, torch.log(q))
    ids = (cols + col_offset).expand(rows.shape[0], -1)
    best, tok = _argmax_lowest_id(res + _gumbel_at(inp.seeds[rows], inp.positions[rows], ids),
                                  ids)
    return torch.stack([best, tok.to(torch.float32)], dim=1).contiguous()


def apply_residual(g: torch.Tensor, inp: StepInputs, rows: torch.Tensor, num_sampled,
                   stopped, sampled, vocab_size: int) -> torch.Tensor:
    """Put the merged residual token of round 3 (``g [TP, reqs, 2]``) at each request's
    decision row, for sampling rows without a cut (rows with a cut took it from the
    candidates)."""
    gbest, gtok = merge_argmax(g[..., 0], g[..., 1])
    t = inp.temperature[rows]
    d = inp.draft[rows]
    has_cut = (inp.top_k[rows] > 0) | (inp.min_p[rows] > 0) | (inp.top_p[rows] < 1)
    use = (t > 0) & ~has_cut & (d >= 0) & (d < vocab_size) & (gbest > NEG_INF) & ~stopped
    last = (num_sampled.long() - 1).clamp(min=0)
    cur = sampled.gather(1, last[:, None]).squeeze(1)
    new = torch.where(use, gtok, cur)
    return sampled.scatter(1, last[:, None], new[:, None])
