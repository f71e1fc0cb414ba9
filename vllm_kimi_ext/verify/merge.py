"""Round 1's merge: every rank merges the same gathered ``[TP, rows, width]`` payloads
into the per-row :class:`.step_io.Merged` statistics.

A row whose kept set (the min-p / top-k / top-p prefix) provably lies inside the merged
candidates is *certified* (no rank that sent ``W`` candidates can hold an unsent token
before the cut): its nucleus, its log-sum-exp, the accept ratio of the draft and the
Gumbel-max of the nucleus (the draft excluded for one-hot residuals; the residual
``max(0, p - q)`` for probabilistic drafts) are computed from the candidates, with the
same counter-based noise the reference uses. Rows without a cut use the statistics
directly. Uncertified rows go to the escalation (:mod:`.escalate`).

:func:`merge_round1` is the round: the torch body (:func:`merge_round1_torch`) or the Triton
launcher (:func:`merge_round1_triton`; kernel in :mod:`._kernels.merge`).
"""

from __future__ import annotations

import torch

from .protocol import LSE_COLUMNS, STAT_COLUMNS, StepPlan
from .rowmath import (
    argmax_lowest_id,
    exclusive_cumsum,
    gumbel_at,
    join_float64,
    logq_at,
    merge_argmax,
    min_p_threshold,
    nucleus_margin,
    residual_log_weights,
)
from .step_io import Merged, StepInputs, constant

NEG_INF = float("-inf")
#: Warps of the merge kernel (measured on an H200: ``bench/kernels/bench_verify_graph.py``).
MERGE_WARPS = 16
#: From how many candidates per rank (``W``) round 1's merge orders them by merging the ranks'
#: sorted runs (binary search) instead of a bitonic sort of all ``TP * W`` keys
#: (:func:`merge_round1_triton`); ``None``: never unless a caller passes ``runs=True``.
#: Off because on one H100 (2026-12-07, ``tests/gpu/test_verify_folded_gpu.py``) the merge
#: of runs decided every case as the sort does (the same ids, values, flags) but its ``lse`` /
#: ``nucleus_margin`` differed from the sort's in 3 of 29 cases (flat rows at W = 128, tied
#: rows at W = 512): not bit for bit, as it is on Triton's CPU interpreter. Its speed, on the
#: same GPU (real rows, V = 163840, TP = 8; ``bench/reports/profile_folded_h100_runs.txt``,
#: ``bench/reports/verify_folded_h100_merge_runs.md``):
#: at W = 128 (round 1) runs made the whole-row step 4-19 us slower (k = 3/7, 4-256 rows);
#: at W = 512 (the folded escalation's second merge) the step's two merges went from 142.7
#: to 86.8 us.
MERGE_RUNS_MIN_WIDTH: int | None = None


def merge_round1(g: torch.Tensor, inp: StepInputs, plan: StepPlan, vocab_size: int,
                 rank_valid: torch.Tensor, q_full: torch.Tensor | None, *,
                 triton: bool) -> Merged:
    """Round 1's merge of ``g [TP, rows, plan.round1_width]`` (a step with a cut or
    probabilistic drafts; stats-only steps merge in the decision, :mod:`.decide`)."""
    if triton:
        return merge_round1_triton(g, inp, plan, vocab_size, rank_valid, q_full)
    return merge_round1_torch(g, inp, plan, vocab_size, rank_valid, q_full)


def merge_round1_torch(g: torch.Tensor, inp: StepInputs, plan: StepPlan, vocab_size: int,
                       rank_valid: torch.Tensor, q_full: torch.Tensor | None) -> Merged:
    """Merge ``g [TP, rows, width]`` (every rank computes the same result).

    Long because: it is the readable reference of ``_kernels.merge._merge_kernel`` and keeps
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
    noise = gumbel_at(inp.seeds, inp.positions, sid)
    if q_full is None:
        score = torch.where(kept & ~is_x, sv + noise, NEG_INF)
        res_tok = none
    else:
        logq = logq_at(q_full, sid, vocab_size)
        sx_c = sx_c - logq_at(q_full, x[:, None], vocab_size)[:, 0]
        score = torch.where(kept, sv + noise, NEG_INF)
        res = residual_log_weights(sv - lse_c[:, None], logq)
        rbest, rtok = argmax_lowest_id(torch.where(kept, res + noise, NEG_INF), sid)
        res_tok = torch.where(rbest > NEG_INF, rtok, none)
    cbest, ctok = argmax_lowest_id(score, sid)
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
# Triton launcher (the kernel: _kernels/merge.py)
# ---------------------------------------------------------------------------


def merge_round1_triton(
    g,  # [TP, rows, round1_width] float32, the gathered round-1 payloads
    inp,  # StepInputs
    plan,  # StepPlan (host)
    vocab_size: int,
    rank_valid,  # [TP] int64: valid columns of each rank's shard
    q_full,  # [rows, >= V] float32 or None
    runs: bool | None = None,  # merge the ranks' sorted runs or sort (default: by W)
    fill: int | None = None,  # the runs' scratch starts as this key (tests); default uninit.
):
    """Triton version of :func:`merge_round1_torch` (probabilistic drafts and
    all-greedy steps use the torch merge: their merge is a handful of ops).

    The candidates arrive as one descending run per rank; ``runs`` (default: from
    :data:`MERGE_RUNS_MIN_WIDTH` candidates per rank, so never) merges the runs by binary
    search instead of sorting all ``TP * W`` keys: the same sorted keys, bit for bit the same
    output on Triton's CPU interpreter; on a GPU every case tried decided the same while the
    sums (``lse``, ``nucleus_margin``) can round differently. A payload whose runs are out of
    order takes the sort inside the kernel."""
    import triton

    from ._kernels import merge as km

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
    if runs is None:
        runs = MERGE_RUNS_MIN_WIDTH is not None and W >= MERGE_RUNS_MIN_WIDTH
    PN = triton.next_power_of_2(TP * W)
    shape = (R, PN) if runs else (1, 1)
    order = (torch.empty(shape, dtype=torch.int64, device=dev) if fill is None else
             torch.full(shape, fill, dtype=torch.int64, device=dev))
    with km._LAUNCH_LOCK:
        km._merge_kernel[(R,)](g, g.stride(0), g.stride(1), rank_valid.contiguous(),
                               inp.temperature.contiguous(), inp.top_k.contiguous(),
                               inp.min_p.contiguous(), inp.top_p.contiguous(),
                               inp.draft.contiguous(), inp.seeds.contiguous(),
                               inp.positions.contiguous(),
                               gval, gidx, lse, sx, unc, margin, rmax, order,
                               TP=TP, PTP=triton.next_power_of_2(TP), W=W, PN=PN,
                               RUNS=runs, LOGW=W.bit_length(), num_warps=MERGE_WARPS)
    # int8 flags throughout the Triton path (no conversion launches); read-only "-1" ids
    return Merged(gval, gidx, lse, sx, constant(R, -1, torch.int64, dev), unc, margin, None,
                  rmax)
