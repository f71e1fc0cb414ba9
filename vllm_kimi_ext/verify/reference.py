"""Full-vocabulary reference verifier: vLLM's standard rejection rules, plainly.

For each request with draft tokens ``x_1..x_k`` and target rows ``0..k``
(row ``k`` is the bonus row):

* Greedy request (temperature 0): accept ``x_i`` iff ``x_i == argmax z_i`` (ties:
  lowest token id); at the first rejection emit ``argmax z_i``; if all pass, emit
  the bonus ``argmax z_k``.
* Sampling request: target ``p_i = softmax(mask(z_i / T))`` where ``mask`` applies
  min-p then top-k exactly as vLLM does (``logits < threshold -> -inf``, ties
  kept). Accept ``x_i`` with probability ``min(1, p_i(x_i) / q_i(x_i))``
  (``q = 1`` for one-hot drafts); on the first rejection sample from
  ``norm(max(0, p_i - q_i))``; if all pass sample the bonus from ``p_k``.

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


def scale_logits(z: torch.Tensor, temperature_rows: torch.Tensor) -> torch.Tensor:
    """``z / T`` in float32 per row (greedy rows, ``T == 0``, are left unscaled).

    Shared by the reference and the shards so that every element is produced by
    the same float32 division.
    """
    z = z.float()
    t = temperature_rows.to(torch.float32)
    safe = torch.where(t == 0, torch.ones_like(t), t)
    return z / safe[:, None]


def min_p_threshold(row_max: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """vLLM's min-p cut on temperature-scaled logits: ``max + log(min_p)`` (-inf if off)."""
    cut = row_max + torch.log(torch.where(min_p > 0, min_p, torch.ones_like(min_p)))
    return torch.where(min_p > 0, cut, torch.full_like(cut, NEG_INF))


def combine_thresholds(kth: torch.Tensor, minp_cut: torch.Tensor) -> torch.Tensor:
    """Min-p followed by top-k (vLLM's order) equals one cut at ``max(kth, minp_cut)``.

    Min-p keeps an upper set ``A = {s >= c}``. If ``|A| >= k`` the k largest
    values all lie in ``A`` so top-k's k-th value is unchanged (``>= c``); if
    ``|A| < k`` the k-th value of the masked row is ``-inf`` (top-k masks
    nothing more) and the unmasked k-th value is ``< c``. Either way the kept
    set is ``{s >= max(kth, c)}``.
    """
    return torch.maximum(kth, minp_cut)


def residual_log_weights(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """``log(max(0, p - q))`` computed as ``log p + log1p(-q/p)`` (``-inf`` where ``q >= p``)."""
    ok = logq < logp
    diff = torch.where(ok, logq - logp, torch.zeros_like(logp))
    return torch.where(ok, logp + torch.log1p(-torch.exp(diff)), torch.full_like(logp, NEG_INF))


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
        return residual_log_weights(logp, logq)

    # ---------------------------------------------------------------------
    def masked_scaled_logits(self, logits: torch.Tensor, layout: RowLayout) -> torch.Tensor:
        """``mask(z / T)`` for every row (masks only on sampling rows)."""
        s = scale_logits(logits[:, : self.vocab_size], layout.temperature)
        top_k = layout.effective_top_k(self.vocab_size)[layout.req_of_row]
        min_p = layout.effective_min_p()[layout.req_of_row]
        need = (top_k > 0) | (min_p > 0)
        if bool(need.any()):
            rows = need.nonzero().squeeze(1)
            sr = s[rows]
            kmax = int(top_k[rows].max())
            if kmax > 0:
                vals = torch.topk(sr, kmax, dim=1).values
                k = top_k[rows]
                kth = vals.gather(1, (k.clamp(min=1) - 1)[:, None]).squeeze(1)
                kth = torch.where(k > 0, kth, torch.full_like(kth, NEG_INF))
            else:
                kth = torch.full((rows.numel(),), NEG_INF, device=s.device)
            cut = combine_thresholds(kth, min_p_threshold(sr.max(dim=1).values, min_p[rows]))
            s[rows] = torch.where(sr < cut[:, None], torch.full_like(sr, NEG_INF), sr)
        return s

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
        s = self.masked_scaled_logits(logits, L)
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
        return assemble_output(L, num_accepted, drow, token, accept_margin=margin)
