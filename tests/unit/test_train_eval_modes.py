"""``draft eval``'s three acceptance modes on a fixed case worked by hand:
probabilistic drafting (sum min(p, q)), greedy drafting against a T = 1 target (vLLM
0.34.0's default ``draft_sample_method``: the argmax draft token is kept with
probability p(x)) and greedy decoding (argmax agreement)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from vllm_kimi_ext.train import evaluate as ev  # noqa: E402

P = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6]])
Q1 = torch.tensor([[0.1, 0.8, 0.1], [0.7, 0.2, 0.1], [0.3, 0.3, 0.4]])  # depth 1, per start
Q2 = torch.tensor([[0.2, 0.3, 0.5], [0.6, 0.3, 0.1], [0.3, 0.4, 0.3]])  # depth 2, per start
VALID = torch.ones(3, dtype=torch.bool)


def test_greedy_drafting_keeps_the_argmax_with_the_targets_probability():
    # start 0: depth 1 proposes id 1 (p0[1] = 0.3), depth 2 proposes id 2 (p1[2] = 0.3);
    # start 1: id 0 (p1[0] = 0.1), then id 0 (p2[0] = 0.2)
    got = ev.greedy_draft_acceptance(P, [Q1, Q2], VALID)
    assert torch.allclose(got, torch.tensor([[0.3, 0.3], [0.1, 0.2]], dtype=torch.float64))
    assert torch.allclose(ev.chain_tau(got), torch.tensor([1 + 0.3 + 0.09, 1 + 0.1 + 0.02],
                                                          dtype=torch.float64))


def test_the_three_modes_differ_on_the_same_chains():
    alpha, greedy = ev.chain_acceptance(P, [Q1, Q2], VALID)
    draft = ev.greedy_draft_acceptance(P, [Q1, Q2], VALID)
    # sum min(p, q): start 0 depth 1 = min(.5,.1)+min(.3,.8)+min(.2,.1) = 0.5
    assert float(alpha[0, 0]) == pytest.approx(0.5)
    # argmax agreement: start 0 depth 1 proposes 1, the target's argmax is 0
    assert float(greedy[0, 0]) == 0.0 and float(draft[0, 0]) == pytest.approx(0.3)
    acc = ev.Acceptance(2)
    acc.add(alpha, greedy, draft)
    row = acc.row()
    assert row["greedy_draft_alpha"] == pytest.approx([0.2, 0.25])
    assert row["greedy_draft_tau"] == pytest.approx((1.39 + 1.12) / 2)
    table = ev.format_table({"d": {"all": row}}, k=2)
    assert "greedy draft (T=1, vLLM default)" in table and "1.255" in table


def test_greedy_drafting_with_a_reduced_vocabulary_maps_through_d2t():
    # draft ids 0, 1 are target ids 0, 2 (d2t holds offsets)
    d2t = torch.tensor([0, 1])
    q1 = torch.tensor([[0.3, 0.7], [0.9, 0.1]])
    got = ev.greedy_draft_acceptance(P[:2], [q1], torch.ones(2, dtype=torch.bool), d2t)
    assert torch.allclose(got[:, 0], torch.tensor([0.2, 0.1], dtype=torch.float64))
