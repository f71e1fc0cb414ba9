"""Patch 0006: a per-rank size-1 tensor-parallel group, at TP=2 over gloo.

``get_unsharded_tp_group()`` is one group per rank; inside
``unsharded_tensor_parallel()`` the tensor-parallel size is 1 and an
all-reduce stays on the rank, outside (and after an exception inside) the
target's group is back; ``destroy_model_parallel()`` clears the group. Runs in
the TP=2 rank set the draft-TP tests share (``draft_tp_results``).
"""

from __future__ import annotations

import pytest

from testkit.draft_scenarios import has_unsharded_tp_group_patch

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.distributed,
    pytest.mark.skipif(not has_unsharded_tp_group_patch(),
                       reason="running vLLM lacks patch 0006 "
                              "(parallel_state.unsharded_tensor_parallel)"),
]


def test_size1_group_is_per_rank_and_cached(draft_tp_results):
    for rank, res in enumerate(draft_tp_results):
        group = res["_tp_group"]
        assert group["group_ranks"] == [rank]
        assert group["same_group_again"]


def test_context_makes_tp_size_1_and_all_reduce_local(draft_tp_results):
    for rank, res in enumerate(draft_tp_results):
        group = res["_tp_group"]
        sharded = {"world": 2, "rank": rank, "unsharded": False}
        assert group["before"] == group["after"] == sharded
        assert group["inside"] == {"world": 1, "rank": 0, "unsharded": True}
        assert group["sum_inside"] == rank + 1  # this rank's value only
        assert group["sum_outside"] == 1 + 2  # summed over both ranks


def test_context_restores_the_target_group_after_an_exception(draft_tp_results):
    for rank, res in enumerate(draft_tp_results):
        assert res["_tp_group"]["after_exception"] == {"world": 2, "rank": rank,
                                                       "unsharded": False}


def test_destroy_model_parallel_clears_the_group(draft_tp_results):
    assert all(res["_tp_group"]["cleared_by_destroy"] for res in draft_tp_results)
