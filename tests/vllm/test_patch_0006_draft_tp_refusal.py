"""Patch 0006: a draft TP size the method cannot honor keeps today's sharded draft and
is named in a warning at configuration (stock vLLM 0.34.0 accepts it and silently
shards the draft like the target; the patch's first version refused it, which stopped
setups that stock accepts)."""

from __future__ import annotations

import pytest

from testkit.draft_scenarios import has_unsharded_draft_patch, unhonored_draft_tp_reason

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not has_unsharded_draft_patch(),
                       reason="running vLLM lacks patch 0006 (spec_decode.unsharded_draft)"),
]


def test_dflash_draft_tp1_stays_sharded_with_a_warning(tp2_config, draft_tp_heads):
    from vllm.v1.worker.gpu.spec_decode.unsharded_draft import draft_runs_unsharded

    cfg = tp2_config({"method": "dflash", "model": str(draft_tp_heads / "dflash"),
                      "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1})
    assert not draft_runs_unsharded(cfg)
    assert unhonored_draft_tp_reason(cfg) == "method 'dflash' cannot run its draft un-sharded"
