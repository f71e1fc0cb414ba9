"""Full-vocabulary reference verifier: vLLM's standard rejection rules, plainly.

For each request with draft tokens ``x_1..x_k`` and target rows ``0..k``
(row ``k`` is the bonus row):

* Greedy request (temperature 0): accept ``x_i`` iff ``x_i == argmax z_i`` (ties:
  lowest token id); at the first rejection emit ``argmax z_i``; if all pass, emit
  the bonus ``argmax z_k``.
* Sampling request: target ``p_i = softmax(mask(z_i / T))`` where ``mask`` applies
  min-p, then top-k, then top-p in vLLM 0.34.0's order (:func:`sampling_keep_mask`).
  Accept ``x_i`` with probability ``min(1, p_i(x_i) / q_i(x_i))``
  (``q = 1`` for one-hot drafts); on the first rejection sample from
  ``norm(max(0, p_i - q_i))``; if all pass sample the bonus from ``p_k``. With
  top-p, ``p_i`` is the nucleus-renormalised distribution in all three.

The mask, on the scaled row ``s = z / T`` sorted by (value descending, token id
ascending), keeps a prefix of ``N`` tokens:

* min-p: ``n_minp`` = number of tokens with ``s >= max(s) + log(min_p)`` (all tokens
  tied with the cut are kept, as vLLM's ``logits < threshold -> -inf``);
* top-k: ``N1 = min(n_minp, k)`` (exactly ``k``; tokens tied with the ``k``-th
  value are kept lowest id first, as vLLM's Triton top-k kernel does);
* top-p: with ``pi`` the softmax over those ``N1`` tokens, the smallest prefix
  whose mass reaches ``top_p``: token ``i`` is kept iff the mass of the tokens
  before it is ``< top_p`` (always at least one). Ties at the cut: lowest id
  first. Masses are computed in float64 (the real-number definition to ~1e-15;
  vLLM's kernels use float32, see ``docs/sharded-verification.md``).

Randomness is counter-based (:mod:`.hashing`): the accept test of row ``j`` uses
``u(seed, pos_j)``; sampling uses Gumbel-max with noise ``g(seed, pos_j, v)``
per token ``v``. Sampling from a distribution with log-weights ``w_v`` (``-inf``
for impossible tokens) is ``argmax_v (w_v + g_v)``; the argmax is invariant to
adding a per-row constant, so the reference uses ``w = z / T`` (not
``log p = z / T - LSE``) for the target and for the one-hot residual, which
makes its per-token scores bitwise identical to the ones a vocabulary shard
computes without knowing the global LSE.

The one-hot residual is exact: with ``q = delta_x``,
``max(0, p - q) = p`` off ``x`` and ``0`` at ``x``, i.e. ``p`` with ``x`` removed,
so the recovered token is the Gumbel-max over ``z / T`` with ``x`` excluded.
For probabilistic drafts the residual log-weights are
``log p + log1p(-q / p)`` where ``q < p`` and ``-inf`` elsewhere.

This module is the oracle of the sharded verifier's tests; it favours clarity
over speed (but is vectorised, so 1e5-row statistical tests stay fast).
"""

from __future__ import annotations

import torch

from .batch import RowLayout, VerifyBatch, VerifyOutput, assemble_output, first_rejection
from .hashing import DOMAIN_GUMBEL, accept_uniform, gumbel_noise, row_keys

NEG_INF = float("-inf")


def sampling_keep_mask(s: torch.Tensor, top_k: torch.Tensor, min_p: torch.Tensor,
                       top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept tokens ``[rows, V]`` of min-p, top-k, top-p (see module docstring) and the
    nucleus margin ``[rows]`` (float64, NaN where top-p is off).

    ``top_k``: 0 = off; ``min_p``: 0 = off; ``top_p``: 1 = off. Plainly by a full
    stable sort of each row.
    """
    vals, ids = torch.sort(s, dim=1, descending=True, stable=True)
    pos = torch.arange(s.shape[1], device=s.device)[None, :]
    finite = vals > NEG_INF
    # min-p: every token at or above max + log(min_p) (all of them where min-p is off)
    off = min_p <= 0
    cut = vals[:, 0] + torch.log(torch.where(off, torch.ones_like(min_p), min_p))
    cut = torch.where(off, torch.full_like(cut, NEG_INF), cut)
    n_kept = ((vals >= cut[:, None]) & finite).sum(dim=1)
    n_kept = torch.where(top_k > 0, torch.minimum(n_kept, top_k), n_kept)
    margin = torch.full((s.shape[0],), float("nan"), dtype=torch.float64, device=s.device)
    nucleus = top_p < 1
    if bool(nucleus.any()):
        cand = pos < n_kept[:, None]
        w = torch.where(cand, vals.double(), torch.full_like(vals, NEG_INF, dtype=torch.float64))
        prob = torch.exp(w - torch.logsumexp(w, dim=1, keepdim=True))
        cum = torch.cumsum(prob, dim=1)  # mass through each position
        before = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=1)
        p = top_p.double()
        # token i is kept iff the mass before it is below top_p (at least one token)
        n_nuc = ((before < p[:, None]) & cand).sum(dim=1).clamp(min=1)
        # the margin: distance of top_p from the mass on either side of the cut
        last = (n_nuc - 1).clamp(min=0)[:, None]
        through = cum.gather(1, last).squeeze(1)
        above = torch.where(through >= p, through - p, torch.full_like(through, float("inf")))
        margin = torch.where(nucleus, torch.minimum(p - before.gather(1, last).squeeze(1),
                                                    above), margin)
        n_kept = torch.where(nucleus, n_nuc, n_kept)
    keep = torch.zeros_like(s, dtype=torch.bool)
    keep.scatter_(1, ids, pos < n_kept[:, None])
    return keep, margin


class ReferenceVerifier:
    """Plain verification over full ``[num_rows, V]`` target logits."""

    def __init__(self, vocab_size: int):
        self.vocab_size = int(vocab_size)

    # --- hooks (overridden by the deliberately wrong verifiers of the tests) ---
    def _log_accept_ratio(self, s_x, logq_x, lse):
        """log(p(x) / q(x)); the accept test is ``log_ratio > log(u)``."""
        return (s_x - logq_x) - lse

    #: Remove the rejected one-hot draft token before resampling (the residual).
    exclude_rejected_draft: bool = True

    def _residual(self, logp, logq):
        """``log(max(0, p - q))``: ``log p + log(1 - q / p)`` where ``q < p``, else ``-inf``."""
        ok = logq < logp
        ratio = torch.exp(torch.where(ok, logq - logp, torch.zeros_like(logp)))
        return torch.where(ok, logp + torch.log1p(-ratio), torch.full_like(logp, NEG_INF))

    # ---------------------------------------------------------------------
    def masked_scaled_logits(self, logits: torch.Tensor, layout: RowLayout) -> torch.Tensor:
        """``mask(z / T)`` for every row (masks only on sampling rows)."""
        return self._masked_scaled(logits, layout)[0]

    def _masked_scaled(self, logits: torch.Tensor, layout: RowLayout):
        # z / T in float32 (greedy rows, T = 0, unscaled): the shards' own division
        t = layout.temperature.to(torch.float32)
        safe_t = torch.where(t == 0, torch.ones_like(t), t)
        s = logits[:, : self.vocab_size].float() / safe_t[:, None]
        top_k = layout.effective_top_k(self.vocab_size)[layout.req_of_row]
        min_p = layout.effective_min_p()[layout.req_of_row]
        top_p = layout.effective_top_p()[layout.req_of_row]
        margin = torch.full((s.shape[0],), float("nan"), dtype=torch.float64, device=s.device)
        need = (top_k > 0) | (min_p > 0) | (top_p < 1)
        if bool(need.any()):
            rows = need.nonzero().squeeze(1)
            sr = s[rows]
            keep, m = sampling_keep_mask(sr, top_k[rows], min_p[rows], top_p[rows])
            s[rows] = sr.masked_fill(~keep, NEG_INF)
            margin[rows] = m
        return s, margin

    def verify(
        self,
        logits: torch.Tensor,
        batch: VerifyBatch,
        draft_probs: torch.Tensor | None = None,
    ) -> VerifyOutput:
        """Verify a batch. ``logits [num_rows, >= V]``; ``draft_probs [num_rows, >= V]`` or None."""
        L = batch.layout()
        V = self.vocab_size
        dev = logits.device
        n = L.num_rows
        greedy = L.temperature == 0
        s, nuc_margin = self._masked_scaled(logits, L)
        x = L.draft.clamp(min=0, max=V - 1)
        valid_draft = (L.draft >= 0) & (L.draft < V)

        # Greedy rows.
        argmax = torch.argmax(s, dim=1)  # first occurrence = lowest id on ties
        accept_greedy = valid_draft & (argmax == L.draft)

        # Sampling rows.
        lse = torch.logsumexp(s, dim=1)
        s_x = s.gather(1, x[:, None]).squeeze(1)
        probabilistic = draft_probs is not None
        if probabilistic:
            q = draft_probs[:, :V].float()
            logq_x = torch.log(q.gather(1, x[:, None]).squeeze(1))
        else:
            logq_x = torch.zeros(n, device=dev)
        log_ratio = self._log_accept_ratio(s_x, logq_x, lse)
        log_u = torch.log(accept_uniform(L.seeds, L.positions))
        margin = log_ratio - log_u
        accept_sample = valid_draft & (margin > 0)

        accept = torch.where(greedy, accept_greedy, accept_sample) & ~L.is_bonus
        num_accepted, drow = first_rejection(L, accept)

        # Decision tokens (only the decision row of each request is sampled).
        d_greedy = greedy[drow]
        d_s = s[drow]
        h1, h2 = row_keys(L.seeds[drow], L.positions[drow], DOMAIN_GUMBEL)
        g = gumbel_noise(h1, h2, torch.arange(V, device=dev))
        d_draft = L.draft[drow]
        d_valid = (d_draft >= 0) & (d_draft < V)
        cols = torch.arange(V, device=dev)[None, :]
        target_scores = d_s + g  # sample from p: Gumbel-max over z/T
        if probabilistic:
            logp = d_s - lse[drow][:, None]
            res = self._residual(logp, torch.log(q[drow]))
            res_scores = res + g
            res_best = res_scores.max(dim=1).values
            use_res = d_valid & (res_best > NEG_INF)
            scores = torch.where(use_res[:, None], res_scores, target_scores)
        else:
            excl = d_valid & self.exclude_rejected_draft
            drop = excl[:, None] & (cols == d_draft.clamp(min=0)[:, None])
            scores = torch.where(drop, torch.full_like(target_scores, NEG_INF), target_scores)
        sampled_tok = torch.argmax(scores, dim=1)
        token = torch.where(d_greedy, argmax[drow], sampled_tok)
        margin = torch.where(greedy, torch.full_like(margin, float("nan")), margin)
        return assemble_output(L, num_accepted, drow, token, accept_margin=margin,
                               nucleus_margin=nuc_margin)
