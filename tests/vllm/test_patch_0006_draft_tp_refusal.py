"""Patch 0006: a draft TP size the method cannot honor is refused by name at
configuration (stock vLLM 0.34.0 accepts it and silently shards the draft like
the target)."""

from __future__ import annotations

import pytest

from testkit.draft_scenarios import has_vllm_symbol

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not has_vllm_symbol("vllm.v1.worker.gpu.spec_decode.speculator_config",
                            "SpeculatorConfig.supports_unsharded_draft"),
        reason="running vLLM lacks patch 0006 (SpeculatorConfig.supports_unsharded_draft)"),
]


def test_dflash_refuses_draft_tp1(tp2_config, draft_tp_heads):
    with pytest.raises(Exception, match=r"draft_tensor_parallel_size=1 .*method 'dflash' "
                                        r"cannot run its draft un-sharded"):
        tp2_config({"method": "dflash", "model": str(draft_tp_heads / "dflash"),
                    "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1})
