"""The first sharded verifier's threshold round: exact min-p / top-k / top-p cuts from
each rank's first ``W`` values (kept for ``bench/topp_fallback.py``, which measures how
often one round of ``W`` candidates certifies the top-p cut on real logits; the product's
graph step applies the same certificate in
:func:`vllm_kimi_ext.verify.merge.merge_round1_torch`).

The mask vLLM 0.34.0 applies before rejection sampling (min-p, then top-k, then
top-p on the temperature-scaled row ``s = z / T``; see
:func:`vllm_kimi_ext.verify.reference.sampling_keep_mask`) always keeps a *prefix* of the row in the
order (value descending, token id ascending). Shards own contiguous id ranges
in rank order, so that order is "value descending, then rank, then local
column". A prefix is therefore described on each rank by how many of its own
tokens it contains, and the rank keeps its first ``c_r`` tokens in its local
order: ``s > v`` or ``(s == v and col <= col_v)`` with ``(v, col_v)`` its
``c_r``-th entry. That is the ``(threshold, tie_col)`` pair the statistics
kernels apply.

One round (one all-gather): each rank sends, per row, its first ``W`` values in
that order (``stats.local_top``) and, when some row uses top-p, its shard
log-sum-exp in float64 as two float32 halves. Every rank merges the same
``[TP, rows, W + 2]`` payload (:func:`merge_cuts`):

* the merged, stably sorted values are the row's true order up to the first
  point where a rank that sent ``W`` finite values may hold more (``exact_len``):
  every unsent token of rank ``r`` comes after its ``W``-th sent entry;
* min-p keeps the tokens ``>= max + log(min_p)`` (value cut, ties kept: exact
  from the global max alone); top-k keeps the first ``min(n_minp, k)`` (exact
  because ``W >= k``: a token among the global top ``k`` is among its rank's top
  ``k``); top-p walks the cumulative mass of the kept candidates, normalised by
  the log-sum-exp of the candidate set (from the union when top-k/min-p bound
  it, else from the shard log-sum-exps), and keeps the shortest prefix whose
  mass reaches ``top_p``.
* The top-p cut is **exact** when the walk ends inside the exact prefix (no full
  rank's ``W``-th entry lies inside the nucleus before its last token) or the
  candidate set is bounded by top-k. Otherwise the row is *unresolved*: the caller repeats the
  round for those rows with a wider ``W`` and finally with the whole shard
  (always exact). Min-p with top-p and no top-k also needs ``n_minp`` to lie
  inside the exact prefix.

Masses are float64 on both sides (here and in the reference), so the cut agrees
with the full-vocabulary reference unless the cumulative mass lies within
~1e-15 of ``top_p``; :attr:`MergedCuts.margin` records the distance.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_kimi_ext.verify.rowmath import exclusive_cumsum, min_p_threshold, nucleus_margin

NEG_INF = float("-inf")
POS_INF = float("inf")


def _nucleus_count(before: torch.Tensor, top_p: torch.Tensor,
                   cand: torch.Tensor) -> torch.Tensor:
    """Candidates whose preceding mass is below ``top_p`` (a prefix; at least one)."""
    return ((before < top_p[:, None]) & cand).sum(dim=1).clamp(min=1)


def _log_normaliser(w: torch.Tensor, lse_all: torch.Tensor | None,
                    bounded: torch.Tensor) -> torch.Tensor:
    """log of the candidate set's total mass: from the union when top-k/min-p bound the
    set (it is then entirely in the union), else from the shard log-sum-exps."""
    lse_union = torch.logsumexp(w, dim=1)
    if lse_all is None:
        return lse_union
    return torch.where(bounded, lse_union, lse_all)


@dataclass
class MergedCuts:
    """The cut of each row, identical on every rank (computed from the gathered bytes)."""

    #: int64 ``[n, TP]``: entries of each rank inside the kept prefix.
    counts: torch.Tensor
    #: bool ``[n]``: min-p is the only mask: keep ``s >= value_cut`` (ties kept).
    value_only: torch.Tensor
    value_cut: torch.Tensor
    #: bool ``[n]``: the cut is exact (else: repeat the round wider).
    resolved: torch.Tensor
    #: float64 ``[n]``: nucleus margin (NaN where top-p is off).
    margin: torch.Tensor


def merge_cuts(vals: torch.Tensor, lse: torch.Tensor | None, top_k: torch.Tensor,
               min_p: torch.Tensor, top_p: torch.Tensor,
               rank_complete: torch.Tensor) -> MergedCuts:
    """Merge the gathered ``vals [TP, n, W]`` (each rank's :func:`local_top`) and
    ``lse [TP, n]`` (float64 shard log-sum-exps, or None when no row uses top-p).

    ``rank_complete [TP]``: the rank sent all its valid columns (``W >= n_valid``).
    Per row ``top_k`` (0 = off), ``min_p`` (0 = off), ``top_p`` (1 = off).
    """
    TP, n, W = vals.shape
    dev = vals.device
    flat = vals.permute(1, 0, 2).reshape(n, TP * W)  # rank-major: (rank, position) order
    sv, order = torch.sort(flat, dim=1, descending=True, stable=True)
    src = torch.div(order, W, rounding_mode="floor")
    pos = torch.arange(TP * W, device=dev)
    finite = sv > NEG_INF
    # Merged position of each rank's last sent entry; a full rank may hold more after it.
    inv = torch.empty_like(order)
    inv.scatter_(1, order, pos.expand(n, -1).contiguous())
    last_pos = inv[:, torch.arange(TP, device=dev) * W + (W - 1)]
    full = (vals[:, :, W - 1].T > NEG_INF) & ~rank_complete[None, :]
    unbounded = TP * W + 1
    exact_len = torch.where(full, last_pos + 1, torch.full_like(last_pos, unbounded)).min(1).values

    cut = min_p_threshold(sv[:, 0], min_p)
    n_minp = ((sv >= cut[:, None]) & finite).sum(dim=1)
    has_k = top_k > 0
    n_kept = torch.where(has_k, torch.minimum(n_minp, top_k), n_minp)
    nucleus = top_p < 1
    value_only = (min_p > 0) & ~has_k & ~nucleus
    resolved = torch.ones(n, dtype=torch.bool, device=dev)
    margin = torch.full((n,), float("nan"), dtype=torch.float64, device=dev)
    if bool(nucleus.any()):
        # Candidate set bounded by top-k/min-p and entirely known, or all finite tokens.
        bounded = has_k | (min_p > 0)
        known = has_k | (n_minp < exact_len)
        cand = torch.where(bounded[:, None], pos[None, :] < n_kept[:, None], finite)
        w = torch.where(cand, sv.double(), torch.full_like(sv, NEG_INF, dtype=torch.float64))
        norm = _log_normaliser(w, None if lse is None else torch.logsumexp(lse, dim=0), bounded)
        prob = torch.exp(w - norm[:, None])
        before, cum = exclusive_cumsum(prob)
        p = top_p.double()
        n_nuc = _nucleus_count(before, p, cand)
        through = cum.gather(1, (n_nuc - 1)[:, None]).squeeze(1)
        walk_ok = (exact_len == unbounded) | ((through >= p) & (n_nuc <= exact_len))
        resolved = torch.where(nucleus, torch.where(bounded, known, walk_ok), resolved)
        margin = torch.where(nucleus, nucleus_margin(before, cum, p, n_nuc), margin)
        n_kept = torch.where(nucleus, n_nuc, n_kept)
    in_prefix = (pos[None, :] < n_kept[:, None]).long()
    counts = torch.zeros((n, TP), dtype=torch.int64, device=dev).scatter_add_(1, src, in_prefix)
    return MergedCuts(counts=counts, value_only=value_only, value_cut=cut,
                      resolved=resolved, margin=margin)


def local_cut(vals: torch.Tensor, cols: torch.Tensor, merged: MergedCuts, rank: int,
              shard_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's ``(threshold, tie_col)`` per row from its own :func:`local_top`
    output and the merged counts: keep ``s > threshold`` or ``s == threshold`` at
    columns ``<= tie_col``."""
    c = merged.counts[:, rank]
    last = (c - 1).clamp(min=0)[:, None]
    thr = torch.where(c > 0, vals.gather(1, last).squeeze(1), torch.full_like(vals[:, 0], POS_INF))
    lim = torch.where(c > 0, cols.gather(1, last).squeeze(1), torch.full_like(c, -1))
    thr = torch.where(merged.value_only, merged.value_cut.to(thr.dtype), thr)
    lim = torch.where(merged.value_only, torch.full_like(lim, shard_width), lim)
    return thr, lim
