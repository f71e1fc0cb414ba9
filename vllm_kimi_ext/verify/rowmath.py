"""Row math the rounds of the sharded step share: temperature scaling, the min-p cut, masses
before a position, the nucleus margin, the residual's log-weights, the merge of
``(value, id)`` pairs over ranks, the float64 wire split, and ``log q`` / the Gumbel noise
at given ids.

Used by the product only. The tests' oracle (:mod:`.reference`) computes the same quantities
itself from their definitions and imports nothing from here, so a bug in this module is
not shared by the implementation and its judge.
"""

from __future__ import annotations

import torch

from .hashing import DOMAIN_GUMBEL, element_hash, gumbel_from_bits, row_keys

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


def merge_argmax(vals: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Best ``(value, id)`` over ranks ``[TP, n]``: max value, then lowest id."""
    best = vals.max(dim=0).values
    cand = torch.where(vals == best[None, :], idx, torch.full_like(idx, float("inf")))
    tok = cand.min(dim=0).values
    # NaN rows: nothing equals the max; keep the lowest id reported.
    tok = torch.where(torch.isinf(tok), idx.min(dim=0).values, tok)
    return best, tok.to(torch.int64)


def split_float64(x: torch.Tensor) -> torch.Tensor:
    """float64 ``[n]`` -> float32 ``[n, 2]`` (hi, lo) with ``hi + lo == x`` to ~1e-15."""
    hi = x.to(torch.float32)
    lo = torch.where(torch.isfinite(hi), (x - hi.double()).to(torch.float32),
                     torch.zeros_like(hi))
    return torch.stack([hi, lo], dim=1)


def join_float64(hi_lo: torch.Tensor) -> torch.Tensor:
    return hi_lo[..., 0].double() + hi_lo[..., 1].double()


def logq_at(q_full: torch.Tensor | None, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """log q at ids ``[rows, n]`` (0 where ``q_full`` is None: one-hot drafts)."""
    if q_full is None:
        return torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
    q = q_full[:, :vocab_size].float().gather(1, ids.clamp(0, vocab_size - 1))
    return torch.log(q)


def gumbel_at(seeds: torch.Tensor, positions: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Gumbel noise of global ``ids [rows, n]`` (the reference's numbers)."""
    h1, h2 = row_keys(seeds, positions, DOMAIN_GUMBEL)
    return gumbel_from_bits(element_hash(h1[:, None], h2[:, None], ids.clamp(min=0)))


def argmax_lowest_id(score: torch.Tensor, ids: torch.Tensor):
    """Best score per row and the lowest id among entries attaining it."""
    best = score.max(dim=1).values
    big = torch.iinfo(torch.int64).max
    tok = torch.where(score == best[:, None], ids, torch.full_like(ids, big)).min(dim=1).values
    return best, torch.where(tok == big, torch.full_like(tok, -1), tok)
