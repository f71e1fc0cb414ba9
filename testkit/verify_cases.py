"""Random verification batches and logits of named shapes, shared by the tests of the
eager and the graph sharded verifiers."""

from __future__ import annotations

import torch

from vllm_kimi_ext.verify import VerifyBatch


def random_top_p_batch(g, n: int, V: int, mix: str, k: int = 3) -> VerifyBatch:
    """``n`` requests of ``k`` random drafts: 15 % greedy, 85 % with a random top-p; ``mix``
    adds top-k (``top_p_top_k``), min-p (``top_p_min_p``) or both (``mixed``)."""
    drafts = torch.randint(0, V, (n, k), generator=g)
    temps = torch.where(torch.rand(n, generator=g) < 0.15, 0.0,
                        torch.rand(n, generator=g) * 1.4 + 0.3)
    top_p = torch.where(torch.rand(n, generator=g) < 0.85,
                        torch.rand(n, generator=g) * 0.97 + 0.02, 1.0)
    top_k = min_p = None
    if mix in ("top_p_top_k", "mixed"):
        top_k = torch.where(torch.rand(n, generator=g) < 0.5,
                            torch.randint(1, V // 2, (n,), generator=g), 0)
    if mix in ("top_p_min_p", "mixed"):
        min_p = torch.where(torch.rand(n, generator=g) < 0.5,
                            torch.rand(n, generator=g) * 0.2, 0.0)
    seeds = torch.randint(-(2**62), 2**62, (n,), generator=g)
    return VerifyBatch.from_draft_tokens(drafts, temps, seeds, top_k=top_k, min_p=min_p,
                                         top_p=top_p)


def shaped_logits(g, batch: VerifyBatch, V: int, kind: str) -> torch.Tensor:
    """Logits of ``kind`` (random, bf16 ties, flat, four-valued) with half of the drafts made
    the row's argmax."""
    n = batch.num_rows
    if kind == "random":
        z = torch.randn(n, V, generator=g) * 3
    elif kind == "ties":  # bf16 rounding of a coarse grid: tied values at most cuts
        z = (torch.randn(n, V, generator=g) * 2).round(decimals=1).to(torch.bfloat16)
    elif kind == "flat":  # large nuclei: the first round rarely certifies the cut
        z = torch.randn(n, V, generator=g) * 0.3
    elif kind == "coarse":  # four values: the cut splits a tie group of ~50 tokens
        z = torch.randint(0, 4, (n, V), generator=g).float()
    else:
        raise KeyError(kind)
    L = batch.layout()
    d = L.draft
    hit = (d >= 0) & (torch.rand(n, generator=g) < 0.5)
    rows = hit.nonzero().squeeze(1)
    z[rows, d[rows]] = (z[rows].float().max(dim=1).values + 1.0).to(z.dtype)
    return z
