"""Tiny Llama-shaped checkpoints for the engine tier, written on the fly (no hub).

* :func:`write_llama_target`: a random 2-layer ``LlamaForCausalLM`` (hidden 128, 4 heads of
  32, 2 KV heads so TP 2 splits them, vocab 512), written by Hugging Face transformers
  itself, so the same directory is the independent reference (HF forward) for sampling
  tests;
* drafts for it: :func:`write_llama_eagle` (EAGLE-1, ``EagleLlamaForCausalLM`` after
  vLLM's rewrite: ``fc`` over ``[embeds ‖ hidden]``, one layer without input norm, the
  target's LM head), :func:`write_llama_eagle3` (EAGLE-3 Llama-style,
  ``LlamaForCausalLMEagle3``: ``fc`` over the target's aux hidden states of layers
  ``(0, 1)``, one ``midlayer`` over ``[embeds ‖ hidden]``, own ``lm_head`` over the full
  vocabulary), :func:`write_llama_draft_model` (a smaller random Llama with the same
  vocabulary, ``method: draft_model``); a self-draft is the target directory itself.

All weights are float32 (the engine tier runs ``dtype=float32``) and seeded.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from testkit.checkpoints import _dump_config, _mlp, _write_safetensors


@dataclasses.dataclass(frozen=True)
class TinyLlamaSpec:
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 256
    vocab_size: int = 512
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def config_dict(self, **over) -> dict:
        cfg = {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": self.hidden_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size, "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings, "hidden_act": "silu",
            "rms_norm_eps": 1e-5, "rope_theta": self.rope_theta, "tie_word_embeddings": False,
            "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
        }
        cfg.update(over)
        return cfg


def write_llama_target(path: str | Path, spec: TinyLlamaSpec | None = None,
                       seed: int = 0) -> Path:
    """A random ``LlamaForCausalLM`` saved by transformers (config + safetensors)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = spec or TinyLlamaSpec()
    path = Path(path)
    torch.manual_seed(seed)
    cfg = spec.config_dict()
    cfg.pop("architectures"), cfg.pop("model_type")
    model = LlamaForCausalLM(LlamaConfig(**cfg)).float()
    with torch.no_grad():  # HF initialises with std 0.02: make the logits far from flat
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.0 / p.shape[1] ** 0.5)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def write_llama_draft_model(path: str | Path, target: TinyLlamaSpec | None = None,
                            seed: int = 5) -> Path:
    """A smaller random Llama (1 layer, hidden 64) over the target's vocabulary."""
    target = target or TinyLlamaSpec()
    small = dataclasses.replace(target, hidden_size=64, num_hidden_layers=1,
                                num_attention_heads=2, num_key_value_heads=2,
                                intermediate_size=128)
    return write_llama_target(path, small, seed=seed)


def _attn(pre: str, q_in: int, heads: int, kv_heads: int, head_dim: int, out: int):
    yield f"{pre}.q_proj.weight", (heads * head_dim, q_in)
    yield f"{pre}.k_proj.weight", (kv_heads * head_dim, q_in)
    yield f"{pre}.v_proj.weight", (kv_heads * head_dim, q_in)
    yield f"{pre}.o_proj.weight", (out, heads * head_dim)


def write_llama_eagle(path: str | Path, target: TinyLlamaSpec | None = None,
                      seed: int = 3) -> Path:
    """An EAGLE-1 head (one Llama layer) for the target (HF EAGLE layout)."""
    t = target or TinyLlamaSpec()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    _dump_config(path, t.config_dict(num_hidden_layers=1))
    h = t.hidden_size

    def tensors():
        yield "embed_tokens.weight", (t.vocab_size, h)
        yield "fc.weight", (h, 2 * h)
        yield "layers.0.post_attention_layernorm.weight", (h,)
        yield from _attn("layers.0.self_attn", h, t.num_attention_heads,
                         t.num_key_value_heads, t.head_dim, h)
        yield from _mlp("layers.0.mlp", h, t.intermediate_size)

    _write_safetensors(path, tensors(), seed, torch.float32)
    return path


#: the target layers whose inputs the EAGLE-3 head reads (a 2-layer target)
EAGLE3_AUX_LAYERS = (0, 1)


def write_llama_eagle3(path: str | Path, target: TinyLlamaSpec | None = None,
                       seed: int = 4) -> Path:
    """An EAGLE-3 head, Llama-style (``LlamaForCausalLMEagle3``), full vocabulary."""
    t = target or TinyLlamaSpec()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    h, n_aux = t.hidden_size, len(EAGLE3_AUX_LAYERS)
    _dump_config(path, t.config_dict(
        architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1,
        draft_vocab_size=t.vocab_size, target_hidden_size=h, num_aux_hidden_states=n_aux,
        eagle_aux_hidden_state_layer_ids=list(EAGLE3_AUX_LAYERS),
        eagle_config={"use_aux_hidden_state": True,
                      "use_input_layernorm_in_first_layer": True}))

    def tensors():
        yield "embed_tokens.weight", (t.vocab_size, h)
        yield "fc.weight", (h, n_aux * h)
        for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            yield f"midlayer.{norm}.weight", (h,)
        yield from _attn("midlayer.self_attn", 2 * h, t.num_attention_heads,
                         t.num_key_value_heads, t.head_dim, h)
        yield from _mlp("midlayer.mlp", h, t.intermediate_size)
        yield "norm.weight", (h,)
        yield "lm_head.weight", (t.vocab_size, h)

    _write_safetensors(path, tensors(), seed, torch.float32)
    return path
