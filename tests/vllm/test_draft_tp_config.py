"""Configuration side of the draft-TP patch: a draft TP size a method cannot
honor is refused by name instead of being silently ignored."""

from __future__ import annotations

import pytest

from vllm_kimi_ext.testing.checkpoints import TinyEagle3Spec, TinyKimiSpec, write_tiny_eagle3
from vllm_kimi_ext.testing.draft_scenarios import (
    has_replicated_embedding_patch,
    has_unsharded_draft_patch,
    write_tiny_dflash,
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not (has_unsharded_draft_patch() and has_replicated_embedding_patch()),
                       reason="running vLLM lacks the draft-TP patches "
                              "(parallel_state.unsharded_tensor_parallel, "
                              "SpeculativeConfig.replicate_draft_embedding)"),
]


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    root = tmp_path_factory.mktemp("cfg-heads")
    write_tiny_eagle3(root / "eagle3", TinyKimiSpec(), TinyEagle3Spec())
    write_tiny_dflash(root / "dflash", TinyKimiSpec())
    return root


def _cfg(target, spec):
    from vllm_kimi_ext.testing.vllm_cpu import make_vllm_config

    return make_vllm_config(target, tensor_parallel_size=2, speculative_config=spec)


def test_eagle3_accepts_draft_tp1(tiny_kimi_dir, heads):
    cfg = _cfg(tiny_kimi_dir, {"method": "eagle3", "model": str(heads / "eagle3"),
                               "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1})
    assert cfg.speculative_config.draft_tensor_parallel_size == 1
    from vllm.v1.worker.gpu.spec_decode.unsharded_draft import draft_runs_unsharded

    assert draft_runs_unsharded(cfg)


def test_dflash_refuses_draft_tp1(tiny_kimi_dir, heads):
    with pytest.raises(Exception, match=r"draft_tensor_parallel_size=1 .*method 'dflash' "
                                        r"cannot run its draft un-sharded"):
        _cfg(tiny_kimi_dir, {"method": "dflash", "model": str(heads / "dflash"),
                             "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1})


def test_lm_head_quantization_refuses_draft_tp1(tiny_kimi_dir, heads):
    with pytest.raises(Exception, match="draft_lm_head_quantization"):
        _cfg(tiny_kimi_dir, {"method": "eagle3", "model": str(heads / "eagle3"),
                             "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1,
                             "draft_lm_head_quantization": "fp8"})


def test_replicated_embedding_is_eagle_only(tiny_kimi_dir, heads):
    with pytest.raises(Exception, match="replicate_draft_embedding is not supported"):
        _cfg(tiny_kimi_dir, {"method": "dflash", "model": str(heads / "dflash"),
                             "num_speculative_tokens": 3, "replicate_draft_embedding": True})


def test_draft_tp_is_a_compile_factor(tiny_kimi_dir, heads):
    base = {"method": "eagle3", "model": str(heads / "eagle3"), "num_speculative_tokens": 3}
    a = _cfg(tiny_kimi_dir, base).speculative_config.compile_factors()
    b = _cfg(tiny_kimi_dir, {**base, "draft_tensor_parallel_size": 1}
             ).speculative_config.compile_factors()
    c = _cfg(tiny_kimi_dir, {**base, "replicate_draft_embedding": True}
             ).speculative_config.compile_factors()
    assert a != b and a != c and b != c
