"""Comparison helpers of the verification tests and benchmarks (no pytest dependency).

* :func:`assert_equivalent`: token-for-token comparison of two verifiers, where
  the only tolerated difference is a *certified* rounding flip: an accept test
  whose uniform lies within ``margin_tol`` (in log space) of ``p(x)/q(x)``, or
  a probabilistic-draft residual sample whose two candidates' residual scores
  are within ``score_tol`` of each other, or a top-p nucleus whose cumulative
  mass lies within ``nucleus_tol`` of ``top_p`` (float64 on both sides). Greedy
  and one-hot decisions must be identical.
* :func:`chi_square`: Pearson statistic and p-value (via the regularized upper
  incomplete gamma function, no scipy needed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_kimi_ext.verify.batch import VerifyBatch, VerifyOutput
from vllm_kimi_ext.verify.hashing import DOMAIN_GUMBEL, gumbel_noise, row_keys
from vllm_kimi_ext.verify.reference import ReferenceVerifier
from vllm_kimi_ext.verify.rowmath import residual_log_weights


@dataclass
class EquivalenceReport:
    num_reqs: int
    identical: int
    certified_accept_flips: int
    certified_residual_ties: int


def assert_equivalent(
    ref: VerifyOutput,
    other: VerifyOutput,
    batch: VerifyBatch,
    *,
    logits: torch.Tensor | None = None,
    vocab_size: int | None = None,
    draft_probs: torch.Tensor | None = None,
    margin_tol: float = 1e-4,
    score_tol: float = 1e-4,
    max_flip_fraction: float = 1e-3,
    allow_score_ties: bool = False,
    nucleus_tol: float = 1e-9,
) -> EquivalenceReport:
    """Compare two outputs request by request (see module docstring).

    ``allow_score_ties`` also certifies one-hot/bonus Gumbel-max near-ties (needed
    when the two sides use different backends, e.g. Triton vs torch, whose
    ``log`` differ by ulps); on one backend those scores are bitwise equal and
    any difference is a bug.
    """
    L = batch.layout()
    a_tok, b_tok = ref.tokens(), other.tokens()
    cu = batch.cu_num_rows.tolist()
    flips = ties = same = 0
    greedy = (L.temperature_per_req() == 0).tolist()
    for i, (a, b) in enumerate(zip(a_tok, b_tok)):
        if a == b:
            same += 1
            continue
        assert not greedy[i], f"greedy request {i} differs: {a} vs {b}"
        pos = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
        row = cu[i] + pos
        # Decision at `pos` differs (accept in one, reject in the other) or both
        # rejected at `pos` and sampled different tokens.
        ma = float(ref.accept_margin[row]) if ref.accept_margin is not None else float("nan")
        mb = float(other.accept_margin[row]) if other.accept_margin is not None else float("nan")
        nucleus = [float(o.nucleus_margin[row]) for o in (ref, other)
                   if o.nucleus_margin is not None]
        if any(abs(x) < nucleus_tol for x in nucleus):
            flips += 1  # the nucleus itself sits within float rounding of top_p
            continue
        len_differs = (len(a) != len(b)) or (pos < len(a) - 1) or (pos < len(b) - 1)
        if len_differs:
            assert abs(ma) < margin_tol or abs(mb) < margin_tol, (
                f"request {i}: accept decisions differ at step {pos} away from the "
                f"threshold (margins {ma:.3g} vs {mb:.3g}): {a} vs {b}")
            flips += 1
            continue
        # Same accepted prefix, different recovered/bonus token: legitimate only
        # for probabilistic residuals (scores depend on the rounding of LSE) or
        # across backends (allow_score_ties).
        assert logits is not None and vocab_size is not None and (
            draft_probs is not None or allow_score_ties), (
            f"request {i}: recovered token differs with no float-sensitive step: {a} vs {b}")
        V = vocab_size
        rv = ReferenceVerifier(V)
        s = rv.masked_scaled_logits(logits, L)[row : row + 1].cpu()
        h1, h2 = row_keys(L.seeds[row : row + 1], L.positions[row : row + 1], DOMAIN_GUMBEL)
        g = gumbel_noise(h1.cpu(), h2.cpu(), torch.arange(V))
        d = int(L.draft[row])
        if draft_probs is not None and d >= 0:
            logp = s - torch.logsumexp(s, dim=1, keepdim=True)
            q = draft_probs[row : row + 1, :V].float().cpu()
            sc = (residual_log_weights(logp, torch.log(q)) + g)[0]
        else:
            sc = (s + g)[0]
            if d >= 0:  # one-hot residual: the rejected draft can never be emitted
                sc[d] = float("-inf")
        gap = abs(float(sc[a[pos]]) - float(sc[b[pos]]))
        assert gap < score_tol * max(1.0, abs(float(sc[a[pos]]))), (
            f"request {i}: sampled tokens differ by {gap:.3g} in score: {a} vs {b}")
        ties += 1
    n = len(a_tok)
    assert flips + ties <= max(1, int(max_flip_fraction * n)), (
        f"too many rounding-level differences: {flips} flips, {ties} ties of {n}")
    return EquivalenceReport(n, same, flips, ties)


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, float, int]:
    """Pearson chi-square of ``counts`` against ``probs``; returns ``(stat, p_value, dof)``.

    Categories with zero expected probability are excluded (the caller should
    separately assert that they were never drawn).
    """
    counts = counts.double()
    probs = probs.double()
    n = counts.sum()
    keep = probs > 0
    exp = probs[keep] / probs[keep].sum() * n
    stat = float(((counts[keep] - exp) ** 2 / exp).sum())
    dof = int(keep.sum()) - 1
    p = float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                      torch.tensor(stat / 2.0, dtype=torch.float64)))
    return stat, p, dof
