"""Statistical exactness: the first emitted token is distributed as the target p.

Speculative sampling is lossless: whatever the draft proposes, the first token
a request emits (the accepted draft or the recovered token) follows the
target distribution ``p`` of row 0. For each mode, 100,000 requests (one per
seed, all in one batch) over a small vocabulary are verified and the first
tokens' histogram is compared with ``p`` by Pearson's chi-square test.

Threshold: the correct verifier must reach a p-value >= ``ALPHA = 1e-4``; a
deliberately wrong verifier (recovered token sampled from ``p`` instead of the
residual, or acceptance with ``p(x)`` instead of ``min(1, p(x)/q(x))``) must
fail the same test (p-value < ``ALPHA``; in practice its statistic is in the
thousands). Seeds are fixed, so the outcome is deterministic. Both the
reference and the product's sharded step (``GraphVerifyStep``, TP=4, V=18: the last
shard is padded) are checked; the sharded step's wrong variants are the same two bugs
planted into its torch stages.
"""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch

import vllm_kimi_ext.verify.escalate.rows as escalate_rows
import vllm_kimi_ext.verify.merge as merge_round
import vllm_kimi_ext.verify.stats as stats_round
from testkit.verify_equivalence import chi_square
from testkit.verify_simulate import simulate_sharded_verify
from vllm_kimi_ext.verify import ReferenceVerifier, VerifyBatch

N = 100_000
V = 18
TP = 4
ALPHA = 1e-4



pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

# --- deliberately wrong verifiers --------------------------------------------
class RefRecoverFromP(ReferenceVerifier):
    exclude_rejected_draft = False


@contextlib.contextmanager
def shard_recover_from_p():
    """The step's recovered token sampled from ``p`` (the draft not excluded): in the
    statistics of rows without a cut and in the candidates' Gumbel-max of rows with one."""
    mp = pytest.MonkeyPatch()
    real_stats, real_merge = stats_round.shard_local_stats, merge_round.merge_round1_torch

    def stats(*a, **k):
        return real_stats(*a, **{**k, "exclude_draft": False})

    def merge(g, inp, *a, **k):
        m = real_merge(g, inp, *a, **k)
        blind = real_merge(g, merge_round.StepInputs(**{**inp.__dict__,
                                                        "draft": torch.full_like(inp.draft, -1)}),
                           *a, **k)
        m.gval, m.gidx = blind.gval, blind.gidx
        return m

    mp.setattr(stats_round, "shard_local_stats", stats)
    mp.setattr(merge_round, "merge_round1_torch", merge)
    try:
        yield
    finally:
        mp.undo()


class RefAcceptWithP(ReferenceVerifier):
    def _log_accept_ratio(self, s_x, logq_x, lse):
        return s_x - lse


@contextlib.contextmanager
def shard_accept_with_p():
    """The owner of ``x`` sends ``s_x`` instead of ``s_x - log q(x)``: acceptance with
    ``p(x)`` (log q read as 0)."""
    mp = pytest.MonkeyPatch()
    zero = lambda q, ids, v: torch.zeros(ids.shape, device=ids.device)  # noqa: E731
    for module in (stats_round, merge_round, escalate_rows):  # every reader of log q
        mp.setattr(module, "logq_at", zero)
    try:
        yield
    finally:
        mp.undo()


# --- modes -------------------------------------------------------------------
def _target_logits():
    g = torch.Generator().manual_seed(2024)
    return torch.randn(V, generator=g) * 1.5


@functools.lru_cache(maxsize=2)
def _mode(name):
    """Returns (logits [2N, V], batch, draft_probs or None, expected p, wrong verifiers)."""
    z0 = _target_logits()
    g = torch.Generator().manual_seed(MODE_SEEDS[name])
    temp, top_k, min_p, probabilistic = 1.0, 0, 0.0, False
    if name == "onehot":
        pass
    elif name == "temperature":
        temp = 0.6
    elif name == "top_k":
        top_k = 5
    elif name == "min_p":
        min_p = 0.15
    elif name == "probabilistic":
        probabilistic = True
    elif name == "probabilistic_t17_topk":
        probabilistic, temp, top_k = True, 1.7, 8
    else:
        raise KeyError(name)
    s = z0 / temp
    if min_p:
        s = torch.where(s < s.max() + torch.log(torch.tensor(min_p)), float("-inf"), s)
    if top_k:
        kth = torch.topk(s, top_k).values[-1]
        s = torch.where(s < kth, float("-inf"), s)
    p = torch.softmax(s, dim=0)
    # draft distribution: a perturbed, flattened target (mass on masked tokens too)
    q0 = torch.softmax(z0 * 0.7 + torch.randn(V, generator=g), dim=0)
    x = torch.multinomial(q0, N, replacement=True, generator=g)
    logits = z0[None, :].expand(2 * N, V).contiguous()
    batch = VerifyBatch.from_draft_tokens(
        x[:, None], torch.full((N,), temp), torch.arange(N) * 7919 + 17,
        top_k=torch.full((N,), top_k), min_p=torch.full((N,), min_p))
    q = q0[None, :].expand(2 * N, V).contiguous() if probabilistic else None
    wrong = (RefAcceptWithP, shard_accept_with_p) if probabilistic else (
        RefRecoverFromP, shard_recover_from_p)
    return logits, batch, q, p, wrong


MODES = ["onehot", "temperature", "top_k", "min_p", "probabilistic", "probabilistic_t17_topk"]
MODE_SEEDS = {m: 101 + 7 * i for i, m in enumerate(MODES)}


def _first_token_counts(out):
    first = out.sampled[:, 0]
    assert bool((first >= 0).all()) and bool((first < V).all())
    return torch.bincount(first, minlength=V)


def _run(kind, variant, logits, batch, q):
    if kind == "reference":
        return variant(V).verify(logits, batch, q)
    with variant():
        out, _, _ = simulate_sharded_verify(logits, batch, TP, V, q, pad_value=1e30)
    return out


@pytest.mark.parametrize("kind", ["reference", "sharded"])
@pytest.mark.parametrize("mode", MODES)
def test_first_token_matches_target(mode, kind):
    logits, batch, q, p, wrong = _mode(mode)
    good_cls = ReferenceVerifier if kind == "reference" else contextlib.nullcontext
    bad_cls = wrong[0] if kind == "reference" else wrong[1]

    counts = _first_token_counts(_run(kind, good_cls, logits, batch, q))
    assert int(counts[p == 0].sum()) == 0, "a masked token was emitted"
    stat, pval, dof = chi_square(counts, p)
    assert pval >= ALPHA, f"{mode}/{kind}: chi2={stat:.1f} dof={dof} p={pval:.2e}"

    bad_counts = _first_token_counts(_run(kind, bad_cls, logits, batch, q))
    bstat, bpval, _ = chi_square(bad_counts, p)
    assert bpval < ALPHA, f"wrong verifier passed: chi2={bstat:.1f} p={bpval:.2e}"
    assert bstat > 10 * stat


def test_greedy_draft_acceptance_rate_is_p_of_draft():
    """One-hot drafts: P(accept x) = p(x) (checked per draft token, binomial z-score)."""
    logits, batch, _, p, _ = _mode("onehot")
    out = ReferenceVerifier(V).verify(logits, batch)
    x = batch.draft_token_ids.view(N, 2)[:, 0]
    acc = (out.num_sampled == 2).double()
    for t in range(V):
        m = x == t
        n = int(m.sum())
        if n < 500:
            continue
        rate = float(acc[m].mean())
        sd = (float(p[t]) * (1 - float(p[t])) / n) ** 0.5
        assert abs(rate - float(p[t])) < 5 * sd + 1e-9, (t, rate, float(p[t]))
