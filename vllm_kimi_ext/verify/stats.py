"""Round 1, the shard pass: this rank's ``[rows, plan.round1_width]`` float32 payload.

Per row: the Gumbel-max ``(gval, gidx)`` over the shard (greedy rows: the argmax), the
shard log-sum-exp in float64 (two float32 halves), ``s_x`` of the draft token if this
shard owns it and, when some row has a cut, the shard's first ``W`` tokens in the order
(value desc, id asc) as ``W`` values and ``W`` global ids (:data:`.protocol.STAT_COLUMNS`
+ ``2 W`` columns). All-greedy steps send ``(max, argmax)``; stats-only steps the fused
shard statistics of :mod:`.shard_stats`.

:func:`round1_payload` is the round: the torch body (:func:`round1_payload_torch`) or the Triton
launcher (:func:`round1_payload_triton`; kernels in :mod:`._kernels.stats`), as the step's
one backend switch says.
"""

from __future__ import annotations

import torch

from .protocol import LSE_COLUMNS, STAT_COLUMNS, StepPlan
from .rowmath import logq_at, scale_logits, split_float64
from .shard_stats import shard_local_stats, shard_local_stats_triton
from .step_io import StepInputs

NEG_INF = float("-inf")


def round1_payload(logits_shard: torch.Tensor, inp: StepInputs, plan: StepPlan,
                   col_offset: int, vocab_size: int, q_full: torch.Tensor | None, *,
                   triton: bool) -> torch.Tensor:
    """Round 1's payload of this rank (stats-only steps: the fused shard statistics)."""
    if plan.stats_only:
        return shard_local_stats(logits_shard, inp.temperature, None, inp.draft, inp.seeds,
                                 inp.positions, col_offset, vocab_size, exclude_draft=True,
                                 backend="triton" if triton else "torch",
                                 width=plan.round1_width)
    if triton:
        return round1_payload_triton(logits_shard, inp, plan, col_offset, vocab_size, q_full)
    return round1_payload_torch(logits_shard, inp, plan, col_offset, vocab_size, q_full)



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
        sx = sx - logq_at(q_full, inp.draft[:, None], vocab_size)[:, 0]
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
# Triton launcher (the kernels: _kernels/stats.py)
# ---------------------------------------------------------------------------


#: Launch shapes (measured on an H200: ``bench/kernels/bench_verify_graph.py``).
TUNE = {"split_small": 2048, "split_large": 2048, "small_rows": 16, "cand_warps": 8,
        "cand_merge_warps": 16}


def round1_payload_triton(
    logits_shard,  # [rows, S], the logits' dtype (bf16 / fp16 / fp32), unit column stride
    inp,  # StepInputs: int64 / float32 [rows] per-row tensors
    plan,  # StepPlan (host)
    col_offset: int,
    vocab_size: int,
    q_full,  # [rows, >= V] float32 draft probabilities, or None (one-hot drafts)
):
    """Triton version of :func:`round1_payload_torch`; returns
    ``[rows, plan.round1_width]`` float32."""
    import triton

    from ._kernels import stats as ks

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
    with ks._LAUNCH_LOCK:
        ks._cand_kernel[(R, nsplit)](logits_shard, logits_shard.stride(0), temp, draft,
                                     inp.seeds.contiguous(), inp.positions.contiguous(),
                                     pk, pm, pse, pgv, pgi, n_valid, col_offset, nsplit,
                                     EXCLUDE=exclude, C=C, W=W, KP=KP, K16=k16,
                                     num_warps=TUNE["cand_warps"])
    with ks._LAUNCH_LOCK:
        ks._cand_merge_kernel[(R,)](logits_shard, logits_shard.stride(0), temp, draft,
                                    pk, pm, pse, pgv, pgi, out, out.stride(0), n_valid, col_offset,
                                    nsplit, PSPLIT=triton.next_power_of_2(nsplit),
                                    PK=PK, W=W, KP=KP, K16=k16,
                                    num_warps=TUNE["cand_merge_warps"])
    if q_full is not None:
        out[:, 4] -= logq_at(q_full, inp.draft[:, None], vocab_size)[:, 0]
    return out
