"""The folded escalation (``StepPlan.escalation == "folded"``, ``verify/escalate/folded.py``):
further candidates per escalated row and a whole-row slot in one small all-gather, then round
1's own merge and certificate over ``W + W2`` candidates per rank.

Exact: every case equals the full-logits reference token for token on every simulated rank
(``check_graph_step``); a row neither the further candidates nor a whole-row slot decides is
deferred (its request emits a prefix of the reference's tokens, possibly none at a first row),
never cut approximately. The pins run with 2 round-1 candidates per rank, so every cut
escalates. The Triton kernels run by Triton's interpreter against these torch bodies in
``test_verify_escalation_interpreter.py::test_folded_escalation_in_interpreter``."""

from __future__ import annotations

import pytest
import torch

from testkit.verify_cases import PIN_V, deep_cut, ties_past_the_cut
from testkit.verify_equivalence import chi_square
from testkit.verify_graph_sim import check_graph_step
from testkit.verify_simulate import simulate_graph_step
from vllm_kimi_ext.verify import VerifyBatch
from vllm_kimi_ext.verify.escalate.folded import (
    SENT32,
    decode_keys,
    further_candidates_torch,
    row_keys16,
)
from vllm_kimi_ext.verify.protocol import folded_round_bytes, plan_step
from vllm_kimi_ext.verify.reference import sampling_keep_mask
from vllm_kimi_ext.verify.rowmath import scale_logits
from vllm_kimi_ext.verify.stats import local_top

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def _folded(z, b, tp, W2, F, **kw):
    return check_graph_step(z, b, PIN_V, tp, candidates=2, escalation="folded",
                            folded_candidates=W2, row_fallback_slots=F,
                            allow_first_row_deferral=True, **kw)


def test_further_candidates_continue_round_one_order():
    """The keys of ranks ``W .. W + W2 - 1`` decode to exactly what round 1's order
    (``local_top``: value desc, column asc) puts there, ties and padding included."""
    g = torch.Generator().manual_seed(3)
    z = (torch.randint(-8, 8, (5, 50), generator=g).float() / 4).to(torch.bfloat16)
    t = torch.tensor([1.0, 0.6, 0.7, 1.3, 1.0])
    n_valid = 44
    s = scale_logits(z, t).masked_fill(torch.arange(50)[None, :] >= n_valid, float("-inf"))
    for W, W2 in ((2, 5), (10, 30), (40, 9)):
        keys = further_candidates_torch(z, torch.arange(5), W, W2, n_valid)
        vals, gids = decode_keys(keys[None], t, 50, torch.bfloat16)
        want_v, want_c = local_top(s, W + W2)
        ok = want_v > float("-inf")
        assert torch.equal(vals[0], torch.where(ok, want_v, want_v)[:, W:])
        assert torch.equal(gids[0].long(), torch.where(ok, want_c, -1)[:, W:])
    assert int((row_keys16(z, n_valid)[:, n_valid:] == SENT32).sum()) == 5 * 6
    # gathered from two ranks: the second rank's ids are offset by the shard width
    keys = further_candidates_torch(z, torch.arange(5), 3, 8, 50)
    vals, gids = decode_keys(torch.stack([keys, keys]), t, 50, torch.bfloat16)
    assert torch.equal(vals[0], vals[1]) and bool((gids[0] >= 0).all())
    assert torch.equal(gids[1], gids[0] + 50)


def test_plan_rounds_and_refusals():
    """One all-gather of ``(E - F) x W2 x 4 + F x S x 2`` bytes (padded to 4) after round 1:
    a slot with a whole row carries no keys; with no more slots than whole-row slots the
    plan is the whole-row plan; the folded escalation refuses float32 logits, probabilistic
    drafts, a width < 1 and negative whole-row slots."""
    kw = dict(tp_size=8, shard_width=20480, num_rows=64, num_reqs=16, max_rows_per_req=4,
              all_greedy=False, any_cut=True, may_escalate=True)
    p = plan_step(**kw, escalation="folded")
    assert [r.name for r in p.rounds] == ["stats+candidates", "escalation-folded"]
    assert p.rounds[1].bytes_per_rank == 15 * 384 * 4 + 20480 * 2 == folded_round_bytes(
        16, 384, 1, 20480, 2)
    assert p.escalation_bytes_per_rank == p.rounds[1].bytes_per_rank
    assert plan_step(**kw, escalation="folded", row_fallback_slots=0,
                     folded_candidates=7).rounds[1].bytes_per_rank == 16 * 7 * 4
    assert folded_round_bytes(2, 1, 1, 3, 2) == 12  # 4 + 6 -> padded to 12
    rows = plan_step(**kw)
    one = dict(kw, num_rows=4, num_reqs=1)
    assert plan_step(**one, escalation="folded") == plan_step(**one)  # E = F = 1: rows
    assert plan_step(**kw, escalation="folded", row_fallback_slots=16) == rows
    with pytest.raises(ValueError, match="folded escalation needs 16-bit"):
        plan_step(**kw, escalation="folded", logits_bytes=4)
    with pytest.raises(ValueError, match="folded escalation needs 16-bit"):
        plan_step(**kw, escalation="folded", probabilistic=True)
    with pytest.raises(ValueError, match="folded_candidates must be >= 1"):
        plan_step(**kw, escalation="folded", folded_candidates=0)
    with pytest.raises(ValueError, match="row_fallback_slots must be >= 0"):
        plan_step(**kw, escalation="folded", row_fallback_slots=-1)
    with pytest.raises(ValueError, match="escalation must be one of"):
        plan_step(**kw, escalation="hist")


@pytest.mark.parametrize("draft_past", [False, True])
def test_ties_past_the_cut_certified_by_further_candidates(draft_past):
    """Tied tokens past the cut, TP 2, a slot per row: 64 further candidates cover each
    shard's nucleus, so every escalated row is decided from candidates alone (no whole-row
    slot, none deferred)."""
    b, z = ties_past_the_cut(16, past=4, draft_past=draft_past)
    out, _, plan, stopped = _folded(z, b, 2, 64, 0, escalation_slots=z.shape[0])
    assert plan.escalation == "folded" and int(out.uncertified.sum()) > 0
    assert int(out.deferred.sum()) == 0 and stopped == []


@pytest.mark.parametrize("depth", [5, 10])
def test_deep_cut_too_wide_for_the_candidates_defers_or_takes_the_whole_row(depth):
    """A cut ``depth`` nats deep (150 tokens in the nucleus) over 4 shards with 3 further
    candidates: the candidates cannot certify it, so exactly the first picked row is cut on
    its whole row and every other escalated row is deferred: tokens still the reference's."""
    b, z = deep_cut(depth)
    out, _, plan, stopped = _folded(z, b, 4, 3, 1)
    unc, dfr = int(out.uncertified.sum()), int(out.deferred.sum())
    assert plan.row_fallback_slots == 1 and unc >= 2
    assert dfr == unc - 1, (unc, dfr)


@pytest.mark.slow
@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("W2,F", [(64, 0), (64, 1), (3, 1), (1, 0)])
@pytest.mark.parametrize("case", ["ties", "ties_draft", "deep5", "deep7", "deep10"])
def test_pins_every_width(case, W2, F, tp):
    """Every escalation pin with wide and narrow further candidates, with and without the
    whole-row slot: reference-equal (deferred requests emit a prefix)."""
    b, z = (ties_past_the_cut(16, past=4, draft_past=case == "ties_draft")
            if case.startswith("ties") else deep_cut(int(case[4:])))
    out, _, plan, _ = _folded(z, b, tp, W2, F)
    assert plan.escalation == "folded" and int(out.uncertified.sum()) > 0


def _chi_rows():
    """One row over 4 shards: 2 tokens at 1, 5 tied at 0 (spread over the shards), the
    rest at -4; top_p cuts the tie group: the nucleus is 2 + 3 of the 5 tied tokens."""
    z = torch.full((PIN_V,), -4.0)
    z[torch.tensor([10, 120])] = 1.0
    z[torch.tensor([20, 60, 100, 140, 190])] = 0.0
    e = torch.exp(torch.tensor(-1.0)).item()
    zt = 2 + 5 * e + (PIN_V - 7) * torch.exp(torch.tensor(-5.0)).item()
    return z.to(torch.bfloat16), (2 + 2.5 * e) / zt


@pytest.mark.slow
def test_output_distribution_chi_square():
    """1e5 first tokens (5 steps of 2e4 requests, fixed seeds) drafting a kept tied token,
    round 1 with one candidate per rank (every row escalates), 8 further candidates per rank
    (the cut certified from them, no whole-row slot): the first emitted token follows the
    nucleus distribution (chi-square p > 1e-3, nothing outside the kept set)."""
    z, top_p = _chi_rows()
    n, steps = 20_000, 5
    kept, _ = sampling_keep_mask(scale_logits(z[None].float(), torch.ones(1)),
                                 torch.zeros(1, dtype=torch.long), torch.zeros(1),
                                 torch.tensor([top_p]))
    probs = torch.where(kept[0], torch.exp(z.float()), torch.zeros(PIN_V))
    assert int(kept.sum()) == 5
    counts = torch.zeros(PIN_V, dtype=torch.long)
    for i in range(steps):
        b = VerifyBatch.from_draft_tokens(torch.full((n, 1), 60), [1.0] * n,
                                          torch.arange(n) + i * n + 1, top_p=[top_p] * n)
        zz = z.expand(b.num_rows, PIN_V).contiguous()
        outs, _, plan = simulate_graph_step(zz, b, 4, PIN_V, candidates=1,
                                            escalation="folded", folded_candidates=8,
                                            row_fallback_slots=0)
        assert plan.escalation == "folded" and bool(outs[0].uncertified[::2].all())
        assert not bool(outs[0].deferred[::2].any())
        counts += torch.bincount(outs[0].sampled[:, 0], minlength=PIN_V)
    assert int(counts[~kept[0]].sum()) == 0
    stat, p, dof = chi_square(counts, probs)
    assert p > 1e-3, (stat, p, dof, counts[kept[0]].tolist())
