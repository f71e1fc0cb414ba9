"""The graph-capturable verification step (``verify/graph_step.py`` and its rounds) on CPU.

* Token for token against the full-logits reference at simulated TP 1/2/4/8 on
  random, tie-heavy (bf16), flat and coarse logits, with top-p alone and with
  top-k / min-p, at the default candidate width and with round 1 forced to leave
  most cuts uncertified (2 candidates per rank) so the escalation round and the
  deferral run; every rank gets the same answer; a deferred request emits a prefix
  of the reference's tokens and never stops at its first row.
* The collectives each rank issues are exactly the plan's rounds (shapes and bytes).
* Probabilistic drafts (round 1 + escalation + residual round).
* The sampled distribution: chi-square over 1e5 requests against the nucleus.
* Edge cases: a token exactly on the min-p cut with top-k/top-p; a shard log-sum-exp
  near the top-p boundary where float32 would move the cut.
* Planted bugs (slot order, certificate, deferral emitting a token, float32 LSE)
  make these checks fail.
"""

from __future__ import annotations

import math

import pytest
import torch

import vllm_kimi_ext.verify.decide as decide
import vllm_kimi_ext.verify.escalate.rows as escalate_rows
import vllm_kimi_ext.verify.merge as merge
import vllm_kimi_ext.verify.rowmath as rowmath
import vllm_kimi_ext.verify.stats as stats
from testkit.verify_cases import random_top_p_batch, shaped_logits
from testkit.verify_equivalence import chi_square
from testkit.verify_graph_sim import check_graph_step
from testkit.verify_simulate import plan_for_layout, simulate_graph_step
from vllm_kimi_ext.verify import GraphVerifyStep, ReferenceVerifier, StepInputs, VerifyBatch
from vllm_kimi_ext.verify.reference import sampling_keep_mask

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

V = 211
KINDS = ["random", "ties", "flat", "coarse"]
MIXES = ["top_p", "top_p_top_k", "top_p_min_p", "mixed"]


def _plan_matches_calls(group, plan):
    for calls in group.calls:
        assert [s for s, _ in calls] == [(r.rows, r.width) for r in plan.rounds]
        assert sum(nb for _, nb in calls) == plan.bytes_sent_per_rank


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mix", MIXES)
def test_graph_step_equals_reference(tp, kind, mix):
    g = torch.Generator().manual_seed(1000 * tp + 10 * KINDS.index(kind) + MIXES.index(mix))
    b = random_top_p_batch(g, 40, V, mix)
    z = shaped_logits(g, b, V, kind)
    _, group, plan, _ = check_graph_step(z, b, V, tp)
    _plan_matches_calls(group, plan)
    out, group, plan, stopped = check_graph_step(z, b, V, tp, candidates=2)
    _plan_matches_calls(group, plan)
    if tp > 1 and kind == "flat" and mix == "top_p":
        assert bool(out.uncertified.any()), "round 1 certified everything: escalation untested"


def _deferral_case(seed, n=30):
    """Flat rows with one likely token (id 0, p ~ 0.4) drafted everywhere: drafts are
    often accepted, and every row's nucleus (top_p 0.95) is far wider than 2 candidates."""
    g = torch.Generator().manual_seed(seed)
    b = VerifyBatch.from_draft_tokens(torch.zeros(n, 3, dtype=torch.long), [1.0] * n,
                                      torch.randint(0, 2**40, (n,), generator=g),
                                      top_p=[0.95] * n)
    z = torch.randn(b.num_rows, V, generator=g) * 0.3
    z[:, 0] += 5.0
    return b, z


def test_deferral_runs_and_stops_after_an_accepted_draft():
    """2 candidates and one slot per request: the first rows take every slot, so later rows
    are deferred; requests that reach one stop there with a prefix of the reference."""
    seen = 0
    for seed in range(3):
        b, z = _deferral_case(seed)
        out, _, plan, stopped = check_graph_step(z, b, V, 4, candidates=2)
        assert plan.escalation_slots == b.num_reqs
        assert bool(out.deferred.any())
        seen += len(stopped)
    assert seen > 0, "no request stopped at a deferred row: deferral untested"


def test_probabilistic_drafts():
    g = torch.Generator().manual_seed(3)
    for tp in (2, 4):
        b = random_top_p_batch(g, 40, V, "mixed")
        z = shaped_logits(g, b, V, "random")
        q = torch.softmax(torch.randn(b.num_rows, V, generator=g) * 2, dim=1)
        _, group, plan, _ = check_graph_step(z, b, V, tp, q)
        assert plan.residual_round
        _plan_matches_calls(group, plan)
        check_graph_step(z, b, V, tp, q, candidates=2)


def test_sampled_distribution_chi_square():
    """1e5 one-row requests (bonus only) on one flat row at T=1, top_p 0.7, TP = 4 with
    2 candidates per rank (every cut escalated): tokens ~ the renormalised nucleus."""
    n, v = 100_000, 48
    g = torch.Generator().manual_seed(11)
    row = torch.randn(v, generator=g) * 0.8
    z = row.expand(n, v).contiguous()
    b = VerifyBatch.from_draft_tokens([[]] * n, [1.0] * n, torch.arange(n) * 7919 + 5,
                                      top_p=[0.7] * n)
    outs, _, _ = simulate_graph_step(z, b, 4, v, candidates=2)
    tok = outs[0].sampled[:, 0]
    keep, _ = sampling_keep_mask(row[None], torch.zeros(1, dtype=torch.long), torch.zeros(1),
                                 torch.tensor([0.7]))
    p = torch.where(keep[0], torch.softmax(row.double(), 0), torch.zeros(v, dtype=torch.float64))
    p = p / p.sum()
    assert bool(keep[0][tok].all()), "a token outside the nucleus was sampled"
    counts = torch.bincount(tok, minlength=v).double()
    kept = keep[0]
    stat, pval, dof = chi_square(counts[kept], p[kept])
    assert pval > 1e-3, (stat, pval, dof)  # fixed seed; a wrong nucleus gives p ~ 0


def test_token_exactly_on_the_min_p_cut_with_top_k_and_top_p():
    """min_p 0.5 at max 0: the cut is log(0.5) in float32; tokens exactly there are kept."""
    cut = float(torch.log(torch.tensor(0.5)))
    n = 64
    s = torch.full((n * 4, V), -9.0)
    s[:, 0] = 0.0
    s[:, 10:14] = cut  # four tokens tied exactly on the cut
    s[:, 20] = cut - 1e-6
    g = torch.Generator().manual_seed(5)
    drafts = torch.randint(9, 15, (n, 3), generator=g)
    for top_k, top_p in ((3, 1.0), (0, 0.9), (4, 0.8), (0, 1.0)):
        b = VerifyBatch.from_draft_tokens(drafts, [1.0] * n, torch.arange(n), top_k=[top_k] * n,
                                          min_p=[0.5] * n, top_p=[top_p] * n)
        for tp in (2, 8):
            check_graph_step(s, b, V, tp)
            check_graph_step(s, b, V, tp, candidates=2)


def _near_boundary_row():
    """Row whose top-p walk ends within ~1e-9 of top_p: the nucleus depends on the
    normaliser's float64 digits."""
    v = 64
    w = torch.zeros(v, dtype=torch.float64)
    w[:8] = torch.tensor([3.0, 2.5, 2.0, 1.5, 1.2, 1.0, 0.8, 0.5], dtype=torch.float64)
    w[8:] = -2.0
    s = w.float()
    p = torch.softmax(s.double(), 0)
    cum = torch.cumsum(torch.sort(p, descending=True).values, 0)
    top_p = float(cum[5]) - 4e-10  # mass through the 6th token sits just above top_p
    return s, top_p, v


def test_top_p_boundary_needs_the_float64_shard_lse(monkeypatch):
    s, top_p, v = _near_boundary_row()
    b = VerifyBatch.from_draft_tokens([[0]], [1.0], [1], top_p=[top_p])
    z = torch.stack([s, s])
    ref_keep, _ = sampling_keep_mask(s[None], torch.zeros(1, dtype=torch.long), torch.zeros(1),
                                     torch.tensor([top_p]))
    want = int(ref_keep.sum())
    outs, _, _ = simulate_graph_step(z, b, 4, v, candidates=64)
    assert int(outs[0].uncertified.sum()) == 0
    step = GraphVerifyStep(v, 1, 0, lambda t: t[None])
    L = b.layout()
    inp = StepInputs.from_layout(L, v)
    plan = plan_for_layout(L, tp_size=1, shard_width=v, vocab_size=v, candidates=64)
    payload = stats.round1_payload_torch(z, inp, plan, 0, v, None)
    merged = merge.merge_round1_torch(payload[None], inp, plan, v, step.rank_valid(z.device), None)
    assert int(merged.n_kept[0]) == want
    # the same payload with the log-sum-exp rounded to float32 moves the cut
    p32 = payload.clone()
    lse = rowmath.join_float64(p32[:, 2:4]).float().double()
    p32[:, 2:4] = rowmath.split_float64(lse)
    m32 = merge.merge_round1_torch(p32[None], inp, plan, v, step.rank_valid(z.device), None)
    assert int(m32.n_kept[0]) != want, "float32 LSE gives the same cut: the test cannot fail"


# --- planted bugs ------------------------------------------------------------------
def _flat_case(seed):
    g = torch.Generator().manual_seed(seed)
    b = random_top_p_batch(g, 40, V, "top_p")
    return b, shaped_logits(g, b, V, "flat")


def test_planted_lax_certificate_fails(monkeypatch):
    """Calling every cut certified (no escalation) changes tokens on flat rows."""
    orig = merge.merge_round1_torch

    def lax(*a, **k):
        m = orig(*a, **k)
        m.uncertified = torch.zeros_like(m.uncertified)
        return m

    monkeypatch.setattr(merge, "merge_round1_torch", lax)
    failed = 0
    for seed in range(4):
        b, z = _flat_case(seed)
        try:
            check_graph_step(z, b, V, 4, candidates=2)
        except AssertionError:
            failed += 1
    assert failed > 0


def test_planted_slot_order_defers_first_rows(monkeypatch):
    """Slots given to the last rows first (instead of each request's first row): some
    request is deferred at its first row, which the check refuses."""
    orig = escalate_rows.pick_slots

    def last_rows_first(uncertified, row_in_req, slots):
        return orig(uncertified, torch.arange(row_in_req.shape[0]).flip(0), slots)

    monkeypatch.setattr(escalate_rows, "pick_slots", last_rows_first)
    with pytest.raises(AssertionError, match="deferred at its first row"):
        for seed in range(3):
            b, z = _deferral_case(seed)
            check_graph_step(z, b, V, 4, candidates=2)


def test_planted_deferral_that_still_emits_a_token(monkeypatch):
    orig = decide.decide_merged_torch

    def emits(merged, deferred, inp, plan, vocab_size):
        return orig(merged, torch.zeros_like(deferred), inp, plan, vocab_size)

    monkeypatch.setattr(decide, "decide_merged_torch", emits)
    with pytest.raises(AssertionError):
        for seed in range(3):
            b, z = _deferral_case(seed)
            check_graph_step(z, b, V, 4, candidates=2)


def test_reference_verifier_is_the_oracle():
    """Sanity: the oracle itself is the plain definition (guards against comparing two
    copies of one bug)."""
    s, top_p, v = _near_boundary_row()
    keep, _ = sampling_keep_mask(s[None], torch.zeros(1, dtype=torch.long), torch.zeros(1),
                                 torch.tensor([top_p]))
    p = torch.softmax(s.double(), 0)
    order = torch.argsort(-p, stable=True)
    mass, kept = 0.0, []
    for i in order.tolist():
        if kept and mass >= top_p:
            break
        kept.append(i)
        mass += float(p[i])
    assert set(keep[0].nonzero().squeeze(1).tolist()) == set(kept)
    assert ReferenceVerifier(v).vocab_size == v and not math.isnan(top_p)


@pytest.mark.parametrize("tp", [2, 8])
@pytest.mark.parametrize("temps", ["greedy", "temperature", "mixed"])
def test_stats_only_plans(tp, temps):
    """No cut, one-hot drafts: one round of (gval, gidx[, lse, s_x]) and the decision."""
    g = torch.Generator().manual_seed(17 + tp)
    n = 40
    t = {"greedy": torch.zeros(n), "temperature": torch.rand(n, generator=g) + 0.3,
         "mixed": torch.where(torch.rand(n, generator=g) < 0.5, 0.0,
                              torch.rand(n, generator=g) + 0.3)}[temps]
    b = VerifyBatch.from_draft_tokens(torch.randint(0, V, (n, 3), generator=g), t,
                                      torch.arange(n))
    z = shaped_logits(g, b, V, "random")
    _, group, plan, _ = check_graph_step(z, b, V, tp)
    assert plan.stats_only and len(plan.rounds) == 1
    assert plan.round1_width == (2 if temps == "greedy" else 4)
    _plan_matches_calls(group, plan)
