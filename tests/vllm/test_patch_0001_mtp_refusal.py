"""Patch 0001: method="mtp" is refused for drafts without MTP layers.

Stock vLLM 0.34.0 accepts it on Kimi-K2.5 and takes the whole target
architecture as the "draft". The checks run vLLM's own SpeculativeConfig path.
"""

from __future__ import annotations

import dataclasses

import pytest

from testkit.checkpoints import TinyKimiSpec, write_tiny_deepseek_v3

pytestmark = pytest.mark.vllm


def test_kimi_k25_without_mtp_layers_is_refused(tiny_kimi_dir):
    from testkit.vllm_cpu import make_vllm_config

    with pytest.raises(Exception) as err:
        make_vllm_config(tiny_kimi_dir, speculative_config={
            "method": "mtp", "num_speculative_tokens": 1})
    msg = str(err.value)
    assert "Speculative method 'mtp' needs MTP layers" in msg
    assert "KimiK25ForConditionalGeneration" in msg and "'kimi_k25'" in msg
    assert "num_nextn_predict_layers=0" in msg
    assert "second copy of the full target model" in msg


def test_deepseek_v3_with_zero_mtp_layers_is_refused(tmp_path):
    from testkit.vllm_cpu import make_vllm_config

    write_tiny_deepseek_v3(tmp_path, TinyKimiSpec(num_hidden_layers=2))
    with pytest.raises(Exception, match="needs MTP layers"):
        make_vllm_config(tmp_path, speculative_config={
            "method": "mtp", "num_speculative_tokens": 1})


def test_checkpoint_with_mtp_layers_is_still_accepted(tmp_path):
    from testkit.vllm_cpu import make_vllm_config

    spec = dataclasses.replace(TinyKimiSpec(), num_hidden_layers=2)
    write_tiny_deepseek_v3(tmp_path, spec, with_mtp=True)
    cfg = make_vllm_config(tmp_path, speculative_config={
        "method": "mtp", "num_speculative_tokens": 1})
    draft = cfg.speculative_config.draft_model_config.hf_config
    assert draft.architectures == ["DeepSeekMTPModel"]
    assert draft.n_predict == 1
