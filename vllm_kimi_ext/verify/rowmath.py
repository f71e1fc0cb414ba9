"""Row math of the sharded step's torch stages: temperature scaling, the min-p cut, masses
before a position, the nucleus margin and the residual's log-weights.

Used by the product only. The tests' oracle (:mod:`.reference`) computes the same quantities
itself from their definitions and imports nothing from here, so a bug in this module is
not shared by the implementation and its judge.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def scale_logits(z: torch.Tensor, temperature_rows: torch.Tensor) -> torch.Tensor:
    """``z / T`` in float32 per row (greedy rows, ``T == 0``, are left unscaled).

    The reference performs the same float32 division, so every element is bitwise
    the one it computes.
    """
    z = z.float()
    t = temperature_rows.to(torch.float32)
    safe = torch.where(t == 0, torch.ones_like(t), t)
    return z / safe[:, None]


def min_p_threshold(row_max: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """vLLM's min-p cut on temperature-scaled logits: ``max + log(min_p)`` (-inf if off)."""
    cut = row_max + torch.log(torch.where(min_p > 0, min_p, torch.ones_like(min_p)))
    return torch.where(min_p > 0, cut, torch.full_like(cut, NEG_INF))


def exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    """Mass strictly before each position along dim 1."""
    cum = torch.cumsum(x, dim=1)
    return torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=1), cum


def nucleus_margin(before: torch.Tensor, cum: torch.Tensor, top_p: torch.Tensor,
                   n: torch.Tensor) -> torch.Tensor:
    """Distance of ``top_p`` from the cumulative mass on either side of the cut."""
    last = (n - 1).clamp(min=0)[:, None]
    lower = top_p - before.gather(1, last).squeeze(1)
    through = cum.gather(1, last).squeeze(1)
    upper = torch.where(through >= top_p, through - top_p, torch.full_like(through, float("inf")))
    return torch.minimum(lower, upper)


def residual_log_weights(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """``log(max(0, p - q))`` computed as ``log p + log1p(-q/p)`` (``-inf`` where ``q >= p``)."""
    ok = logq < logp
    diff = torch.where(ok, logq - logp, torch.zeros_like(logp))
    return torch.where(ok, logp + torch.log1p(-torch.exp(diff)), torch.full_like(logp, NEG_INF))
