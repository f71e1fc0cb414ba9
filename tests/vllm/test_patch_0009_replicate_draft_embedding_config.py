"""Patch 0009, configuration side: ``replicate_draft_embedding`` is an
EAGLE-family option (others refuse it by name) and a compile factor. The
distributed side is tests/distributed/test_patch_0009_replicate_draft_embedding.py."""

from __future__ import annotations

import pytest

from testkit.draft_scenarios import has_replicated_embedding_patch

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not has_replicated_embedding_patch(),
                       reason="running vLLM lacks patch 0009 "
                              "(SpeculativeConfig.replicate_draft_embedding)"),
]


def test_replicated_embedding_is_eagle_only(tp2_config, draft_tp_heads):
    with pytest.raises(Exception, match="replicate_draft_embedding is not supported"):
        tp2_config({"method": "dflash", "model": str(draft_tp_heads / "dflash"),
                    "num_speculative_tokens": 3, "replicate_draft_embedding": True})


def test_replicated_embedding_is_a_compile_factor(eagle3_tp2_compile_factors):
    a = eagle3_tp2_compile_factors()
    b = eagle3_tp2_compile_factors(draft_tensor_parallel_size=1)
    c = eagle3_tp2_compile_factors(replicate_draft_embedding=True)
    assert a != c and b != c
