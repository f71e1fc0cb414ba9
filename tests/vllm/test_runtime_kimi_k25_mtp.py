"""Runtime patches R09/R10 (the plugin's "Kimi-K2.5 MTP drafts" feature, formerly a
git patch): DeepSeek-style MTP drafts for Kimi-K2.5 (``KimiK25MTPModel``),
from layer 61 inside the target checkpoint or from a separate directory; a bad
or missing MTP tensor is named; a K2.5 without MTP layers is still refused.

Path under test: EngineArgs -> VllmConfig -> vLLM's loader, every parameter
poisoned before loading and checked after. The INT4 (compressed-tensors) MTP
path is in test_mtp_int4.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from testkit.checkpoints import TinyKimiSpec, mtp_layer_tensors, write_tiny_kimi_k25

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("kimi_mtp_drafts")]


MTP_SPEC = dataclasses.replace(TinyKimiSpec(), num_hidden_layers=2)


def _mtp_forward(model, cfg, spec):
    from testkit.vllm_cpu import check_mtp_forward

    check_mtp_forward(model, cfg, spec.hidden_size, spec.vocab_size)


def test_kimi_k25_mtp_inside_target_checkpoint(tmp_path):
    from testkit.vllm_cpu import (
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


def test_kimi_k25_mtp_from_separate_directory(tmp_path):
    """`model` names a directory holding only the MTP layer and a kimi_k25 config."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from testkit.vllm_cpu import load_model, make_vllm_config

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


@pytest.mark.parametrize("fault", ["missing", "shape"])
def test_kimi_k25_mtp_bad_tensor_is_named(tmp_path, fault):
    import torch
    from safetensors.torch import load_file, save_file

    from testkit.vllm_cpu import load_model, make_vllm_config

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


def test_without_the_runtime_patches_vllm_cannot_read_kimi_mtp(tmp_path):
    """What the feature fixes, on vLLM as it ships: the MTP layer of a Kimi-K2.5
    checkpoint is not found (its text config is nested), so method "mtp" is refused."""
    from testkit.vllm_cpu import make_vllm_config
    from vllm_kimi_ext import runtime
    from vllm_kimi_ext.runtime.speculative_config import SpeculativeConfigKimiK25MTP

    write_tiny_kimi_k25(tmp_path, MTP_SPEC, with_mtp=True)
    assert SpeculativeConfigKimiK25MTP.revert()
    try:
        with pytest.raises(Exception, match="num_nextn_predict_layers|MTP"):
            make_vllm_config(tmp_path, speculative_config={
                "method": "mtp", "num_speculative_tokens": 1})
    finally:
        runtime.install(SpeculativeConfigKimiK25MTP)


def test_kimi_k25_without_mtp_layers_is_still_refused(tiny_kimi_dir):
    from testkit.vllm_cpu import make_vllm_config

    with pytest.raises(Exception, match="needs MTP layers.*num_nextn_predict_layers=0"):
        make_vllm_config(tiny_kimi_dir, speculative_config={
            "method": "mtp", "num_speculative_tokens": 1})
