"""Patch 0010: a configured ``draft_model`` is loaded as the model it is.

Stock vLLM 0.34.0 sends every draft checkpoint through the MTP rewrites of
``SpeculativeConfig.hf_config_override``: a DeepSeek-V3-architecture LM used as
a plain draft (the Kimi-family Moonlight-16B-A3B is one) becomes
``DeepSeekMTPModel`` with ``n_predict = num_nextn_predict_layers = 0`` and
configuration dies with ``ZeroDivisionError`` in
``resolve_num_speculative_tokens``.  The checks run vLLM's own config path and
loader.
"""

from __future__ import annotations

import dataclasses

import pytest

from testkit.checkpoints import TinyKimiSpec, write_tiny_deepseek_v3

pytestmark = pytest.mark.vllm


def test_deepseek_v3_lm_as_draft_model_loads_as_itself(tiny_kimi_dir, tmp_path):
    from testkit.tli_scenarios import load_speculator
    from testkit.vllm_cpu import make_vllm_config, run_forward

    spec = dataclasses.replace(TinyKimiSpec(), num_hidden_layers=2)
    write_tiny_deepseek_v3(tmp_path, spec)  # num_nextn_predict_layers = 0, same vocab
    cfg = make_vllm_config(tiny_kimi_dir, speculative_config={
        "method": "draft_model", "model": str(tmp_path), "num_speculative_tokens": 3})
    draft = cfg.speculative_config.draft_model_config
    assert draft.architectures == ["DeepseekV3ForCausalLM"]
    assert draft.hf_config.model_type == "deepseek_v3"
    assert getattr(draft.hf_config, "n_predict", None) is None
    # vLLM's own draft_model speculator builds and loads it
    from vllm.v1.worker.gpu.spec_decode.standalone_ar.speculator import StandaloneARSpeculator

    model = load_speculator(cfg, StandaloneARSpeculator).model
    assert type(model).__name__ == "DeepseekV3ForCausalLM"
    import torch

    h = run_forward(model, cfg, torch.tensor([1, 2, 3]), torch.arange(3))
    assert h.shape == (3, spec.hidden_size) and torch.isfinite(h.float()).all()


def test_unconfigured_method_still_detects_mtp_checkpoints(tiny_kimi_dir, tmp_path):
    from testkit.vllm_cpu import make_vllm_config

    spec = dataclasses.replace(TinyKimiSpec(), num_hidden_layers=2)
    write_tiny_deepseek_v3(tmp_path, spec, with_mtp=True)
    cfg = make_vllm_config(tiny_kimi_dir, speculative_config={
        "model": str(tmp_path), "num_speculative_tokens": 1})
    assert cfg.speculative_config.method == "mtp"
    assert cfg.speculative_config.draft_model_config.architectures == ["DeepSeekMTPModel"]


def test_target_callable_hf_overrides_still_reach_the_draft(tiny_kimi_dir, tmp_path):
    from vllm.v1.worker.gpu.spec_decode.standalone_ar.config import (
        StandaloneARSpeculatorConfig,
    )

    def shrink(cfg):
        return cfg

    from types import SimpleNamespace

    Spec = SimpleNamespace(method="draft_model",
                           target_model_config=SimpleNamespace(hf_overrides=shrink))

    assert StandaloneARSpeculatorConfig.draft_hf_overrides(Spec) is shrink
    Spec.target_model_config.hf_overrides = {"num_hidden_layers": 1}  # dict: target-only
    assert StandaloneARSpeculatorConfig.draft_hf_overrides(Spec) == {}
    Spec.method = None  # auto-detection keeps the checkpoint rewrites
    assert callable(StandaloneARSpeculatorConfig.draft_hf_overrides(Spec))
