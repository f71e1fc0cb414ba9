"""Runtime patch R10 (formerly a git patch): a separate MTP directory with a DeepSeek-V3 text config
(``deepseek_v3`` or ``kimi_k2``) and plain ``model.layers.N.*`` tensor names
loads as ``KimiK25MTPModel`` on a Kimi-K2.5 target.

vLLM without the patch: ``deepseek_v3`` became
``DeepSeekMTPModel``, which reads its layer counts from the target's nested
``Kimi_K25Config`` and fails while building; ``kimi_k2`` was not rewritten and
was refused as having no MTP layers.  The checks run vLLM's config path and
loader (poison check: every parameter written, every MTP tensor consumed) and a
forward pass.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from testkit.checkpoints import (
    TinyKimiSpec,
    mtp_layer_tensors,
    write_tiny_deepseek_v3,
    write_tiny_kimi_k25,
)

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("kimi_mtp_drafts")]


SPEC = dataclasses.replace(TinyKimiSpec(), num_hidden_layers=2)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = tmp_path_factory.mktemp("k25-target")
    write_tiny_kimi_k25(path, SPEC)
    return path


def _mtp_only_dir(path, model_type: str):
    """A DeepSeek-V3 config + only the MTP layer's tensors (``model.layers.2.*``)."""
    from safetensors.torch import load_file, save_file

    write_tiny_deepseek_v3(path, SPEC, with_mtp=True)
    keep = {n for n, _ in mtp_layer_tensors(SPEC, SPEC.num_hidden_layers)}
    tensors = {n: t for n, t in load_file(path / "model.safetensors").items() if n in keep}
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((path / "config.json").read_text())
    cfg["model_type"] = model_type
    (path / "config.json").write_text(json.dumps(cfg))
    return keep


@pytest.mark.parametrize("model_type", ["deepseek_v3", "kimi_k2"])
def test_deepseek_typed_mtp_dir_loads_for_kimi_target(target, tmp_path, model_type):
    from testkit.vllm_cpu import (
        check_mtp_forward,
        load_checked_kimi_mtp,
        make_vllm_config,
    )
    from vllm_kimi_ext.drafts.doctor.diagnosis import diagnose

    mtp_dir = tmp_path / "mtp"
    keep = _mtp_only_dir(mtp_dir, model_type)
    assert diagnose(target, mtp_dir, method="mtp").findings == []
    cfg = make_vllm_config(target, speculative_config={
        "method": "mtp", "model": str(mtp_dir), "num_speculative_tokens": 1})
    model, report = load_checked_kimi_mtp(cfg)
    assert keep <= set(report.checkpoint_tensors)
    check_mtp_forward(model, cfg, SPEC.hidden_size, SPEC.vocab_size)


def test_deepseek_target_keeps_deepseek_mtp(tmp_path):
    """Only Kimi-K2.5 targets get KimiK25MTPModel."""
    from testkit.vllm_cpu import make_vllm_config

    write_tiny_deepseek_v3(tmp_path, SPEC, with_mtp=True)
    cfg = make_vllm_config(tmp_path, speculative_config={
        "method": "mtp", "num_speculative_tokens": 1})
    assert cfg.speculative_config.draft_model_config.architectures == ["DeepSeekMTPModel"]


@pytest.mark.parametrize("kind", ["dict", "callable"])
def test_vllm_overrides_are_applied_before_the_kimi_rewrite(kind):
    """vLLM's own draft overrides (a dict or a callable) reach the draft config; the
    git patch this replaces dropped a dict."""
    from transformers import PretrainedConfig

    from vllm_kimi_ext.integration import kimi_mtp

    def marked(c):
        c.update({"marker": 3})
        return c

    cfg = PretrainedConfig(num_nextn_predict_layers=1)
    cfg.model_type = "kimi_k2"
    out = kimi_mtp.kimi_target_override(cfg, base={"marker": 3} if kind == "dict" else marked)
    assert out.marker == 3
    assert (out.model_type, out.n_predict, out.architectures) == (
        "deepseek_mtp", 1, [kimi_mtp.ARCHITECTURE])
