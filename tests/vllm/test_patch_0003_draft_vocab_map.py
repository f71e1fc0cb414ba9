"""Patch 0003: a draft vocabulary smaller than the target's needs a valid
``d2t`` map (stock: a silent all-zero map, acceptance collapses).

EAGLE-3 heads and DFlash drafters, through EngineArgs -> VllmConfig -> vLLM's
loader, every parameter poisoned before loading and checked after.
"""

from __future__ import annotations

import json

import pytest
import torch

from testkit.checkpoints import TinyEagle3Spec, TinyKimiSpec, write_tiny_eagle3
from testkit.draft_scenarios import has_vllm_symbol

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not has_vllm_symbol("vllm.model_executor.models.utils", "verify_eagle3_draft_vocab_map"),
        reason="running vLLM lacks patch 0003 (utils.verify_eagle3_draft_vocab_map)"),
]


def test_reduced_vocab_head_without_d2t_is_refused_at_load(tiny_kimi_dir, tmp_path, eagle3_config):
    from testkit.vllm_cpu import load_model

    draft = tmp_path / "no-d2t"
    write_tiny_eagle3(draft, TinyKimiSpec(), TinyEagle3Spec(draft_vocab_size=300,
                                                            with_d2t=False))
    cfg = eagle3_config(tiny_kimi_dir, draft)
    with pytest.raises(ValueError) as err:
        load_model(cfg, cfg.speculative_config.draft_model_config)
    msg = str(err.value)
    assert "draft_vocab_size=300" in msg and f"vocab_size={TinyKimiSpec().vocab_size}" in msg
    assert "no 'd2t' tensor" in msg


def test_d2t_out_of_range_is_refused_at_load(tiny_kimi_dir, tmp_path, eagle3_config):
    from safetensors.torch import load_file, save_file

    from testkit.vllm_cpu import load_model

    draft = tmp_path / "bad-d2t"
    write_tiny_eagle3(draft, TinyKimiSpec(), TinyEagle3Spec(draft_vocab_size=300))
    tensors = load_file(draft / "model.safetensors")
    tensors["d2t"][10] = TinyKimiSpec().vocab_size
    save_file(tensors, draft / "model.safetensors", metadata={"format": "pt"})
    cfg = eagle3_config(tiny_kimi_dir, draft)
    with pytest.raises(ValueError, match=r"maps 1 draft id\(s\) outside .*draft id 10"):
        load_model(cfg, cfg.speculative_config.draft_model_config)


def _reduce_vocab(path, rows: int) -> None:
    from safetensors.torch import load_file, save_file

    cfg = json.loads((path / "config.json").read_text())
    cfg["draft_vocab_size"] = rows
    (path / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(path / "model.safetensors")
    tensors["lm_head.weight"] = tensors["lm_head.weight"][:rows].contiguous()
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_dflash_reduced_vocab_without_d2t_is_refused(tiny_kimi_dir, tmp_path):
    from testkit.draft_scenarios import write_tiny_dflash
    from testkit.vllm_cpu import load_model, make_vllm_config

    draft = tmp_path / "dflash"
    write_tiny_dflash(draft)
    _reduce_vocab(draft, 512)
    cfg = make_vllm_config(tiny_kimi_dir, speculative_config={
        "method": "dflash", "model": str(draft), "num_speculative_tokens": 3})
    with pytest.raises(ValueError, match="has no 'd2t' tensor"):
        load_model(cfg, cfg.speculative_config.draft_model_config)


def test_dflash_reduced_vocab_with_d2t_loads(tiny_kimi_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    from testkit.draft_scenarios import write_tiny_dflash
    from testkit.vllm_cpu import load_model, make_vllm_config

    draft = tmp_path / "dflash"
    write_tiny_dflash(draft)
    _reduce_vocab(draft, 512)
    tensors = load_file(draft / "model.safetensors")
    kept = torch.arange(0, 1024, 2)  # every other target id
    tensors["d2t"] = kept - torch.arange(512)
    save_file(tensors, draft / "model.safetensors", metadata={"format": "pt"})
    cfg = make_vllm_config(tiny_kimi_dir, speculative_config={
        "method": "dflash", "model": str(draft), "num_speculative_tokens": 3})
    model, report = load_model(cfg, cfg.speculative_config.draft_model_config)
    # mask_embedding is loaded only when the checkpoint ships one; otherwise DFlash
    # embeds masked slots through mask_token_id and the parameter is unused
    assert report.unwritten in ([], ["model.mask_embedding"])
    assert torch.equal(model.draft_id_to_target_id.cpu(), kept - torch.arange(512))
