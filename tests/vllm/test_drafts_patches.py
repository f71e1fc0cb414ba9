"""Draft patches on the `drafts` branch: EAGLE-3 d2t / DeepSeek-type heads, Kimi-K2.5 MTP.

Each test skips with the reason when the running vLLM lacks the patch (detected
by a symbol the patch adds). Path under test: EngineArgs -> VllmConfig ->
vLLM's loader, every parameter poisoned before loading and checked after.
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from vllm_kimi_ext.testing.checkpoints import (
    TinyEagle3Spec,
    TinyKimiSpec,
    mtp_layer_tensors,
    write_tiny_eagle3,
    write_tiny_kimi_k25,
)

pytestmark = pytest.mark.vllm


def _has(module: str, symbol: str) -> bool:
    try:
        return hasattr(importlib.import_module(module), symbol)
    except ImportError:
        return False


def _needs(module: str, symbol: str, patch: str):
    return pytest.mark.skipif(
        not _has(module, symbol),
        reason=f"running vLLM lacks the '{patch}' patch ({module}.{symbol})")


needs_d2t_check = _needs("vllm.model_executor.models.utils", "verify_eagle3_draft_vocab_map",
                         "Refuse EAGLE-3 heads with a reduced vocabulary but no d2t map")
needs_eagle3_rewrite_fix = _needs("vllm.config.speculative", "_is_eagle3_draft_architecture",
                                  "Do not rewrite DeepSeek-type EAGLE-3 heads into MTP drafts")
needs_kimi_mtp = _needs("vllm.model_executor.models.deepseek_mtp", "KimiK25MTP",
                        "Support DeepSeek-style MTP drafts for Kimi-K2.5")

MTP_SPEC = dataclasses.replace(TinyKimiSpec(), num_hidden_layers=2)


def _eagle3_cfg(target_dir, draft_dir):
    from vllm_kimi_ext.testing.vllm_cpu import make_vllm_config

    return make_vllm_config(target_dir, speculative_config={
        "method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": 2})


@needs_d2t_check
def test_reduced_vocab_head_without_d2t_is_refused_at_load(tiny_kimi_dir, tmp_path):
    from vllm_kimi_ext.testing.vllm_cpu import load_model

    draft = tmp_path / "no-d2t"
    write_tiny_eagle3(draft, TinyKimiSpec(), TinyEagle3Spec(draft_vocab_size=300,
                                                            with_d2t=False))
    cfg = _eagle3_cfg(tiny_kimi_dir, draft)
    with pytest.raises(ValueError) as err:
        load_model(cfg, cfg.speculative_config.draft_model_config)
    msg = str(err.value)
    assert "draft_vocab_size=300" in msg and f"vocab_size={TinyKimiSpec().vocab_size}" in msg
    assert "no 'd2t' tensor" in msg


@needs_d2t_check
def test_d2t_out_of_range_is_refused_at_load(tiny_kimi_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    from vllm_kimi_ext.testing.vllm_cpu import load_model

    draft = tmp_path / "bad-d2t"
    write_tiny_eagle3(draft, TinyKimiSpec(), TinyEagle3Spec(draft_vocab_size=300))
    tensors = load_file(draft / "model.safetensors")
    tensors["d2t"][10] = TinyKimiSpec().vocab_size
    save_file(tensors, draft / "model.safetensors", metadata={"format": "pt"})
    cfg = _eagle3_cfg(tiny_kimi_dir, draft)
    with pytest.raises(ValueError, match=r"maps 1 draft id\(s\) outside .*draft id 10"):
        load_model(cfg, cfg.speculative_config.draft_model_config)


@needs_eagle3_rewrite_fix
def test_deepseek_v3_typed_mla_head_loads_as_eagle3(tiny_kimi_dir, tmp_path):
    from vllm_kimi_ext.testing.vllm_cpu import load_model

    draft = tmp_path / "mla-v3"
    write_tiny_eagle3(draft, TinyKimiSpec(), TinyEagle3Spec(style="mla",
                                                            mla_model_type="deepseek_v3"))
    cfg = _eagle3_cfg(tiny_kimi_dir, draft)
    dcfg = cfg.speculative_config.draft_model_config
    assert dcfg.architectures == ["Eagle3DeepseekV2ForCausalLM"]
    model, report = load_model(cfg, dcfg)
    assert type(model).__name__ == "Eagle3DeepseekV2ForCausalLM"
    assert report.unwritten == []


@needs_eagle3_rewrite_fix
def test_plain_deepseek_v3_arch_as_eagle3_is_refused_with_reason(tiny_kimi_dir, tmp_path):
    import json

    from vllm_kimi_ext.testing.vllm_cpu import make_vllm_config

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


def _mtp_forward(model, cfg, spec):
    from vllm_kimi_ext.testing.vllm_cpu import check_mtp_forward

    check_mtp_forward(model, cfg, spec.hidden_size, spec.vocab_size)


@needs_kimi_mtp
def test_kimi_k25_mtp_inside_target_checkpoint(tmp_path):
    from vllm_kimi_ext.testing.vllm_cpu import (
        load_checked_kimi_mtp,
        load_model,
        make_vllm_config,
    )

    written = write_tiny_kimi_k25(tmp_path, MTP_SPEC, with_mtp=True)
    cfg = make_vllm_config(tmp_path, speculative_config={
        "method": "mtp", "num_speculative_tokens": 1})
    model, report = load_checked_kimi_mtp(cfg)
    mtp = {n for n in written if n.startswith("language_model.model.layers.2.")}
    assert mtp and mtp <= set(report.checkpoint_tensors)
    _mtp_forward(model, cfg, MTP_SPEC)
    # the target itself still loads every parameter (MTP tensors are not its own)
    target, treport = load_model(cfg)
    assert type(target).__name__ == "KimiK25ForConditionalGeneration"
    assert treport.unwritten == []


@needs_kimi_mtp
def test_kimi_k25_mtp_from_separate_directory(tmp_path):
    """`model` names a directory holding only the MTP layer and a kimi_k25 config."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from vllm_kimi_ext.testing.vllm_cpu import load_model, make_vllm_config

    target = tmp_path / "target"
    write_tiny_kimi_k25(target, MTP_SPEC)
    full = tmp_path / "full"
    write_tiny_kimi_k25(full, MTP_SPEC, with_mtp=True)
    only = tmp_path / "mtp-only"
    only.mkdir()
    shutil.copy(full / "config.json", only / "config.json")
    keep = {n for n, _ in mtp_layer_tensors(MTP_SPEC, 2, "language_model.model.layers")}
    tensors = {n: t for n, t in load_file(full / "model.safetensors").items() if n in keep}
    save_file(tensors, only / "model.safetensors", metadata={"format": "pt"})
    assert json.loads((only / "config.json").read_text())["model_type"] == "kimi_k25"
    cfg = make_vllm_config(target, speculative_config={
        "method": "mtp", "model": str(only), "num_speculative_tokens": 1})
    draft = cfg.speculative_config.draft_model_config
    model, report = load_model(cfg, draft)
    assert report.unwritten == []
    assert set(report.checkpoint_tensors) == keep
    _mtp_forward(model, cfg, MTP_SPEC)


@needs_kimi_mtp
@pytest.mark.parametrize("fault", ["missing", "shape"])
def test_kimi_k25_mtp_bad_tensor_is_named(tmp_path, fault):
    import torch
    from safetensors.torch import load_file, save_file

    from vllm_kimi_ext.testing.vllm_cpu import load_model, make_vllm_config

    write_tiny_kimi_k25(tmp_path, MTP_SPEC, with_mtp=True)
    tensors = load_file(tmp_path / "model.safetensors")
    victim = "language_model.model.layers.2.eh_proj.weight"
    if fault == "missing":
        del tensors[victim]
    else:
        tensors[victim] = torch.zeros(MTP_SPEC.hidden_size, MTP_SPEC.hidden_size,
                                      dtype=torch.bfloat16)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    cfg = make_vllm_config(tmp_path, speculative_config={
        "method": "mtp", "num_speculative_tokens": 1})
    with pytest.raises(Exception) as err:
        model, report = load_model(cfg, cfg.speculative_config.draft_model_config)
        if report.unwritten:  # a loader that skipped it silently: name it ourselves
            raise AssertionError(f"unwritten: {report.unwritten}")
    assert "eh_proj" in str(err.value)


@needs_kimi_mtp
def test_kimi_k25_without_mtp_layers_is_still_refused(tiny_kimi_dir):
    from vllm_kimi_ext.testing.vllm_cpu import make_vllm_config

    with pytest.raises(Exception, match="needs MTP layers.*num_nextn_predict_layers=0"):
        make_vllm_config(tiny_kimi_dir, speculative_config={
            "method": "mtp", "num_speculative_tokens": 1})
