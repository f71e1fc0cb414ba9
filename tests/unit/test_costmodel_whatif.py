"""What-if levers: the tree and adaptive formulas at their limits, and the lever table."""

from __future__ import annotations

import pytest

from vllm_kimi_ext.costmodel import Acceptance, CostModel, load_draft
from vllm_kimi_ext.costmodel.acceptance import band_for
from vllm_kimi_ext.costmodel.whatif import (
    BATCHES,
    LEVERS,
    adaptive_verify_tokens,
    lever_table,
    tree_tau,
)


def test_tree_of_width_one_is_the_chain():
    acc = Acceptance.from_per_position([0.7, 0.5, 0.3])
    assert tree_tau(acc, [1, 1, 1]) == pytest.approx(acc.tau(3))


def test_wider_trees_accept_more_but_never_more_than_the_depth():
    acc = Acceptance.from_conditional([0.6])
    taus = [tree_tau(acc, [w] * 3) for w in (1, 2, 4, 8)]
    assert all(b > a for a, b in zip(taus, taus[1:])) and taus[-1] < 4.0
    # one depth, two candidates at conditional rate 0.5 each: 1 - 0.5^2 = 0.75 accepted
    assert tree_tau(Acceptance.from_conditional([0.5]), [2]) == pytest.approx(1.75)
    # a sibling accepted ends the path: depth 2 is reached only through the top-1
    assert tree_tau(Acceptance.from_conditional([0.5]), [2, 1]) == pytest.approx(1 + 0.75 + 0.25)
    # a perfect draft needs no siblings; a useless one gains exactly the siblings' chance
    assert tree_tau(Acceptance.from_conditional([1.0]), [4, 4]) == 3.0
    assert tree_tau(Acceptance.from_conditional([0.0]), [3]) == 1.0


def test_adaptive_verification_oracle_limits():
    for k in (1, 3, 7):
        assert adaptive_verify_tokens(Acceptance.from_conditional([1.0]), k) == k + 1
        assert adaptive_verify_tokens(Acceptance.from_conditional([0.0]), k) == 2
        mid = adaptive_verify_tokens(Acceptance.from_conditional([0.5]), k)
        assert 2 <= mid <= k + 1


@pytest.fixture(scope="module")
def table():
    cm = CostModel.build("rtx-pro-6000-pcie-x8")
    d = load_draft("lightseek-eagle3-mla")
    return lever_table(cm, d, band_for(d, ratio=0.66))


def test_every_lever_has_a_row_with_an_assumption(table):
    assert {r.lever.key for r in table} == {lv.key for lv, _ in LEVERS}
    for r in table:
        assert r.lever.assumption and r.lever.takes
        assert set(r.gains) == set(BATCHES)
    built = [r for r in table if r.lever.built]
    assert built and table[-len(built):] == built  # levers not built first


def test_lever_directions(table):
    by = {r.lever.key: r for r in table}
    for b in BATCHES:
        for s in ("low", "card", "high"):
            assert by["draft+1.0"].gains[b][s] >= by["draft+0.5"].gains[b][s] > 0
            assert by["overlap"].gains[b][s] >= 0  # an upper bound never costs
            assert by["nccl-tuning"].gains[b][s] > 0
    # all-reduce latency matters most at batch 1
    assert by["nccl-tuning"].gain(1) > by["nccl-tuning"].gain(64)
