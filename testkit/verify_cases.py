"""Random verification batches and logits of named shapes, shared by the tests of the
eager and the graph sharded verifiers."""

from __future__ import annotations

import math

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


#: Ties and deep cuts that pin the split escalation (the row's vocabulary and its chunk).
PIN_V = 211


def _first_row_positions(drafts: torch.Tensor, n: int, top_p: float) -> torch.Tensor:
    from vllm_kimi_ext.verify.step_io import StepInputs

    b = VerifyBatch.from_draft_tokens(drafts, [1.0] * n, list(range(n)), top_p=[top_p] * n)
    rows_per = drafts.shape[1] + 1
    return StepInputs.from_layout(b.layout(), PIN_V).positions[::rows_per]


def _seeds_where(n: int, positions: torch.Tensor, ids: torch.Tensor, ok) -> list[int]:
    """For each request, the first seed (from 1 up) whose Gumbel-max over ``ids`` is at a
    position ``ok`` accepts (searched in one vectorised pass per request)."""
    from vllm_kimi_ext.verify.rowmath import gumbel_at

    cands = torch.arange(1, 200_000)
    out = []
    for q in range(n):
        noise = gumbel_at(cands, positions[q].expand(cands.shape[0]),
                           ids[None].expand(cands.shape[0], -1))
        hit = ok(noise.argmax(dim=1)).nonzero().squeeze(1)
        out.append(int(cands[hit[q]]))
    return out


def tied_rows(chunk: int, past: int):
    """One row of 120 tokens tied at 0 (the rest at -5) and a top_p whose kept set is the
    first ``need`` tied tokens in id order, ``past`` tied tokens before the last tied token
    of chunk 4. Returns ``(tied ids, need, logits row, top_p)``."""
    g = torch.Generator().manual_seed(5)
    tied = torch.randperm(PIN_V, generator=g)[:120].sort().values
    need = int((tied < 5 * chunk).sum()) - past
    z = torch.full((PIN_V,), -5.0)
    z[tied] = 0.0
    zt = 120.0 + (PIN_V - 120) * torch.exp(torch.tensor(-5.0)).item()
    return tied, need, z, (need - 0.5) / zt


def tied_batch(chunk: int, past: int, draft: int, seeds_ok, window: int, n: int = 3):
    """``n`` requests over :func:`tied_rows` drafting ``draft`` everywhere, each request's
    seed the first whose Gumbel-max over the first ``need + window`` tied tokens sits at a
    position ``seeds_ok(argmax, those tokens)`` accepts. Returns ``(batch, bf16 logits)``."""
    tied, need, z, top_p = tied_rows(chunk, past)
    drafts = torch.full((n, 3), draft)
    window = tied[:need + window]
    seeds = _seeds_where(n, _first_row_positions(drafts, n, top_p), window,
                         lambda a: seeds_ok(a, window))
    b = VerifyBatch.from_draft_tokens(drafts, [1.0] * n, seeds, top_p=[top_p] * n)
    return b, z.expand(b.num_rows, PIN_V).contiguous().to(torch.bfloat16)


def ties_past_the_cut(chunk: int, past: int = 4, draft_past: bool = False):
    """Rows of 120 tokens tied at the maximum over many ``chunk``-column chunks; the kept
    set is the first ``need`` of them in id order and ``past >= 3`` tied tokens after the
    ``need``-th lie in the same chunk (the chunk the escalation re-reads), more in later
    chunks. Each request's seed makes one of the tied tokens just past the cut the
    Gumbel-max of (kept + those ``past``), so keeping any of them changes the sample. The
    draft is either one of them (``draft_past``: excluded from the sample anyway) or a
    kept tied token. Returns ``(batch, bf16 logits)``."""
    tied, need, _, _ = tied_rows(chunk, past)
    assert need > 0 and int((tied[need:need + past] // chunk == 4).sum()) == past
    x = int(tied[need + 1]) if draft_past else int(tied[need // 2])
    return tied_batch(chunk, past, x, lambda a, w: (a >= need) & (w[a] != x), past)
def exact_min_p(cut: float) -> float:
    """A float32 ``min_p`` whose float32 log is exactly ``cut`` (a bf16 value): on a row whose
    maximum is 0 the min-p cut ``max + log(min_p)`` then lies exactly on the tokens at
    ``cut``, which min-p keeps (``s >= cut``)."""
    p = torch.tensor(math.exp(cut), dtype=torch.float32)
    for _ in range(64):
        got = float(torch.log(p))
        if got == cut:
            return float(p)
        p = torch.nextafter(p, torch.tensor(math.inf if got < cut else 0.0))
    raise AssertionError(f"no float32 min_p has log {cut}")


def deep_cut(depth: float, count: int = 150, min_p_on_cut: bool = False):
    """Rows whose top-p cut lies ``depth`` nats below the maximum: one token at 0, ``count``
    tied at ``-depth`` (the cut keeps about half of them), the rest at -40; top_p is chosen
    for that (0.6-0.9999). A histogram band too narrow for the cut (one built from
    ``top_p`` instead of ``1 - top_p``) collapses the kept set. ``min_p_on_cut``: a min-p
    whose cut lies exactly on the tied tokens (:func:`exact_min_p`); a min-p pre-cut that
    drops tokens on the cut (``>`` for ``>=``) leaves the maximum alone in the nucleus.
    Returns ``(batch, bf16 logits)``."""
    g = torch.Generator().manual_seed(int(depth * 10))
    ids = torch.randperm(PIN_V, generator=g)
    top, tied = int(ids[0]), ids[1:count + 1]
    z = torch.full((PIN_V,), -40.0)
    z[top] = 0.0
    z[tied] = -float(depth)
    w = float(torch.exp(torch.tensor(-float(depth))))
    zt = 1.0 + count * w
    top_p = (1.0 + (count // 2 + 0.5) * w) / zt
    n = 3
    drafts = torch.stack([tied[:3], tied[-3:], torch.tensor([top] * 3)])
    seeds = torch.randint(1, 2**40, (n,), generator=g)
    b = VerifyBatch.from_draft_tokens(
        drafts, [1.0] * n, seeds, top_p=[top_p] * n,
        min_p=[exact_min_p(-float(depth))] * n if min_p_on_cut else None)
    return b, z.expand(b.num_rows, PIN_V).contiguous().to(torch.bfloat16)
