"""Patch 0004: EAGLE-3 heads typed ``deepseek_v3`` (MLA layer) are not rewritten
into an MTP draft (stock: rewritten to an MTP architecture that does not exist).

Path under test: EngineArgs -> VllmConfig -> vLLM's loader, every parameter
poisoned before loading and checked after.
"""

from __future__ import annotations

import pytest

from testkit.checkpoints import TinyEagle3Spec, TinyKimiSpec, write_tiny_eagle3
from testkit.draft_scenarios import has_vllm_symbol

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not has_vllm_symbol("vllm.config.speculative", "_is_eagle3_draft_architecture"),
        reason="running vLLM lacks patch 0004 (speculative._is_eagle3_draft_architecture)"),
]


def test_deepseek_v3_typed_mla_head_loads_as_eagle3(tiny_kimi_dir, tmp_path, eagle3_config):
    from testkit.vllm_cpu import load_model

    draft = tmp_path / "mla-v3"
    write_tiny_eagle3(draft, TinyKimiSpec(), TinyEagle3Spec(style="mla",
                                                            mla_model_type="deepseek_v3"))
    cfg = eagle3_config(tiny_kimi_dir, draft)
    dcfg = cfg.speculative_config.draft_model_config
    assert dcfg.architectures == ["Eagle3DeepseekV2ForCausalLM"]
    model, report = load_model(cfg, dcfg)
    assert type(model).__name__ == "Eagle3DeepseekV2ForCausalLM"
    assert report.unwritten == []


def test_plain_deepseek_v3_arch_as_eagle3_is_refused_with_reason(tiny_kimi_dir, tmp_path):
    import json

    from testkit.vllm_cpu import make_vllm_config

    draft = tmp_path / "mla-plain"
    write_tiny_eagle3(draft, TinyKimiSpec(), TinyEagle3Spec(style="mla",
                                                            mla_model_type="deepseek_v3"))
    cfg = json.loads((draft / "config.json").read_text())
    cfg["architectures"] = ["DeepseekV3ForCausalLM"]
    (draft / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(Exception) as err:
        make_vllm_config(tiny_kimi_dir, speculative_config={
            "method": "eagle3", "model": str(draft), "num_speculative_tokens": 2})
    msg = str(err.value)
    assert "was read as an MTP checkpoint" in msg and "Eagle3DeepseekV2ForCausalLM" in msg


def test_doctor_keeps_the_heads_vllm_keeps():
    """The draft doctor's list of EAGLE-3 head architectures is the patched rule's."""
    from vllm.config.speculative import _is_eagle3_draft_architecture
    from vllm.model_executor.models.registry import _SPECULATIVE_DECODING_MODELS

    from vllm_kimi_ext.drafts.doctor.checks import EAGLE3_HEAD_ARCHITECTURES

    kept = {a for a in _SPECULATIVE_DECODING_MODELS if _is_eagle3_draft_architecture(a)}
    assert EAGLE3_HEAD_ARCHITECTURES == kept
