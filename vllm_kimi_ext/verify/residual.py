"""Round 3, the residual (only with probabilistic drafts and sampling rows without a
cut): each rank's Gumbel-max of ``max(0, p - q)`` over its shard at each request's
decision row, 8 bytes per request (:data:`.protocol.RESIDUAL_COLUMNS`), then the merged
token put at that row. Torch only: one small launch per side.
"""

from __future__ import annotations

import torch

from .rowmath import argmax_lowest_id, gumbel_at, merge_argmax, residual_log_weights, scale_logits
from .step_io import Merged, StepInputs

NEG_INF = float("-inf")


def residual_payload(logits_shard: torch.Tensor, inp: StepInputs, merged: Merged,
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
    best, tok = argmax_lowest_id(res + gumbel_at(inp.seeds[rows], inp.positions[rows], ids),
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
