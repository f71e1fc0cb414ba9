"""Kimi-K2.5 MTP with the target's INT4 quantization (compressed-tensors).

Kimi-K2.5 ships its routed experts as compressed-tensors ``pack-quantized``
INT4 (group 32) with attention, shared expert, dense FFN and LM head in bf16.
A tiny checkpoint with that layout (every routed expert, target and MTP layer,
really quantized) and Kimi's ``quantization_config`` goes through vLLM's own
config path and loader:

* the MTP draft inherits the target's quantization (the plugin's
  "Kimi-K2.5 MTP drafts" runtime patches keep the top-level ``quantization_config``
  when they promote the text config);
* vLLM builds the MTP layer's routed experts as INT4 (``w13/w2_weight_packed``,
  scales, shapes) and leaves ``eh_proj``, the shared head and attention bf16;
  every parameter is written from the checkpoint (poison check) and every MTP
  tensor is consumed;
* vLLM's own INT4 dequantization (its emulation backend's weight processing)
  gives back the checkpoint's expert weights, expert by expert, gate before up:
  the experts landed where they belong;
* an MTP layer stored unquantized under an INT4 config is caught by
  ``doctor`` before loading (E-MTP-QUANT-FORMAT), and vLLM's loader does fail
  on it; the doctor's "quantized or not" decision agrees with the layout vLLM
  builds for three ignore lists.

Stand-in (test only): vLLM's CPU platform offers only the WNA16 MoE backends
that need its compiled CPU ops, absent from a Python-only build; backend
selection is pointed at vLLM's emulation backend. The parameter layout is the
compressed-tensors WNA16 layout whatever the backend. Not run here: an INT4 MoE
forward (the emulation experts run Triton kernels).
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

from testkit.checkpoints import (
    KIMI_INT4_QUANTIZATION_CONFIG,
    TinyKimiSpec,
    unpack_int4,
    write_tiny_kimi_k25,
)

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("kimi_mtp_drafts")]


SPEC = dataclasses.replace(TinyKimiSpec(), num_hidden_layers=2)
MTP = SPEC.num_hidden_layers  # the MTP layer's index
INTER = SPEC.moe_intermediate_size


@pytest.fixture
def emulated_wna16_backend(monkeypatch):
    import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_wna16 as wna16  # noqa: E501
    from vllm.model_executor.layers.fused_moe.oracle import int_wna16

    emulation = int_wna16.WNA16MoEBackend.EMULATION

    def select(*_args, **_kwargs):
        return emulation, int_wna16.backend_to_kernel_cls(emulation)[0]

    monkeypatch.setattr(wna16, "select_wna16_moe_backend", select)


def _mtp_cfg(path):
    from testkit.vllm_cpu import make_vllm_config

    return make_vllm_config(path, speculative_config={"method": "mtp",
                                                      "num_speculative_tokens": 1})


def test_int4_mtp_loads_with_the_targets_quantization(tmp_path, emulated_wna16_backend):
    from safetensors.torch import load_file

    from testkit.vllm_cpu import load_model
    from vllm_kimi_ext.drafts.doctor.diagnosis import diagnose

    written = write_tiny_kimi_k25(tmp_path, SPEC, with_mtp=True, int4_experts=True)
    assert not [f.code for f in diagnose(tmp_path, tmp_path, method="mtp").findings
                if f.severity == "error"]
    cfg = _mtp_cfg(tmp_path)
    draft = cfg.speculative_config.draft_model_config
    assert draft.architectures == ["KimiK25MTPModel"]
    assert cfg.model_config.quantization == draft.quantization == "compressed-tensors"

    model, report = load_model(cfg, draft, process=False)
    assert report.unwritten == []
    mtp_tensors = {n for n in written if n.startswith(f"language_model.model.layers.{MTP}.")}
    assert any(n.endswith("weight_packed") for n in mtp_tensors)
    assert mtp_tensors <= set(report.checkpoint_tensors)
    params = dict(model.named_parameters())
    experts = f"model.layers.{MTP}.mtp_block.mlp.experts.routed_experts"
    assert params[f"{experts}.w13_weight_packed"].dtype == torch.int32
    assert params[f"{experts}.w13_weight_packed"].shape == (SPEC.n_routed_experts, 2 * INTER,
                                                            SPEC.hidden_size // 8)
    layer = f"model.layers.{MTP}"
    for bf16 in (f"{layer}.eh_proj.weight", f"{layer}.shared_head.head.weight",
                 f"{layer}.mtp_block.self_attn.o_proj.weight",
                 f"{layer}.mtp_block.mlp.shared_experts.down_proj.weight"):
        assert params[bf16].dtype == torch.bfloat16, bf16

    # vLLM's own INT4 weight processing (emulation backend: dequantize) gives back
    # the checkpoint's experts, each in its slot, gate rows before up rows
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    process_weights_after_loading(model, draft, torch.device("cpu"))
    w13 = dict(model.named_parameters())[f"{experts}.w13_weight_packed"].float()
    w2 = dict(model.named_parameters())[f"{experts}.w2_weight_packed"].float()
    ckpt = load_file(tmp_path / "model.safetensors")
    for e in (0, SPEC.n_routed_experts - 1):
        pre = f"language_model.model.layers.{MTP}.mlp.experts.{e}."

        def deq(proj, pre=pre):
            return unpack_int4(ckpt[pre + proj + ".weight_packed"],
                               ckpt[pre + proj + ".weight_scale"])

        torch.testing.assert_close(w13[e], torch.cat([deq("gate_proj"), deq("up_proj")]),
                                   rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(w2[e], deq("down_proj"), rtol=1e-2, atol=1e-2)
    # the target's own INT4 layers load too
    _, target_report = load_model(cfg, process=False)
    assert target_report.unwritten == []


def _unquantize_mtp_experts(path):
    from safetensors.torch import load_file, save_file

    tensors = load_file(path / "model.safetensors")
    out = {}
    pattern = re.compile(
        rf"(language_model\.model\.layers\.{MTP}\.mlp\.experts\.\d+\.\w+_proj\.)"
        r"weight_(packed|scale|shape)$")
    for name, t in tensors.items():
        m = pattern.match(name)
        if m is None:
            out[name] = t
        elif m.group(2) == "packed":
            out[m.group(1) + "weight"] = unpack_int4(
                t, tensors[m.group(1) + "weight_scale"]).to(torch.bfloat16)
    save_file(out, path / "model.safetensors", metadata={"format": "pt"})


def test_unquantized_mtp_under_int4_config_is_named_before_loading(
        tmp_path, emulated_wna16_backend):
    from testkit.vllm_cpu import load_model
    from vllm_kimi_ext.drafts.doctor.diagnosis import diagnose

    write_tiny_kimi_k25(tmp_path, SPEC, with_mtp=True, int4_experts=True)
    _unquantize_mtp_experts(tmp_path)
    findings = [f for f in diagnose(tmp_path, tmp_path, method="mtp").findings
                if f.code == "E-MTP-QUANT-FORMAT"]
    assert len(findings) == 1
    msg = findings[0].message
    assert f"MTP layer {MTP}" in msg and "weight_packed" in msg and "unquantized" in msg
    assert f"'re:.*layers\\.{MTP}\\..*'" in msg
    # what happens without the check: vLLM's loader fails on the first expert
    cfg = _mtp_cfg(tmp_path)
    with pytest.raises(Exception, match="experts"):
        load_model(cfg, cfg.speculative_config.draft_model_config, process=False)


@pytest.mark.parametrize("extra_ignore,expect_quantized", [
    ([], True),                                         # Kimi's list: experts INT4
    ([f"re:.*layers\\.{MTP}\\..*"], False),             # the fix the doctor suggests
    ([f"model.layers.{MTP}.mlp.experts.0.gate_proj",
      f"model.layers.{MTP}.mlp.experts.0.up_proj",
      f"model.layers.{MTP}.mlp.experts.0.down_proj"], False),  # the names vLLM checks
    ([f"language_model.model.layers.{MTP}.mlp.experts"], True),  # checkpoint names: no match
])
def test_doctor_quantization_decision_matches_vllm(tmp_path, emulated_wna16_backend,
                                                   extra_ignore, expect_quantized):
    from testkit.vllm_cpu import cpu_config_without_triton_cpu
    from vllm_kimi_ext.drafts.doctor.diagnosis import mtp_experts_quantized

    write_tiny_kimi_k25(tmp_path, SPEC, with_mtp=True)
    cfg_json = json.loads((tmp_path / "config.json").read_text())
    qc = json.loads(json.dumps(KIMI_INT4_QUANTIZATION_CONFIG))
    qc["ignore"] += extra_ignore
    cfg_json["quantization_config"] = qc
    (tmp_path / "config.json").write_text(json.dumps(cfg_json))
    assert mtp_experts_quantized(qc, MTP) is expect_quantized

    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.utils.torch_utils import set_default_torch_dtype

    cfg = _mtp_cfg(tmp_path)
    draft = cfg.speculative_config.draft_model_config
    with set_current_vllm_config(cfg), cpu_config_without_triton_cpu():
        with set_default_torch_dtype(draft.dtype), torch.device("cpu"):
            model = get_model_loader(cfg.load_config).create_model(vllm_config=cfg,
                                                                   model_config=draft)
    names = {n for n, _ in model.named_parameters()}
    experts = f"model.layers.{MTP}.mtp_block.mlp.experts.routed_experts"
    assert (f"{experts}.w13_weight_packed" in names) is expect_quantized
    assert (f"{experts}.w13_weight" in names) is (not expect_quantized)
