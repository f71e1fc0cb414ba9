"""Patch 0002: DeepseekV2 / Kimi-K2.5 implement compute_logits_local.

At TP=2 each rank's local logits are exactly its slice of the gathered logits,
obtained with zero collectives, and vLLM's batch-sharded sampling now accepts
the model (it checks for this method)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.distributed]


def test_local_logits_are_the_rank_slice_without_collectives(tp2_target_results):
    for rank, res in enumerate(tp2_target_results):
        local = res["local"]
        if not local["available"]:
            pytest.skip("running vLLM lacks patch 0002 (compute_logits_local)")
        assert local["collectives"] == 0
        assert local["matches_slice"], f"rank {rank}: local logits != gathered slice"
        assert local["shape"][0] == 4
        assert local["batch_sharded_enabled"] is True
