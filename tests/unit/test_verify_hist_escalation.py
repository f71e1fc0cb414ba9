"""The histogram escalation (``testkit/verify_hist_step.py``: measured slower, not shipped)
equals the full-logits reference token for token under shared random draws at Kimi's
V = 163840 over 8 simulated shards (the escalation pins run it too:
``test_verify_escalation_pins.py``). Rows it cannot cut exactly (top-k forced into the
escalation, a cut within the edge tolerance) take a whole-row slot or are deferred,
never cut approximately. Every escalated row is cut by the histogram rounds themselves
(``row_fallback_slots=0`` defers exactly the rows without a slot)."""

from __future__ import annotations

import pytest
import torch

from testkit.verify_cases import PIN_V, deep_cut, ties_past_the_cut
from testkit.verify_equivalence import chi_square
from testkit.verify_graph_sim import check_graph_step
from testkit.verify_hist_step import key_values, ordered_key16
from testkit.verify_simulate import simulate_graph_step
from vllm_kimi_ext.verify import VerifyBatch, merge
from vllm_kimi_ext.verify.reference import sampling_keep_mask
from vllm_kimi_ext.verify.rowmath import scale_logits

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

KIMI_V, KIMI_TP = 163840, 8


def _all_cut_by_hist(out, plan) -> None:
    """With no whole-row slot, the deferred rows are exactly the uncertified rows beyond
    the escalation slots: no row failed over."""
    unc = int(out.uncertified.sum())
    assert plan.escalation == "hist" and plan.row_fallback_slots == 0
    assert int(out.deferred.sum()) == unc - min(unc, plan.escalation_slots)


def test_ordered_key_is_monotone_and_invertible():
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    z = bits.view(torch.bfloat16)
    z = z[~torch.isnan(z)]
    k = ordered_key16(z)
    order = torch.argsort(z.float(), stable=True)
    assert bool((k[order].diff() >= 0).all())
    assert bool(((k[order].diff() == 0) == (z[order].float().diff() == 0)).all())
    back = key_values(k, torch.bfloat16)
    assert torch.equal(back.float(), z.float())


def _kimi_rows(g) -> torch.Tensor:
    """Seven bf16 rows at V = 163840: random scales, ties spread over all 8 shards with the
    cut among them, cuts about 7 and 14 nats below the maximum, two flat rows."""
    rows = [(torch.randn(KIMI_V, generator=g) * sc) for sc in (1.0, 3.0)]
    z = torch.randn(KIMI_V, generator=g) * 0.5
    ties = torch.arange(8)[:, None] * 20480 + torch.tensor([1000, 9000, 17000])[None, :]
    z[ties.flatten() + torch.arange(24) * 7] = 11.25  # three ties per shard
    rows.append(z)
    for top, base in ((10.0, 3.0), (20.0, 6.0)):
        z = torch.full((KIMI_V,), base) + torch.rand(KIMI_V, generator=g) * 0.01
        z[int(torch.randint(0, KIMI_V, (1,), generator=g))] = top
        rows.append(z)
    rows += [torch.randn(KIMI_V, generator=g) * 0.3 for _ in range(2)]
    return torch.stack(rows).to(torch.bfloat16)


@pytest.mark.parametrize("drafts", ["argmax", "random"])
def test_kimi_vocab_eight_shards(drafts):
    """Seven requests of three drafts at Kimi's V over 8 shards: top-p (0.3 on the tied row:
    7 of its 24 ties kept, over three shards), T 1.0 / 0.6, min-p with top-p (on a flat row
    min-p 0.5 keeps ~1,600 tokens and top-p 0.9 cuts inside them), min-p alone;
    every escalated request has a slot per row, so nothing is deferred."""
    g = torch.Generator().manual_seed(2511)
    base = _kimi_rows(g)
    n, k = base.shape[0], 3
    if drafts == "argmax":
        d = base.float().argmax(dim=1)[:, None].expand(n, k).clone()
    else:
        d = torch.randint(0, KIMI_V, (n, k), generator=g)
    z = base.repeat_interleave(k + 1, dim=0)
    b = VerifyBatch.from_draft_tokens(d, [1.0, 0.6, 1.0, 1.0, 0.6, 1.0, 1.0],
                                      list(range(7, 7 + n)),
                                      top_p=[0.95, 0.9, 0.3, 0.95, 0.95, 1.0, 0.9],
                                      min_p=[0.0, 0.0, 0.0, 0.0, 0.01, 0.02, 0.5])
    out, group, plan, stopped = check_graph_step(z, b, KIMI_V, KIMI_TP, candidates=2,
                                                 escalation="hist", row_fallback_slots=0,
                                                 escalation_slots=z.shape[0])
    assert stopped == [] and not bool(out.deferred.any())
    assert int(out.uncertified.sum()) >= 6 * (k + 1)
    _all_cut_by_hist(out, plan)


@pytest.mark.parametrize("depth", [1.0, 4.0])
def test_tokens_exactly_on_the_min_p_cut_are_kept(depth):
    """min-p with top-p, the min-p cut exactly on 150 tied tokens (the row maximum 0, the
    ties at -depth, min_p a float32 whose log is -depth): min-p keeps them (``>=``), and
    the nucleus takes about half of them. A pre-cut that drops a token on the cut (``>``)
    leaves the maximum alone in the nucleus and the step differs from the reference (the
    Triton twin: ``testkit.verify_hist_check``'s ``min_p_on_cut``)."""
    b, z = deep_cut(depth, min_p_on_cut=True)
    cut = torch.log(b.min_p[:1])  # the row maximum is 0: the cut is max + log(min_p)
    assert float(cut) == -depth and int((z[0].float() == cut).sum()) == 150
    out, _, plan, stopped = check_graph_step(z, b, PIN_V, 2, candidates=2, escalation="hist",
                                             row_fallback_slots=0,
                                             escalation_slots=b.num_rows)
    assert stopped == [] and int(out.uncertified.sum()) >= 3
    _all_cut_by_hist(out, plan)


def _edge_batch(n: int):
    """Rows whose cut sits on a token edge: two tokens tied at 0, the rest at -40, top_p
    0.5: the first token's mass is 1/Z, within 1e-15 of top_p x Z."""
    z = torch.full((PIN_V,), -40.0)
    z[[3, 150]] = 0.0
    b = VerifyBatch.from_draft_tokens(torch.full((n, 2), 7), [1.0] * n, list(range(n)),
                                      top_p=[0.5] * n)
    return b, z.expand(b.num_rows, PIN_V).contiguous().to(torch.bfloat16)


def test_edge_row_takes_a_whole_row_slot():
    b, z = _edge_batch(2)
    out, group, plan, _ = check_graph_step(z, b, PIN_V, 2, candidates=1, escalation="hist",
                                           row_fallback_slots=2)
    assert plan.rounds[-1].name == "hist-stats+rows"
    assert plan.rounds[-1].width == plan.escalation_slots * 16 + 2 * plan.shard_width * 2
    first = torch.tensor([0, 3])
    assert not bool(out.deferred[first].any())
    # without whole-row slots the same rows are deferred (fail closed), never cut
    outs, *_ = simulate_graph_step(z, b, 2, PIN_V, candidates=1, escalation="hist",
                                   row_fallback_slots=0)
    assert bool(outs[0].deferred[first].all())


def test_forced_top_k_row_takes_a_whole_row_slot(monkeypatch):
    """A top-k + top-p row never escalates (round 1 certifies it); forced into the
    escalation, the histogram rounds (which do not cut top-k) leave it to a whole-row
    slot, and the step still equals the reference."""
    real = merge.merge_round1_torch

    def forced(g, inp, *a, **k):
        m = real(g, inp, *a, **k)
        m.uncertified |= inp.temperature > 0
        return m

    monkeypatch.setattr(merge, "merge_round1_torch", forced)
    b, z = ties_past_the_cut(16, past=4)
    b = b.replace(top_k=torch.tensor([20, 0, 20]), top_p=torch.tensor([0.9, 0.9, 0.6]))
    out, _, plan, stopped = check_graph_step(z, b, PIN_V, 2, candidates=20,
                                             escalation="hist", row_fallback_slots=2)
    assert bool(out.uncertified[[0, 8]].all()) and not bool(out.deferred[[0, 8]].any())
    outs, *_ = simulate_graph_step(z, b, 2, PIN_V, candidates=20, escalation="hist",
                                   row_fallback_slots=0)
    assert bool(outs[0].deferred[[0, 8]].all()) and not bool(outs[0].deferred[4])


def _chi_rows():
    """One row over 4 shards with 3 levels; top_p cuts the middle tie group (5 tokens in
    several shards), so the nucleus is 2 + 3 of 5 tied tokens."""
    z = torch.full((PIN_V,), -4.0)
    top = torch.tensor([10, 120])
    tied = torch.tensor([20, 60, 100, 140, 190])
    z[top], z[tied] = 1.0, 0.0
    e = torch.exp(torch.tensor(-1.0)).item()
    zt = 2 + 5 * e + (PIN_V - 7) * torch.exp(torch.tensor(-5.0)).item()
    return z.to(torch.bfloat16), (2 + 2.5 * e) / zt


@pytest.mark.slow
def test_output_distribution_chi_square():
    """1e5 first tokens of requests drafting a kept tied token (5 steps of 2e4 requests,
    fixed seeds): the histogram escalation's first emitted token follows the nucleus
    distribution of the whole-row sort (chi-square p > 1e-3, nothing outside the kept
    set)."""
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
        outs, _, plan = simulate_graph_step(zz, b, 4, PIN_V, candidates=1, escalation="hist",
                                            row_fallback_slots=0)
        assert plan.escalation == "hist" and bool(outs[0].uncertified[::2].all())
        assert not bool(outs[0].deferred[::2].any())
        counts += torch.bincount(outs[0].sampled[:, 0], minlength=PIN_V)
    assert int(counts[~kept[0]].sum()) == 0
    stat, p, dof = chi_square(counts, probs)
    assert p > 1e-3, (stat, p, dof, counts[kept[0]].tolist())
