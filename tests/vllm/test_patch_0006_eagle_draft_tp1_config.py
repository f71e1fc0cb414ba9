"""Patch 0006, configuration side: EAGLE-3 accepts ``draft_tensor_parallel_size:
1`` under a TP=2 target (the draft is then built un-sharded), keeps the sharded draft
with a warning under ``draft_lm_head_quantization`` or probabilistic drafting (only draft
tokens are shared across ranks), and the value is a compile factor. The
distributed side is tests/distributed/test_patch_0006_eagle_draft_tp1.py."""

from __future__ import annotations

import pytest

from testkit.draft_scenarios import has_unsharded_draft_patch, unhonored_draft_tp_reason

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not has_unsharded_draft_patch(),
                       reason="running vLLM lacks patch 0006 (spec_decode.unsharded_draft)"),
]


def test_eagle3_accepts_draft_tp1(tp2_config, draft_tp_heads):
    cfg = tp2_config({"method": "eagle3", "model": str(draft_tp_heads / "eagle3"),
                      "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1})
    assert cfg.speculative_config.draft_tensor_parallel_size == 1
    from vllm.v1.worker.gpu.spec_decode.unsharded_draft import draft_runs_unsharded

    assert draft_runs_unsharded(cfg)


@pytest.mark.parametrize(("option", "why"), [
    ({"draft_lm_head_quantization": "fp8"}, "draft_lm_head_quantization needs the target's"),
    ({"draft_sample_method": "probabilistic"},
     "draft_sample_method='probabilistic' verifies with each rank's own draft probabilities"),
])
def test_unhonored_draft_tp1_stays_sharded_with_a_warning(tp2_config, draft_tp_heads,
                                                          option, why):
    from vllm.v1.worker.gpu.spec_decode.unsharded_draft import draft_runs_unsharded

    cfg = tp2_config({"method": "eagle3", "model": str(draft_tp_heads / "eagle3"),
                      "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1, **option})
    assert not draft_runs_unsharded(cfg)
    assert why in (unhonored_draft_tp_reason(cfg) or "")


def test_draft_tp_is_a_compile_factor(eagle3_tp2_compile_factors):
    assert eagle3_tp2_compile_factors() != eagle3_tp2_compile_factors(
        draft_tensor_parallel_size=1)
