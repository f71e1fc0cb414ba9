"""Tests written for mutants of verify/ that `nox -s mutants` found surviving."""

from __future__ import annotations

import pytest

from testkit.verify_simulate import plan_for_layout
from vllm_kimi_ext.verify.batch import VerifyBatch

V = 1000


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_greedy_requests_ignore_their_filters_sampling_requests_keep_them(temperature):
    """Greedy rows take the argmax, which no top-k / min-p / top-p filter changes: they
    need no candidates (batch.py: ``greedy = temperature == 0`` in the
    ``effective_*`` filters). A sampling request with the same filters does."""
    batch = VerifyBatch.from_draft_tokens([[1, 2], [3]], temperature=[temperature] * 2,
                                          seeds=[1, 2], top_k=[5, 3], min_p=[0.1, 0.0],
                                          top_p=[0.9, 0.5])
    layout = batch.layout()
    greedy = temperature == 0
    assert layout.effective_top_k(V).tolist() == ([0, 0] if greedy else [5, 3])
    assert layout.effective_min_p().tolist() == pytest.approx([0.0, 0.0] if greedy
                                                              else [0.1, 0.0])
    assert layout.effective_top_p().tolist() == pytest.approx([1.0, 1.0] if greedy
                                                              else [0.9, 0.5])
    plan = plan_for_layout(layout, tp_size=8, shard_width=125, vocab_size=V)
    assert plan.all_greedy is greedy and (plan.candidates == 0) is greedy
    if greedy:
        assert plan.num_collectives == 1 and plan.bytes_per_row_per_rank == 8
    else:
        assert [c.name for c in plan.rounds] == ["stats+candidates"]  # top-k bounds both
