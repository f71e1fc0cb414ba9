"""Vocab-sharded verification on vLLM's real Kimi-K2.5 class at TP=2.

The verifier consumes ``compute_logits_local`` (patch 0002) and exchanges its
statistics through vLLM's own TP group, so the collective counter measures what
a server would send. Its tokens equal the full-logits reference token for
token; one step is one all-gather of 16 bytes per row per rank (the stock path
all-gathers the whole vocab shard: 2·V/TP bytes per row per rank); a top-p step
is planned as a counted fallback."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.distributed]


def test_sharded_equals_reference_with_one_small_gather(tp2_target_results):
    for rank, res in enumerate(tp2_target_results):
        v = res["verify"]
        assert v["sharded_tokens"] == v["reference_tokens"], f"rank {rank}"
        assert v["num_sampled"] == v["reference_num_sampled"]
        # the constructed drafts: request 0 greedy all-accepted (k + bonus)
        assert v["num_sampled"][0] == 4
        counted = v["counted"]
        assert list(counted) == [("tp", "verify", "all_gather")]
        calls, nbytes = counted[("tp", "verify", "all_gather")]
        assert calls == v["plan_collectives"] == 1
        assert nbytes == 16 * v["rows"]  # 4 float32 per row from this rank
        assert nbytes * 10 < v["stock_gather_bytes_per_rank"]
    # every rank reached the same decisions
    assert tp2_target_results[0]["verify"]["sharded_tokens"] == \
        tp2_target_results[1]["verify"]["sharded_tokens"]


def test_top_p_step_is_a_counted_fallback(tp2_target_results):
    v = tp2_target_results[0]["verify"]
    assert v["top_p_fallback"] == "top_p"
    assert v["fallbacks"] == {"top_p": 1}
