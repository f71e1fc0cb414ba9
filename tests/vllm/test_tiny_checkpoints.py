"""Tiny Kimi-shaped checkpoints load into vLLM's real classes, every parameter written.

Path under test: EngineArgs → VllmConfig → vLLM's model loader (create_model,
load_weights, process_weights_after_loading) → forward / compute_logits.
Each parameter is poisoned (NaN) before loading and checked after.
"""

from __future__ import annotations

import dataclasses

import pytest

from testkit.checkpoints import (
    TinyEagle3Spec,
    TinyKimiSpec,
    write_tiny_deepseek_v3,
    write_tiny_eagle3,
    write_tiny_kimi_k25,
)

pytestmark = pytest.mark.vllm


def _forward_and_logits(model, cfg, vocab: int, hidden: int):
    import torch

    from testkit.vllm_cpu import compute_logits, run_forward

    ids = torch.tensor([1, 5, 7, vocab - 1])
    h = run_forward(model, cfg, ids, torch.arange(4))
    assert h.shape == (4, hidden)
    logits = compute_logits(model, cfg, h)
    assert logits.shape[0] == 4 and logits.shape[1] >= vocab
    assert torch.isfinite(logits[:, :vocab].float()).all()
    return logits


def test_kimi_k25_real_class_loads_every_parameter(tiny_kimi_dir):
    from testkit.vllm_cpu import load_model, make_vllm_config

    spec = TinyKimiSpec()
    cfg = make_vllm_config(tiny_kimi_dir)
    assert cfg.model_config.architectures == ["KimiK25ForConditionalGeneration"]
    model, report = load_model(cfg)
    assert type(model).__name__ == "KimiK25ForConditionalGeneration"
    assert report.unwritten == []
    assert report.num_parameters > 0
    # every language-model tensor of the checkpoint was offered to the model
    offered = set(report.checkpoint_tensors)
    from testkit.checkpoints import text_tensors

    expected = {n for n, _ in text_tensors(spec, prefix="language_model.")}
    assert expected <= offered, sorted(expected - offered)[:5]
    # MoE layers hold all experts (fused w13/w2), dense layer a plain MLP
    params = dict(model.named_parameters())
    moe = f"language_model.model.layers.{spec.first_k_dense_replace}.mlp"
    assert params[f"{moe}.experts.routed_experts.w13_weight"].shape == (
        spec.n_routed_experts, 2 * spec.moe_intermediate_size, spec.hidden_size)
    assert f"{moe}.gate.e_score_correction_bias" in params
    assert "language_model.model.layers.0.mlp.gate_up_proj.weight" in params  # dense layer
    _forward_and_logits(model, cfg, spec.vocab_size, spec.hidden_size)


def test_deepseek_v3_text_form_loads(tmp_path):
    from testkit.vllm_cpu import load_model, make_vllm_config

    spec = TinyKimiSpec(num_hidden_layers=2)
    write_tiny_deepseek_v3(tmp_path, spec)
    cfg = make_vllm_config(tmp_path)
    model, report = load_model(cfg)
    assert type(model).__name__ == "DeepseekV3ForCausalLM"
    assert report.unwritten == []
    _forward_and_logits(model, cfg, spec.vocab_size, spec.hidden_size)


def test_missing_tensor_is_detected(tmp_path):
    """The harness cannot pass a checkpoint that lacks a tensor."""
    from safetensors.torch import load_file, save_file

    from testkit.vllm_cpu import load_model, make_vllm_config

    spec = TinyKimiSpec(num_hidden_layers=2)
    write_tiny_deepseek_v3(tmp_path, spec)
    tensors = load_file(tmp_path / "model.safetensors")
    victim = "model.layers.1.self_attn.kv_a_layernorm.weight"
    del tensors[victim]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    cfg = make_vllm_config(tmp_path)
    try:
        _, report = load_model(cfg)
    except ValueError as exc:  # vLLM's own strict check
        assert "kv_a_layernorm" in str(exc)
    else:
        assert any("layers.1.self_attn.kv_a_layernorm" in n for n in report.unwritten)


@pytest.mark.parametrize("style,arch", [("llama", "Eagle3LlamaForCausalLM"),
                                        ("mla", "Eagle3DeepseekV2ForCausalLM")])
@pytest.mark.parametrize("draft_vocab", [None, 512])
def test_eagle3_heads_load_on_kimi_target(tiny_kimi_dir, tmp_path, style, arch, draft_vocab):
    import torch

    from testkit.vllm_cpu import load_model, make_vllm_config

    target = TinyKimiSpec()
    draft_dir = tmp_path / f"eagle3-{style}"
    written = write_tiny_eagle3(draft_dir, target,
                                TinyEagle3Spec(style=style, draft_vocab_size=draft_vocab))
    cfg = make_vllm_config(tiny_kimi_dir, speculative_config={
        "method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": 3})
    draft_cfg = cfg.speculative_config.draft_model_config
    model, report = load_model(cfg, draft_cfg)
    assert type(model).__name__ == arch
    assert report.unwritten == []
    if draft_vocab:
        from safetensors.torch import load_file

        d2t = load_file(draft_dir / "model.safetensors")["d2t"]
        assert torch.equal(model.draft_id_to_target_id.cpu(), d2t)
    assert set(written) <= set(report.checkpoint_tensors)


def test_mtp_layer_tensors_use_real_names(tmp_path):
    shapes = write_tiny_kimi_k25(tmp_path, dataclasses.replace(TinyKimiSpec(), num_hidden_layers=2),
                                 with_mtp=True)
    mtp = [n for n in shapes if n.startswith("language_model.model.layers.2.")]
    for part in ("enorm", "hnorm", "eh_proj", "shared_head.head", "mlp.experts.0.gate_proj",
                 "mlp.gate.e_score_correction_bias"):
        assert any(part in n for n in mtp), part
