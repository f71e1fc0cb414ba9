"""Sharded verification == full-vocabulary reference, token for token.

In-process simulation (one thread per rank, real all-gather semantics) at
TP = 1, 2, 4, 8 over random and adversarial inputs. The only tolerated
difference is a certified rounding flip of a sampling accept test (see
``assert_equivalent``); greedy and one-hot recovery must be identical, and all
ranks must return identical outputs.
"""

from __future__ import annotations

import math

import pytest
import torch

from testkit.verify_equivalence import assert_equivalent
from testkit.verify_simulate import simulate_sharded_verify
from vllm_kimi_ext.verify import ReferenceVerifier, VerifyBatch

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

TPS = [1, 2, 4, 8]


def _check(logits, batch, V, tp, draft_probs=None, shard_width=None, pad_value=0.0):
    ref = ReferenceVerifier(V).verify(logits, batch, draft_probs)
    out, group, outs = simulate_sharded_verify(
        logits, batch, tp, V, draft_probs, shard_width=shard_width, pad_value=pad_value)
    for o in outs[1:]:
        assert torch.equal(o.sampled, out.sampled) and torch.equal(o.num_sampled, out.num_sampled)
    rep = assert_equivalent(ref, out, batch, logits=logits, vocab_size=V, draft_probs=draft_probs)
    return ref, out, group, rep


def _random_batch(g, num_reqs, V, k_max, *, greedy_frac=0.3, top_k_frac=0.0, min_p_frac=0.0,
                  placeholder_frac=0.0, vary_k=True):
    ks = torch.randint(0 if vary_k else k_max, k_max + 1, (num_reqs,), generator=g).tolist()
    drafts = []
    for k in ks:
        d = torch.randint(0, V, (k,), generator=g)
        if placeholder_frac:
            d = torch.where(torch.rand(k, generator=g) < placeholder_frac, -1, d)
        drafts.append(d.tolist())
    temps = torch.rand(num_reqs, generator=g) * 1.9 + 0.1
    temps = torch.where(torch.rand(num_reqs, generator=g) < greedy_frac, 0.0, temps)
    top_k = torch.randint(1, max(2, V // 2), (num_reqs,), generator=g)
    top_k = torch.where(torch.rand(num_reqs, generator=g) < top_k_frac, top_k, 0)
    min_p = torch.rand(num_reqs, generator=g) * 0.3
    min_p = torch.where(torch.rand(num_reqs, generator=g) < min_p_frac, min_p, 0.0)
    seeds = torch.randint(-(2**62), 2**62, (num_reqs,), generator=g)
    return VerifyBatch.from_draft_tokens(drafts, temps, seeds, top_k=top_k, min_p=min_p)


def _draft_aligned_logits(g, batch, V, scale=3.0, hit=0.5, boost=6.0):
    """Random logits where a fraction of draft tokens is made likely (long acceptances)."""
    n = batch.num_rows
    z = torch.randn(n, V, generator=g) * scale
    L = batch.layout()
    d = L.draft
    boost_rows = (d >= 0) & (torch.rand(n, generator=g) < hit)
    rows = boost_rows.nonzero().squeeze(1)
    z[rows, d[rows]] = z[rows].max(dim=1).values + boost
    return z


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("V", [37, 64, 101])
def test_random_mixed_batches(tp, V):
    g = torch.Generator().manual_seed(1000 * tp + V)
    for _trial in range(3):
        b = _random_batch(g, 40, V, 4, greedy_frac=0.35, top_k_frac=0.3, min_p_frac=0.2,
                          placeholder_frac=0.05)
        z = _draft_aligned_logits(g, b, V)
        _check(z, b, V, tp)


@pytest.mark.parametrize("tp", TPS)
def test_wide_sweep_many_rows(tp):
    """Many rows, long acceptances, different temperatures per request."""
    V = 257
    g = torch.Generator().manual_seed(7 + tp)
    b = _random_batch(g, 300, V, 5, greedy_frac=0.25, top_k_frac=0.25, vary_k=False)
    z = _draft_aligned_logits(g, b, V, hit=0.8, boost=9.0)
    ref, _out, _, _rep = _check(z, b, V, tp)
    # the sweep exercises all acceptance lengths
    assert set(ref.num_sampled.tolist()) == set(range(1, 7))


@pytest.mark.parametrize("tp", TPS)
def test_probabilistic_drafts(tp):
    V = 53
    g = torch.Generator().manual_seed(31 + tp)
    b = _random_batch(g, 200, V, 3, greedy_frac=0.2, top_k_frac=0.3, vary_k=True)
    z = _draft_aligned_logits(g, b, V, hit=0.6, boost=3.0)
    qlogits = z + torch.randn(z.shape, generator=g) * 1.5
    q = torch.softmax(qlogits, dim=1)
    # drafts sampled from q (what a probabilistic drafter does)
    L = b.layout()
    x = torch.multinomial(q, 1, generator=g).squeeze(1)
    b = b.replace(draft_token_ids=torch.where(L.is_bonus, -1, x))
    _ref, _out, group, _ = _check(z, b, V, tp, draft_probs=q)
    # statistics + candidates (top-k rows), then the residual round (rows without a cut)
    assert [shape for shape, _ in group.calls[0]] == [(b.num_rows, 5 + 2 * min(128, -(-V // tp))),
                                                      (b.num_reqs, 2)]


@pytest.mark.parametrize("tp", TPS)
def test_greedy_ties_across_shards(tp):
    """Integer-valued logits: argmax ties everywhere, including across shard borders."""
    V = 40
    g = torch.Generator().manual_seed(5)
    z = torch.randint(0, 3, (64, V), generator=g).float()
    z[:, 0] = -1  # lowest id loses the tie -> first max is somewhere inside
    drafts = [[int(torch.argmax(z[2 * i]))] for i in range(32)]
    b = VerifyBatch.from_draft_tokens(drafts, [0.0] * 32, list(range(32)))
    _ref, out, _, rep = _check(z, b, V, tp)
    assert rep.identical == 32
    # expected: lowest-id argmax
    for i in range(32):
        tok = out.tokens()[i]
        assert tok[0] == int((z[2 * i] == z[2 * i].max()).nonzero()[0])


@pytest.mark.parametrize("tp", TPS)
def test_ties_for_sampling_thresholds(tp):
    """Top-k with ties at the k-th value keeps all tied tokens (vLLM's `logits < kth`)."""
    V = 30
    g = torch.Generator().manual_seed(9)
    z = torch.randint(0, 4, (80, V), generator=g).float()
    b = VerifyBatch.from_draft_tokens(torch.randint(0, V, (40, 1), generator=g),
                                      [1.0] * 40, list(range(40)), top_k=[3] * 40)
    _check(z, b, V, tp)


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_extreme_logits(tp, dtype):
    V = 45
    g = torch.Generator().manual_seed(11)
    n_req, k = 30, 3
    z = torch.randn(n_req * (k + 1), V, generator=g) * 5
    big = {torch.float32: 1e4, torch.float16: 65504.0, torch.bfloat16: 3.0e38}[dtype]
    z[::3, 7] = big
    z[1::4, 20:30] = -math.inf
    z[2::5, :] = -1e4
    z[3::7, 33] = big  # second huge token on another shard
    z = z.to(dtype)
    drafts = torch.randint(0, V, (n_req, k), generator=g)
    drafts[::2, 0] = 7
    drafts[1::3, 1] = 25  # a -inf token (p = 0 -> always rejected)
    temps = torch.tensor([0.0, 1.0, 1.5, 3.0, 0.0, 1.0] * 5)
    b = VerifyBatch.from_draft_tokens(drafts, temps, list(range(100, 100 + n_req)))
    _check(z, b, V, tp)


@pytest.mark.parametrize("tp", [2, 3, 4, 8])
def test_draft_on_shard_boundaries_and_padding(tp):
    V = 50  # not divisible by 3, 4, 8
    S = -(-V // tp)
    boundary = sorted({t for r in range(1, tp) for t in (r * S - 1, r * S) if 0 <= t < V}
                      | {0, V - 1})
    n = len(boundary)
    g = torch.Generator().manual_seed(13)
    z = torch.randn(2 * n, V, generator=g)
    z[torch.arange(0, 2 * n, 2), torch.tensor(boundary)] += 8.0  # accepted...
    drafts = [[t] for t in boundary]
    for temps in ([0.0] * n, [1.0] * n, [0.5] * n):
        b = VerifyBatch.from_draft_tokens(drafts, temps, list(range(n)))
        # padded columns are garbage that must never win: huge values, NaN
        for pad in (1e30, float("nan")):
            _ref, out, _, _ = _check(z, b, V, tp, pad_value=pad)
            assert all(0 <= t < V for row in out.tokens() for t in row)
        # wider-than-needed shards (vLLM pads the vocabulary to a multiple)
        _check(z, b, V, tp, shard_width=S + 3, pad_value=1e30)


@pytest.mark.parametrize("tp", TPS)
def test_all_accepted_first_rejected_last_rejected(tp):
    V, k = 33, 4
    n = 12
    g = torch.Generator().manual_seed(17)
    drafts = torch.randint(0, V, (n, k), generator=g)
    z = torch.randn(n * (k + 1), V, generator=g)
    expect = []
    for i in range(n):
        case = i % 3
        for j in range(k):
            row = i * (k + 1) + j
            x = int(drafts[i, j])
            if case == 0 or (case == 2 and j < k - 1):
                z[row, x] = 60.0  # p(x) ~ 1 and the argmax
            elif (case == 1 and j == 0) or (case == 2 and j == k - 1):
                z[row, x] = -math.inf  # p(x) = 0 and not the argmax
        expect.append({0: k + 1, 1: 1, 2: k}[case])
    for temp in (0.0, 1.0, 0.8):
        b = VerifyBatch.from_draft_tokens(drafts, [temp] * n, list(range(n)))
        _ref, out, _, _ = _check(z, b, V, tp)
        assert out.num_sampled.tolist() == expect
        for i in range(n):
            # recovered token is never the rejected draft (one-hot residual)
            toks = out.tokens()[i]
            if len(toks) <= k:
                assert toks[-1] != int(drafts[i, len(toks) - 1])


@pytest.mark.parametrize("tp", [2, 8])
def test_placeholder_drafts_rejected(tp):
    V = 29
    g = torch.Generator().manual_seed(19)
    drafts = [[-1, 3], [4, -1], [-1], [5, 6]]
    z = torch.randn(11, V, generator=g)
    z[3, 4] = 50.0
    z[8, 5] = 50.0
    z[9, 6] = 50.0
    for temp in (0.0, 1.0):
        b = VerifyBatch.from_draft_tokens(drafts, [temp] * 4, [1, 2, 3, 4])
        _ref, out, _, _ = _check(z, b, V, tp)
        assert out.num_sampled.tolist() == [1, 2, 1, 3]


def test_outputs_independent_of_batch_composition():
    """Counter-based noise: a request's tokens do not depend on its neighbours."""
    V = 41
    g = torch.Generator().manual_seed(23)
    b = _random_batch(g, 20, V, 3, greedy_frac=0.0, vary_k=False)
    z = _draft_aligned_logits(g, b, V)
    full, _, _ = simulate_sharded_verify(z, b, 4, V)
    keep = list(range(0, 20, 3))
    rows = torch.cat([torch.arange(4 * i, 4 * i + 4) for i in keep])
    sub = VerifyBatch.from_draft_tokens(
        b.draft_token_ids.view(20, 4)[keep, :3], b.temperature[keep], b.seeds[keep])
    part, _, _ = simulate_sharded_verify(z[rows], sub, 4, V)
    assert part.tokens() == [full.tokens()[i] for i in keep]
