"""Tiny Kimi-shaped checkpoints: real config fields and tensor names, tiny dims.

Kimi-K2.5 weights (~600 GB) cannot be used in tests, but the code paths that
load them can: these writers produce HF-style directories (``config.json`` +
``model.safetensors``) whose config carries every field of the real
``moonshotai/Kimi-K2.5`` config (through transformers' ``Kimi_K25Config`` /
``DeepseekV3Config``) and whose tensors carry the exact names of the real
checkpoint (``language_model.model.layers.N.self_attn.kv_a_proj_with_mqa``,
per-expert ``mlp.experts.E.*``, ``mlp.gate.e_score_correction_bias``, a vision
tower and projector, optional MTP layer ``N = num_hidden_layers``), only small.

Dims default to something a 2-core CPU builds in well under a second; every
structural knob of the real model (layers, dense prefix, experts, top-k, MLA
ranks, vocab) is a parameter so tests can derive expectations from the config.

Nothing here imports vLLM.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

import torch

# Real Kimi-K2.5 special ids (moonshotai/Kimi-K2.5 tokenizer_config.json on Hugging Face).
# Tiny vocabularies keep the same *layout*: ``n_ranks`` tiktoken ranks followed by 256
# reserved specials.
KIMI_NUM_SPECIAL = 256


@dataclasses.dataclass(frozen=True)
class TinyKimiSpec:
    """Dimensions of a tiny Kimi-K2.5-shaped language model.

    Defaults keep the real model's *ratios* where it is cheap (64 heads → 4,
    MLA q/kv LoRA ranks, nope/rope split, 1 dense layer then MoE, top-k of many
    experts, one shared expert, sigmoid scoring with correction bias, yarn RoPE).
    """

    num_hidden_layers: int = 3
    first_k_dense_replace: int = 1
    hidden_size: int = 64
    intermediate_size: int = 96
    moe_intermediate_size: int = 32
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    n_shared_experts: int = 1
    num_attention_heads: int = 4
    q_lora_rank: int | None = 32
    kv_lora_rank: int = 32
    qk_nope_head_dim: int = 16
    qk_rope_head_dim: int = 8
    v_head_dim: int = 16
    num_ranks: int = 1024  # tiktoken ranks; vocab = num_ranks + 256 specials
    max_position_embeddings: int = 262144
    rope_original_max_position: int = 4096
    routed_scaling_factor: float = 2.827
    num_nextn_predict_layers: int = 0
    # vision tower (MoonViT) — minimal, one block
    vision_hidden_size: int = 32
    vision_layers: int = 1
    vision_heads: int = 2
    vision_intermediate_size: int = 48
    vision_patch_size: int = 14
    vision_pos_emb: int = 4

    @property
    def vocab_size(self) -> int:
        return self.num_ranks + KIMI_NUM_SPECIAL

    @property
    def bos_token_id(self) -> int:
        return self.num_ranks  # [BOS] is the first special, as in Kimi (163584)

    @property
    def eos_token_id(self) -> int:
        return self.num_ranks + 1  # [EOS] (163585)

    @property
    def pad_token_id(self) -> int:
        return self.vocab_size - 1  # last reserved special (163839)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def moe_layer_ids(self) -> list[int]:
        return list(range(self.first_k_dense_replace, self.num_hidden_layers))

    def text_config_dict(self) -> dict:
        """The text config with the real Kimi-K2.5 field set (``model_type: kimi_k2``)."""
        return {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "kimi_k2",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "aux_loss_alpha": 0.001,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "ep_size": 1,
            "first_k_dense_replace": self.first_k_dense_replace,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate_size,
            "kv_lora_rank": self.kv_lora_rank,
            "max_position_embeddings": self.max_position_embeddings,
            "moe_intermediate_size": self.moe_intermediate_size,
            "moe_layer_freq": 1,
            "n_group": 1,
            "n_routed_experts": self.n_routed_experts,
            "n_shared_experts": self.n_shared_experts,
            "norm_topk_prob": True,
            "num_attention_heads": self.num_attention_heads,
            "num_experts_per_tok": self.num_experts_per_tok,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_attention_heads,
            "num_nextn_predict_layers": self.num_nextn_predict_layers,
            "pretraining_tp": 1,
            "q_lora_rank": self.q_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "rms_norm_eps": 1e-5,
            "rope_scaling": {
                "type": "yarn",
                "factor": self.max_position_embeddings / self.rope_original_max_position,
                "original_max_position_embeddings": self.rope_original_max_position,
                "beta_fast": 1.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
            "rope_theta": 50000.0,
            "routed_scaling_factor": self.routed_scaling_factor,
            "scoring_func": "sigmoid",
            "seq_aux": True,
            "tie_word_embeddings": False,
            "topk_group": 1,
            "topk_method": "noaux_tc",
            "use_cache": True,
            "v_head_dim": self.v_head_dim,
            "vocab_size": self.vocab_size,
            "torch_dtype": "bfloat16",
        }

    def vision_config_dict(self) -> dict:
        return {
            "model_type": "kimi_k25_vision",
            "hidden_size": self.vision_hidden_size,
            "intermediate_size": self.vision_intermediate_size,
            "num_hidden_layers": self.vision_layers,
            "num_attention_heads": self.vision_heads,
            "patch_size": self.vision_patch_size,
            "pos_emb_height": self.vision_pos_emb,
            "pos_emb_width": self.vision_pos_emb,
            "pos_emb_time": 4,
            "merge_kernel_size": [2, 2],
            "hidden_act": "gelu_pytorch_tanh",
        }


# --------------------------------------------------------------------------- #
# Tensor names and shapes                                                      #
# --------------------------------------------------------------------------- #


def _mla_tensors(s: TinyKimiSpec, pre: str) -> Iterator[tuple[str, tuple[int, ...]]]:
    h, nh = s.hidden_size, s.num_attention_heads
    if s.q_lora_rank is None:
        yield f"{pre}.q_proj.weight", (nh * s.qk_head_dim, h)
    else:
        yield f"{pre}.q_a_proj.weight", (s.q_lora_rank, h)
        yield f"{pre}.q_a_layernorm.weight", (s.q_lora_rank,)
        yield f"{pre}.q_b_proj.weight", (nh * s.qk_head_dim, s.q_lora_rank)
    yield f"{pre}.kv_a_proj_with_mqa.weight", (s.kv_lora_rank + s.qk_rope_head_dim, h)
    yield f"{pre}.kv_a_layernorm.weight", (s.kv_lora_rank,)
    yield (
        f"{pre}.kv_b_proj.weight",
        (nh * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank),
    )
    yield f"{pre}.o_proj.weight", (h, nh * s.v_head_dim)


def _mlp(pre: str, hidden: int, inter: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    yield f"{pre}.gate_proj.weight", (inter, hidden)
    yield f"{pre}.up_proj.weight", (inter, hidden)
    yield f"{pre}.down_proj.weight", (hidden, inter)


def _decoder_layer(
    s: TinyKimiSpec, pre: str, moe: bool
) -> Iterator[tuple[str, tuple[int, ...]]]:
    h = s.hidden_size
    yield f"{pre}.input_layernorm.weight", (h,)
    yield f"{pre}.post_attention_layernorm.weight", (h,)
    yield from _mla_tensors(s, f"{pre}.self_attn")
    if not moe:
        yield from _mlp(f"{pre}.mlp", h, s.intermediate_size)
        return
    yield f"{pre}.mlp.gate.weight", (s.n_routed_experts, h)
    yield f"{pre}.mlp.gate.e_score_correction_bias", (s.n_routed_experts,)
    for e in range(s.n_routed_experts):
        yield from _mlp(f"{pre}.mlp.experts.{e}", h, s.moe_intermediate_size)
    yield from _mlp(
        f"{pre}.mlp.shared_experts", h, s.moe_intermediate_size * s.n_shared_experts
    )


def mtp_layer_tensors(
    s: TinyKimiSpec, layer: int, prefix: str = "model.layers"
) -> Iterator[tuple[str, tuple[int, ...]]]:
    """DeepSeek-style MTP layer ``layer`` (= num_hidden_layers): enorm, hnorm,
    eh_proj, a MoE decoder layer, and its shared head (norm + lm_head)."""
    h = s.hidden_size
    pre = f"{prefix}.{layer}"
    yield f"{pre}.enorm.weight", (h,)
    yield f"{pre}.hnorm.weight", (h,)
    yield f"{pre}.eh_proj.weight", (h, 2 * h)
    yield f"{pre}.embed_tokens.weight", (s.vocab_size, h)
    yield from _decoder_layer(s, pre, moe=True)
    yield f"{pre}.shared_head.norm.weight", (h,)
    yield f"{pre}.shared_head.head.weight", (s.vocab_size, h)


def text_tensors(
    s: TinyKimiSpec, prefix: str = "", with_mtp: bool = False
) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Tensor names/shapes of the DeepSeek-V3 language model (``prefix`` is
    ``language_model.`` inside a Kimi-K2.5 checkpoint)."""
    h = s.hidden_size
    yield f"{prefix}model.embed_tokens.weight", (s.vocab_size, h)
    for i in range(s.num_hidden_layers):
        yield from _decoder_layer(
            s, f"{prefix}model.layers.{i}", moe=i >= s.first_k_dense_replace
        )
    yield f"{prefix}model.norm.weight", (h,)
    yield f"{prefix}lm_head.weight", (s.vocab_size, h)
    if with_mtp:
        yield from mtp_layer_tensors(s, s.num_hidden_layers, f"{prefix}model.layers")


def vision_tensors(s: TinyKimiSpec) -> Iterator[tuple[str, tuple[int, ...]]]:
    """MoonViT tower + patch-merger projector, names as in the HF checkpoint."""
    d, p = s.vision_hidden_size, s.vision_patch_size
    yield "vision_tower.patch_embed.proj.weight", (d, 3, p, p)
    yield "vision_tower.patch_embed.proj.bias", (d,)
    yield "vision_tower.patch_embed.pos_emb.weight", (s.vision_pos_emb, s.vision_pos_emb, d)
    for b in range(s.vision_layers):
        pre = f"vision_tower.encoder.blocks.{b}"
        for norm in ("norm0", "norm1"):
            yield f"{pre}.{norm}.weight", (d,)
            yield f"{pre}.{norm}.bias", (d,)
        yield f"{pre}.wqkv.weight", (3 * d, d)
        yield f"{pre}.wqkv.bias", (3 * d,)
        yield f"{pre}.wo.weight", (d, d)
        yield f"{pre}.wo.bias", (d,)
        yield f"{pre}.mlp.fc0.weight", (s.vision_intermediate_size, d)
        yield f"{pre}.mlp.fc0.bias", (s.vision_intermediate_size,)
        yield f"{pre}.mlp.fc1.weight", (d, s.vision_intermediate_size)
        yield f"{pre}.mlp.fc1.bias", (d,)
    yield "vision_tower.encoder.final_layernorm.weight", (d,)
    yield "vision_tower.encoder.final_layernorm.bias", (d,)
    merged = d * 4  # merge_kernel_size 2x2
    yield "mm_projector.pre_norm.weight", (d,)
    yield "mm_projector.pre_norm.bias", (d,)
    yield "mm_projector.proj.0.weight", (merged, merged)
    yield "mm_projector.proj.0.bias", (merged,)
    yield "mm_projector.proj.2.weight", (s.hidden_size, merged)
    yield "mm_projector.proj.2.bias", (s.hidden_size,)


# --------------------------------------------------------------------------- #
# Writers                                                                      #
# --------------------------------------------------------------------------- #


def _init_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Deterministic, well-scaled values (norm weights near 1, biases small)."""
    if (name.endswith(("layernorm.weight", "norm.weight", "enorm.weight", "hnorm.weight"))
            or ".norm0." in name or ".norm1." in name):
        if name.endswith(".bias"):
            return torch.zeros(shape)
        return 1.0 + 0.05 * torch.randn(shape, generator=gen)
    if name.endswith("e_score_correction_bias") or name.endswith(".bias"):
        return 0.01 * torch.randn(shape, generator=gen)
    fan_in = shape[-1] if len(shape) > 1 else 1
    if len(shape) == 4:  # conv
        fan_in = math.prod(shape[1:])
    return torch.randn(shape, generator=gen) / math.sqrt(max(fan_in, 1))


def _write_safetensors(
    path: Path, tensors: Iterator[tuple[str, tuple[int, ...]]], seed: int, dtype: torch.dtype,
    int4_experts: bool = False,
) -> dict[str, tuple[int, ...]]:
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in tensors:
        if name in out:
            raise AssertionError(f"duplicate tensor name {name}")
        out[name] = _init_tensor(name, shape, gen).to(dtype).contiguous()
    if int4_experts:
        out = pack_int4_routed_experts(out)
    save_file(out, str(path / "model.safetensors"), metadata={"format": "pt"})
    return {k: tuple(v.shape) for k, v in out.items()}


def _dump_config(path: Path, cfg: dict) -> None:
    (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


#: Kimi-K2.5's quantization layout: routed experts INT4 (symmetric, group 32,
#: compressed-tensors pack-quantized, Marlin W4A16 on GPUs); attention, shared
#: expert, dense FFN, LM head and vision tower stay bf16.
INT4_GROUP_SIZE = 32
KIMI_INT4_QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "input_activations": None,
        "output_activations": None,
        "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                    "group_size": INT4_GROUP_SIZE, "strategy": "group", "dynamic": False,
                    "actorder": None, "observer": "minmax"},
    }},
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
               "re:.*mlp\\.(gate|up|gate_up|down)_proj.*", "re:.*vision_tower.*",
               "re:.*mm_projector.*"],
    "kv_cache_scheme": None,
}

_ROUTED_EXPERT_WEIGHT = re.compile(r".*\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")


def pack_int4_routed_experts(tensors: dict[str, torch.Tensor],
                             group_size: int = INT4_GROUP_SIZE) -> dict[str, torch.Tensor]:
    """Quantize every routed-expert ``*.weight`` to compressed-tensors
    ``pack-quantized`` INT4 (symmetric, per group of ``group_size`` inputs):
    ``weight_packed`` (int32, 8 values per word along the input dim, low nibble
    first, stored as ``q + 8``), ``weight_scale`` and ``weight_shape``."""
    out: dict[str, torch.Tensor] = {}
    for name, w in tensors.items():
        if not _ROUTED_EXPERT_WEIGHT.match(name):
            out[name] = w
            continue
        rows, cols = w.shape
        if cols % group_size or cols % 8:
            raise ValueError(f"{name}: {cols} inputs not divisible by {group_size} and 8")
        wf = w.float().view(rows, cols // group_size, group_size)
        scale = (wf.abs().amax(-1, keepdim=True) / 7).clamp_min(1e-8)
        q = torch.round(wf / scale).clamp(-8, 7).to(torch.int64).view(rows, cols) + 8
        words = torch.zeros(rows, cols // 8, dtype=torch.int64)
        for i in range(8):
            words |= q[:, i::8] << (4 * i)
        words = torch.where(words >= 2**31, words - 2**32, words)  # as signed int32
        base = name[: -len("weight")]
        out[base + "weight_packed"] = words.to(torch.int32).contiguous()
        out[base + "weight_scale"] = scale.squeeze(-1).to(w.dtype).contiguous()
        out[base + "weight_shape"] = torch.tensor([rows, cols], dtype=torch.int64)
    return out


def unpack_int4(packed: torch.Tensor, scale: torch.Tensor,
                group_size: int = INT4_GROUP_SIZE) -> torch.Tensor:
    """Inverse of :func:`pack_int4_routed_experts` for one weight (float32)."""
    words = packed.to(torch.int64) & 0xFFFFFFFF
    rows, n = words.shape
    q = torch.empty(rows, n * 8, dtype=torch.int64)
    for i in range(8):
        q[:, i::8] = (words >> (4 * i)) & 0xF
    q = (q - 8).float().view(rows, -1, group_size)
    return (q * scale.float().unsqueeze(-1)).view(rows, -1)


def write_tiny_kimi_k25(
    path: str | Path,
    spec: TinyKimiSpec | None = None,
    *,
    with_mtp: bool = False,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    int4_experts: bool = False,
) -> dict[str, tuple[int, ...]]:
    """Write a tiny ``KimiK25ForConditionalGeneration`` checkpoint.

    Returns ``{tensor name: shape}`` of everything written, so tests can check
    that a loader consumed all of it. ``with_mtp`` adds a DeepSeek-style MTP
    layer at index ``num_hidden_layers`` (the third-party K2.5 MTP layout) and
    sets ``num_nextn_predict_layers: 1``. ``int4_experts`` stores every routed
    expert (target and MTP layers) as compressed-tensors INT4 and writes Kimi's
    ``quantization_config`` (:data:`KIMI_INT4_QUANTIZATION_CONFIG`).
    """
    from transformers import Kimi_K25Config

    spec = spec or TinyKimiSpec()
    if with_mtp:
        spec = dataclasses.replace(spec, num_nextn_predict_layers=1)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    text = spec.text_config_dict()
    cfg = Kimi_K25Config(
        text_config=dict(text),
        vision_config=spec.vision_config_dict(),
        projection_hidden_size=spec.vision_hidden_size,
        image_token_id=spec.num_ranks + 21,  # <|media_pad|> slot in the special block
        video_token_id=spec.vocab_size,
        vision_start_token_id=spec.num_ranks + 18,
        vision_end_token_id=spec.num_ranks + 20,
        tie_word_embeddings=False,
    ).to_dict()
    cfg["architectures"] = ["KimiK25ForConditionalGeneration"]
    cfg["bos_token_id"] = spec.bos_token_id
    cfg["eos_token_id"] = spec.eos_token_id
    cfg["pad_token_id"] = spec.pad_token_id
    cfg["media_placeholder_token_id"] = cfg["image_token_id"]
    cfg["torch_dtype"] = "bfloat16"
    # keep the text model_type the real checkpoint ships (transformers maps it)
    cfg["text_config"]["model_type"] = "kimi_k2"
    cfg["text_config"]["architectures"] = text["architectures"]
    if int4_experts:  # as in the real checkpoint: top level, routed experts only
        cfg["quantization_config"] = copy.deepcopy(KIMI_INT4_QUANTIZATION_CONFIG)
    _dump_config(path, cfg)

    def tensors():
        yield from text_tensors(spec, prefix="language_model.", with_mtp=with_mtp)
        yield from vision_tensors(spec)

    return _write_safetensors(path, tensors(), seed, dtype, int4_experts=int4_experts)


def write_tiny_deepseek_v3(
    path: str | Path,
    spec: TinyKimiSpec | None = None,
    *,
    with_mtp: bool = False,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
) -> dict[str, tuple[int, ...]]:
    """Write the text-only form (``DeepseekV3ForCausalLM``, ``model_type:
    deepseek_v3``) of the same tiny Kimi language model."""
    from transformers import DeepseekV3Config

    spec = spec or TinyKimiSpec()
    if with_mtp:
        spec = dataclasses.replace(spec, num_nextn_predict_layers=1)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    text = spec.text_config_dict()
    text["model_type"] = "deepseek_v3"
    cfg = DeepseekV3Config(**{k: v for k, v in text.items() if k != "model_type"}).to_dict()
    for key in ("architectures", "scoring_func", "topk_method", "seq_aux", "aux_loss_alpha",
                "ep_size", "moe_layer_freq", "torch_dtype"):
        cfg[key] = text[key]
    _dump_config(path, cfg)
    return _write_safetensors(path, text_tensors(spec, with_mtp=with_mtp), seed, dtype)


@dataclasses.dataclass(frozen=True)
class TinyEagle3Spec:
    """A tiny EAGLE-3 draft head for a :class:`TinyKimiSpec` target.

    ``style="llama"`` mirrors lightseekorg/kimi-k2.5-eagle3 (one Llama-style
    layer, ``LlamaForCausalLMEagle3``); ``style="mla"`` mirrors
    lightseekorg/kimi-k2.5-eagle3-mla (one DeepSeek MLA layer,
    ``Eagle3DeepseekV2ForCausalLM``).
    """

    style: str = "llama"
    draft_vocab_size: int | None = None  # None = full target vocab
    num_aux_hidden_states: int = 3
    aux_layer_ids: tuple[int, ...] | None = None
    intermediate_size: int = 96
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    max_position_embeddings: int | None = None  # None = the target's
    with_d2t: bool = True
    share_embedding: bool = False  # no embed_tokens in the head (uses target's)
    # MLA heads only. ``deepseek_v3`` reproduces a known trap: vLLM rewrites
    # that model_type into a non-existent ``Eagle3DeepSeekMTPModel``.
    mla_model_type: str = "deepseek_v2"


def write_tiny_eagle3(
    path: str | Path,
    target: TinyKimiSpec | None = None,
    spec: TinyEagle3Spec | None = None,
    *,
    seed: int = 1,
    dtype: torch.dtype = torch.bfloat16,
) -> dict[str, tuple[int, ...]]:
    """Write a tiny EAGLE-3 head (HF layout as SpecForge/speculators export it).

    Tensors: ``fc`` (aux-hidden fusion, ``num_aux × hidden → hidden``),
    ``midlayer.*`` (one decoder layer whose attention input is
    ``[embeds ‖ hidden]``), ``norm``, ``lm_head`` (``draft_vocab × hidden``),
    ``embed_tokens`` unless shared, and ``d2t``/``t2d`` vocab maps when the
    draft vocabulary is reduced (``d2t[i] = target_id − i``, as vLLM reads it).
    """
    target = target or TinyKimiSpec()
    spec = spec or TinyEagle3Spec()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    h = target.hidden_size
    vocab = target.vocab_size
    dvocab = spec.draft_vocab_size or vocab
    max_pos = spec.max_position_embeddings or target.max_position_embeddings
    aux_ids = list(spec.aux_layer_ids) if spec.aux_layer_ids is not None else None

    cfg: dict = {
        "hidden_size": h,
        "vocab_size": vocab,
        "draft_vocab_size": dvocab,
        "num_hidden_layers": 1,
        "intermediate_size": spec.intermediate_size,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": max_pos,
        "bos_token_id": target.bos_token_id,
        "eos_token_id": target.eos_token_id,
        "pad_token_id": target.pad_token_id,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {"use_aux_hidden_state": True, "use_input_layernorm_in_first_layer": True},
        "num_aux_hidden_states": spec.num_aux_hidden_states,
        "target_hidden_size": h,
    }
    if aux_ids is not None:
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = aux_ids
    rope = target.text_config_dict()["rope_scaling"]
    rope = dict(rope, factor=max_pos / target.rope_original_max_position)

    def layer_tensors():
        if spec.style == "llama":
            nh, nkv = spec.num_attention_heads, spec.num_key_value_heads
            hd = h // nh
            pre = "midlayer"
            yield f"{pre}.input_layernorm.weight", (h,)
            yield f"{pre}.hidden_norm.weight", (h,)
            yield f"{pre}.post_attention_layernorm.weight", (h,)
            yield f"{pre}.self_attn.q_proj.weight", (nh * hd, 2 * h)
            yield f"{pre}.self_attn.k_proj.weight", (nkv * hd, 2 * h)
            yield f"{pre}.self_attn.v_proj.weight", (nkv * hd, 2 * h)
            yield f"{pre}.self_attn.o_proj.weight", (h, nh * hd)
            yield from _mlp(f"{pre}.mlp", h, spec.intermediate_size)
        elif spec.style == "mla":
            pre = "midlayer"
            yield f"{pre}.input_layernorm.weight", (h,)
            yield f"{pre}.hidden_norm.weight", (h,)
            yield f"{pre}.post_attention_layernorm.weight", (h,)
            s2 = dataclasses.replace(target, hidden_size=2 * h)
            for name, shape in _mla_tensors(s2, f"{pre}.self_attn"):
                if name.endswith("o_proj.weight"):
                    shape = (h, shape[1])
                yield name, shape
            yield from _mlp(f"{pre}.mlp", h, spec.intermediate_size)
        else:
            raise ValueError(f"unknown EAGLE-3 style {spec.style!r} (expected 'llama' or 'mla')")

    if spec.style == "llama":
        cfg.update(
            architectures=["LlamaForCausalLMEagle3"],
            model_type="llama",
            num_attention_heads=spec.num_attention_heads,
            num_key_value_heads=spec.num_key_value_heads,
            head_dim=h // spec.num_attention_heads,
            rope_theta=50000.0,
            rope_scaling=rope,
        )
    else:
        tc = target.text_config_dict()
        cfg.update(
            architectures=["Eagle3DeepseekV2ForCausalLM"],
            model_type=spec.mla_model_type,
            num_attention_heads=target.num_attention_heads,
            num_key_value_heads=target.num_attention_heads,
            **{k: tc[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                  "qk_rope_head_dim", "v_head_dim", "rope_theta")},
            rope_scaling=rope,
            first_k_dense_replace=1,
        )
    _dump_config(path, cfg)

    def tensors():
        yield "fc.weight", (h, spec.num_aux_hidden_states * h)
        yield from layer_tensors()
        yield "norm.weight", (h,)
        yield "lm_head.weight", (dvocab, h)
        if not spec.share_embedding:
            yield "embed_tokens.weight", (vocab, h)

    shapes = _write_safetensors(path, tensors(), seed, dtype)
    if dvocab != vocab and spec.with_d2t:
        from safetensors.torch import load_file, save_file

        gen = torch.Generator().manual_seed(seed + 17)
        kept = torch.sort(torch.randperm(vocab, generator=gen)[:dvocab]).values
        d2t = kept - torch.arange(dvocab)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[kept] = True
        all_t = load_file(str(path / "model.safetensors"))
        all_t["d2t"] = d2t.to(torch.int64)
        all_t["t2d"] = t2d
        save_file(all_t, str(path / "model.safetensors"), metadata={"format": "pt"})
        shapes["d2t"] = (dvocab,)
        shapes["t2d"] = (vocab,)
    return shapes
