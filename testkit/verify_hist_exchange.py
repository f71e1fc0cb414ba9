"""A one-row model of the smaller escalation exchange, kept as a second oracle; the product's
batched, graph-safe version is ``testkit/verify_hist_step.py`` (no band: its coarse
bins cover every key; its last round also carries whole-row fallback slots).

The whole-row escalation costs every rank one shard row per escalated row (V / TP values in
the logits' dtype: 40,960 B for bf16 at V = 163840, TP = 8). This module simulates, in one
process and one row at a time, the band-limited form of the exchange that replaces it for
bf16 rows and top-p, tested against :func:`vllm_kimi_ext.verify.escalate.rows.exact_cut`:

1. **Coarse round.** Every rank sends, for the band of ordered bf16 keys that can hold the
   cut (``s >= m - ln(V / (1 - top_p)) - 1``, ``m`` from round 1, the same band the split
   escalation uses), ``NB`` bins of (count, float64 mass ``sum exp(s - m)``) and its shard's
   float64 total mass. Counts add exactly; masses add in rank order, so every rank walks the
   same bins from the top to the one where the running mass reaches ``top_p x Z``.
2. **Boundary round.** Every rank sends its per-key counts of that bin only. All tokens of
   one key share one value, so the walk inside the bin uses ``count x exp(s_key - m)`` and
   gives the cut's key and how many of its tied tokens are kept, in id order (the
   per-rank counts say which rank holds which of them).
3. **Statistics round** (not modelled here: the shard-local statistics under a known cut
   that round 1 already sends for rows without a cut, 16-32 B per row).

A row whose running mass lies within ``edge_tol x Z`` of the target at the boundary bin's
edge is returned as ``None`` (the product would defer it: fail closed), because there the
bin sums' rounding could pick a neighbouring bin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: Coarse bins of the first round.
BINS = 256
#: Relative distance of the target from a bin edge below which the row is deferred
#: (float64 sums of <= 163840 terms stay within ~1e-11 relative; 1e-9 leaves room).
EDGE_TOL = 1e-9


@dataclass(frozen=True)
class HistCut:
    """The cut found by the exchange and what each round sent per rank."""

    value: float  # s of the cut's key
    tie_id: int  # global id of the last kept token (ties kept in id order)
    coarse_bytes: int  # round 1 per rank: BINS x (int32 count + float64 mass) + float64 Z
    boundary_bytes: int  # round 2 per rank: keys per bin x int32 count


def ordered_key(z: torch.Tensor) -> torch.Tensor:
    """Ordered int key in ``[0, 65536)`` of bf16 ``z`` (``-0.0`` keyed as ``+0.0``)."""
    b = z.view(torch.int16).to(torch.int32)
    b = torch.where(b == -32768, torch.zeros_like(b), b)
    return (b ^ ((b >> 15) & 0x7FFF)) + 32768


def key_value(key: int, temperature: float) -> float:
    """``s = z / T`` (float32 division) of the bf16 value whose ordered key is ``key``."""
    o = key - 32768
    b = o ^ ((o >> 15) & 0x7FFF)
    z = torch.tensor([b], dtype=torch.int16).view(torch.bfloat16).float()
    return float(z / torch.tensor([temperature], dtype=torch.float32))


def hist_exchange_cut(z: torch.Tensor, temperature: float, top_p: float, tp: int,
                      bins: int = BINS, edge_tol: float = EDGE_TOL) -> HistCut | None:
    """The top-p cut of one bf16 row ``z [V]`` from the two histogram rounds over ``tp``
    vocabulary shards, or ``None`` where the product would defer the row."""
    V = z.shape[0]
    shard = V // tp
    s = z.float() / torch.tensor(temperature, dtype=torch.float32)
    m = float(s.max())
    key = ordered_key(z)
    w = torch.exp(s.double() - m)
    band = s.double() >= m - math.log(V / (1.0 - top_p)) - 1.0
    k_lo, k_hi = int(key[band].min()), int(key.max())
    width = -(-(k_hi - k_lo + 1) // bins)
    count = torch.zeros(bins, dtype=torch.int64)
    mass = torch.zeros(bins, dtype=torch.float64)
    total = 0.0
    for r in range(tp):  # round 1, summed in rank order
        part = slice(r * shard, (r + 1) * shard)
        in_band = band[part]
        b = (key[part][in_band] - k_lo) // width
        count += torch.bincount(b, minlength=bins)
        mass += torch.zeros(bins, dtype=torch.float64).index_add_(0, b, w[part][in_band])
        total += float(w[part].sum())
    target = top_p * total
    above = 0.0
    for b in range(bins - 1, -1, -1):
        if count[b] and above + float(mass[b]) >= target:
            break
        above += float(mass[b])
    if min(abs(above - target), abs(above + float(mass[b]) - target)) < edge_tol * total:
        return None
    k0 = k_lo + b * width
    key_count = torch.zeros(width, dtype=torch.int64)
    for r in range(tp):  # round 2: the boundary bin's per-key counts
        kr = key[r * shard:(r + 1) * shard]
        inside = (kr >= k0) & (kr < k0 + width)
        key_count += torch.bincount(kr[inside] - k0, minlength=width)
    run = above
    for j in range(width - 1, -1, -1):
        c = int(key_count[j])
        if not c:
            continue
        wk = math.exp(key_value(k0 + j, temperature) - m)
        if run + c * wk >= target or j == 0:
            need = max(1, min(c, math.ceil((target - run) / wk)))
            break
        run += c * wk
    tied = torch.nonzero(key == k0 + j).flatten()
    return HistCut(key_value(k0 + j, temperature), int(tied[need - 1]),
                   coarse_bytes=bins * (4 + 8) + 8, boundary_bytes=width * 4)
