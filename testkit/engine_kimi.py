"""Tiny Kimi-K2.5-shaped checkpoints for the engine tier, and an independent reference.

* :data:`ENGINE_KIMI`: a :class:`~testkit.checkpoints.TinyKimiSpec` whose MLA latent is
  Kimi-K2.5's own (``kv_lora_rank 512 + qk_rope_head_dim 64 = 576``, the only head size
  vLLM 0.34.0's ``CPU_MLA`` decode kernel has, see :mod:`testkit.engine_mla_ops`), with
  the rest tiny: hidden 64, 4 heads, 3 layers (1 dense + 2 MoE of 8 routed experts, top 2,
  1 shared expert, sigmoid routing with correction bias), vocab 1024 + 256 specials.
* :func:`write_kimi_target`: that model as a ``KimiK25ForConditionalGeneration``
  checkpoint (real tensor names, a vision tower the engine skips in text-only mode),
  float32, optionally with its MTP layer (``num_nextn_predict_layers: 1``).
* drafts for it: EAGLE-3 Llama-style and MLA heads (:func:`write_kimi_eagle3`), DFlash
  (:func:`write_kimi_dflash`), a dense draft with another tokenizer for ``kimi_tli``
  (:func:`write_kimi_tli_pair`).
* :func:`hf_greedy`: greedy continuations of the same checkpoint computed by Hugging Face
  transformers' own ``DeepseekV3ForCausalLM`` (eager attention, per-expert loop): no vLLM
  code, so an engine that agrees with it token for token computes the model correctly.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import torch

from testkit.checkpoints import TinyEagle3Spec, TinyKimiSpec, write_tiny_eagle3, write_tiny_kimi_k25

ENGINE_KIMI = TinyKimiSpec(kv_lora_rank=512, qk_rope_head_dim=64)


def write_kimi_target(path: str | Path, *, with_mtp: bool = False, seed: int = 0) -> Path:
    """:data:`ENGINE_KIMI` as a float32 ``KimiK25ForConditionalGeneration`` checkpoint."""
    path = Path(path)
    if not (path / "model.safetensors").is_file():
        write_tiny_kimi_k25(path, ENGINE_KIMI, with_mtp=with_mtp, seed=seed,
                            dtype=torch.float32)
    return path


def write_kimi_eagle3(path: str | Path, style: str, *, seed: int = 1) -> Path:
    """An EAGLE-3 head for :data:`ENGINE_KIMI` (``style``: ``llama`` or ``mla``), taps of
    layers (0, 1, 2) as three aux hidden states, full vocabulary."""
    path = Path(path)
    if not (path / "model.safetensors").is_file():
        write_tiny_eagle3(path, ENGINE_KIMI, TinyEagle3Spec(style=style, aux_layer_ids=(0, 1, 2)),
                          seed=seed, dtype=torch.float32)
    return path


def write_kimi_dflash(path: str | Path, *, seed: int = 3) -> Path:
    from testkit.draft_scenarios import write_tiny_dflash

    path = Path(path)
    if not (path / "model.safetensors").is_file():
        write_tiny_dflash(path, ENGINE_KIMI, seed=seed, dtype=torch.float32)
    return path


def write_kimi_tli_pair(target: str | Path, draft: str | Path) -> tuple[Path, Path]:
    """The target's Kimi-format tokenizer files, and a dense Qwen3 draft with a byte-level
    tokenizer of another family (:func:`testkit.tli_scenarios.write_tiny_qwen3_draft`)."""
    from testkit.tli_scenarios import write_target_tokenizer, write_tiny_qwen3_draft

    target, draft = Path(target), Path(draft)
    if not (target / "tiktoken.model").is_file():
        write_target_tokenizer(target, ENGINE_KIMI)
    if not (draft / "model.safetensors").is_file():
        write_tiny_qwen3_draft(target, draft, dtype=torch.float32)
    return target, draft


# ---- the independent reference -----------------------------------------------------------

_EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")


def _hf_state_dict(path: Path, n_experts: int) -> dict[str, torch.Tensor]:
    """The checkpoint's language-model tensors in transformers' layout (experts stacked
    as ``gate_up_proj [E, 2·I, H]`` and ``down_proj [E, H, I]``)."""
    from safetensors.torch import load_file

    raw = {k.removeprefix("language_model."): v.float()
           for k, v in load_file(str(path / "model.safetensors")).items()
           if k.startswith("language_model.")}
    out = {k: v for k, v in raw.items() if not _EXPERT.match(k)}
    layers = sorted({int(m.group(1)) for k in raw if (m := _EXPERT.match(k))})
    for i in layers:
        pre = f"model.layers.{i}.mlp.experts."
        out[pre + "gate_up_proj"] = torch.stack([
            torch.cat([raw[f"{pre}{e}.gate_proj.weight"], raw[f"{pre}{e}.up_proj.weight"]])
            for e in range(n_experts)])
        out[pre + "down_proj"] = torch.stack([raw[f"{pre}{e}.down_proj.weight"]
                                              for e in range(n_experts)])
    return out


def hf_model(path: str | Path):
    """transformers' ``DeepseekV3ForCausalLM`` built from the checkpoint's text config,
    float32, every tensor loaded (strict)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    path = Path(path)
    text = dict(json.loads((path / "config.json").read_text())["text_config"])
    for key in ("model_type", "architectures"):
        text.pop(key, None)
    text["num_nextn_predict_layers"] = 0  # transformers has no MTP layer
    cfg = DeepseekV3Config(**text)
    cfg._attn_implementation = "eager"
    model = DeepseekV3ForCausalLM(cfg).float().eval()
    sd = _hf_state_dict(path, cfg.n_routed_experts)
    sd = {k: v for k, v in sd.items() if not k.startswith(f"model.layers.{cfg.num_hidden_layers}.")}
    model.load_state_dict(sd, strict=True)
    return model


@dataclasses.dataclass(frozen=True)
class Greedy:
    tokens: list[int]
    margins: list[float]  # top-1 minus top-2 logit at each step


def hf_greedy(path: str | Path, prompts: list[list[int]], max_tokens: list[int]) -> list[Greedy]:
    """Greedy continuations by transformers (one prompt at a time, KV cache on)."""
    model = hf_model(path)
    out = []
    with torch.no_grad():
        for prompt, n in zip(prompts, max_tokens):
            ids, past, toks, margins = torch.tensor([prompt]), None, [], []
            for _ in range(n):
                res = model(input_ids=ids, past_key_values=past, use_cache=True)
                past = res.past_key_values
                top = res.logits[0, -1].topk(2)
                toks.append(int(top.indices[0]))
                margins.append(float(top.values[0] - top.values[1]))
                ids = top.indices[:1].view(1, 1)
            out.append(Greedy(toks, margins))
    return out
