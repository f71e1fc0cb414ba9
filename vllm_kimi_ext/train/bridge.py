"""speculators' EAGLE-3 model on one side, the flat EAGLE-3 directory vLLM loads on
the other.

* :func:`build_draft` makes a ``speculators`` ``Eagle3DraftModel`` for a target: a
  fresh Llama-style layer shaped from the target's config (speculators'
  ``create_transformer_layer_config``), or the layer of an existing head to
  fine-tune: a flat EAGLE-3 directory (``Eagle3LlamaForCausalLM`` /
  ``LlamaForCausalLMEagle3``, ``midlayer.*`` or ``layers.0.*`` names, as the public
  Kimi-K2.5 heads ship) or a speculators checkpoint (``speculators train`` output).
  Frozen parts (embedding, target ``lm_head`` and final norm) come from the target
  through speculators' ``load_verifier_weights``.
* :func:`export_flat` writes the flat form: ``config.json`` with
  ``architectures: ["Eagle3LlamaForCausalLM"]``, ``eagle_aux_hidden_state_layer_ids``
  at the top level (where vLLM 0.34.0 reads them), ``draft_vocab_size``, the target's
  bos/eos/pad ids and the layer's own RoPE and context; ``model.safetensors`` with ``fc``,
  ``layers.0.*``, ``norm``, ``lm_head``, ``embed_tokens`` and, for a reduced
  vocabulary, ``d2t``/``t2d``. ``vllm-kimi-ext doctor`` reads it as is.

The target directory needs a ``config.json`` and safetensors holding
``*embed_tokens.weight``, ``*lm_head.weight`` (or tied embeddings) and
``*model.norm.weight``; :func:`write_target_stub` writes such a directory from a
loaded transformers model (e.g. one read from a GGUF file).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from vllm_kimi_ext.outputs import save_safetensors

from .layout import DataError
from .settings import TrainConfig

#: Keys the speculators model holds but a served head does not need.
_NOT_EXPORTED = ("verifier_lm_head.", "verifier_norm.")
_FLAT_ARCHS = ("Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3")
#: The draft layer's fields written to a flat config (the rest are the target's or EAGLE-3's).
_LAYER_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps",
               "attention_bias", "attention_dropout", "mlp_bias", "initializer_range",
               "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings")


@dataclasses.dataclass(frozen=True)
class DraftOptions:
    """How the draft layer is built (the classic EAGLE-3 layout by default; every
    option is one vLLM 0.34.0's ``Eagle3LlamaForCausalLM`` reads from the config)."""

    num_layers: int = 1
    norm_before_residual: bool = True
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    attn_impl: str = "sdpa"  # speculators' flex attention needs a compiler on CPU
    #: fields set on the Llama layer config derived from the target, e.g. for Kimi-K2.5
    #: the public head's shape ``{"head_dim": 128, "num_key_value_heads": 8,
    #: "intermediate_size": 12288}`` (derived from an MLA target, head_dim would be the
    #: target's rope head dim, 64)
    layer_overrides: dict | None = None
    #: run the target's own code (``auto_map``) when reading its config; the CLI sets
    #: it from ``--trust-remote-code`` only
    trust_remote_code: bool = False


def require_speculators():
    try:
        import speculators  # noqa: F401
    except ImportError as exc:
        raise DataError(
            f"the training stack is not installed (no module {exc.name}): pip install "
            "'vllm-kimi-ext[train]' && pip install --no-deps speculators==0.9.0") from None


def read_json(path: Path, what: str) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{what} {path}: no such file") from None
    except ValueError as exc:
        raise DataError(f"{what} {path}: not valid JSON ({exc})") from None


def target_text_config(target_dir: str | Path) -> dict:
    """The target's (text) config as a dict."""
    cfg = read_json(Path(target_dir) / "config.json", "target config")
    return cfg.get("text_config") or cfg


def write_target_stub(model, out_dir: str | Path, dtype: str = "bfloat16") -> Path:
    """A directory speculators can use as the verifier: the model's (text) config and
    its embedding, ``lm_head`` and final norm weights."""
    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = (model.config.get_text_config() if hasattr(model.config, "get_text_config")
        else model.config)
    cfg.save_pretrained(out)
    saved = read_json(out / "config.json", "target config")
    saved.pop("quantization_config", None)  # e.g. GGUF: the stub holds plain tensors
    saved["dtype"] = dtype
    (out / "config.json").write_text(json.dumps(saved, indent=2) + "\n")
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    dt = getattr(torch, dtype)
    tensors = {
        "model.embed_tokens.weight": decoder.embed_tokens.weight,
        "lm_head.weight": model.get_output_embeddings().weight,
        "model.norm.weight": decoder.norm.weight,
    }
    save_safetensors({k: v.detach().to(dt).clone().contiguous() for k, v in tensors.items()},
                     out / "model.safetensors")
    return out


# --------------------------------------------------------------------------- #
# Building                                                                     #
# --------------------------------------------------------------------------- #


def _layer_config_from_target(target_dir: Path, opts: DraftOptions):
    from speculators.train.cli import create_transformer_layer_config

    cfg = create_transformer_layer_config(
        verifier_name_or_path=str(target_dir), num_layers=opts.num_layers, draft_arch="llama",
        hidden_act=None, sliding_window=0, full_attention_indices=list(range(opts.num_layers)),
        trust_remote_code=opts.trust_remote_code)
    cfg.use_sliding_window = False
    cfg.sliding_window = None
    for key, value in (opts.layer_overrides or {}).items():
        if key in ("hidden_size", "vocab_size"):
            raise DataError(f"--draft-layer: {key} is the target's and cannot be overridden")
        setattr(cfg, key, value)
    return cfg


#: ``--draft-layer`` keys that take a count >= 1 (the rest of the Llama layer's fields are
#: copied from the target or fixed by EAGLE-3).
_LAYER_COUNTS = ("intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "max_position_embeddings")


def check_layer_overrides(overrides: dict | None) -> None:
    """``--draft-layer``: known Llama layer fields only, counts >= 1, the key/value heads
    dividing the attention heads."""
    if not overrides:
        return
    allowed = {k for k in _LAYER_KEYS if k not in ("hidden_size", "num_hidden_layers")}
    for key, value in overrides.items():
        if key in ("hidden_size", "vocab_size", "num_hidden_layers"):
            raise DataError(f"--draft-layer: {key} is fixed (the target's, or one EAGLE-3 "
                            "layer) and cannot be overridden")
        if key not in allowed:
            raise DataError(f"--draft-layer: unknown field {key!r}; expected some of "
                            f"{', '.join(sorted(allowed))}")
        if key in _LAYER_COUNTS and (isinstance(value, bool) or not isinstance(value, int)
                                     or value < 1):
            raise DataError(f"--draft-layer: {key} is {value!r}, expected an integer >= 1")
    heads, kv = overrides.get("num_attention_heads"), overrides.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        raise DataError(f"--draft-layer: num_key_value_heads {kv} must divide "
                        f"num_attention_heads {heads}")


def _layer_config_from_flat(head_cfg: dict):
    from transformers import LlamaConfig

    keep = {k: v for k, v in head_cfg.items() if k not in (
        "architectures", "draft_vocab_size", "eagle_config", "eagle_aux_hidden_state_layer_ids",
        "num_aux_hidden_states", "target_hidden_size", "norm_before_residual", "norm_before_fc",
        "fc_norm", "norm_output", "model_type", "torch_dtype", "dtype")}
    keep["tie_word_embeddings"] = False
    return LlamaConfig(**keep)


def head_aux_layer_ids(head_cfg: dict) -> list[int] | None:
    ids = (head_cfg.get("eagle_aux_hidden_state_layer_ids") or
        (head_cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"))
    return list(ids) if ids else None


def read_vocab_maps(head_dir: str | Path):
    """``(t2d, d2t)`` stored in a head directory (shrink-vocab output or a reduced head),
    or ``(None, None)``."""
    from safetensors import safe_open

    found: dict[str, Any] = {}
    for f in sorted(Path(head_dir).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            for name in ("t2d", "d2t"):
                if name in fh.keys():
                    found[name] = fh.get_tensor(name)
    if ("t2d" in found) != ("d2t" in found):
        raise DataError(f"{head_dir}: holds only one of t2d / d2t")
    return found.get("t2d"), found.get("d2t")


def vocab_maps_from_ids(kept_ids, vocab_size: int):
    """``(t2d, d2t)`` for a sorted list of kept target ids (``d2t[i] = id_i - i``)."""
    import torch

    kept = torch.tensor(sorted(int(i) for i in kept_ids), dtype=torch.long)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[kept] = True
    return t2d, kept - torch.arange(len(kept))


def build_draft(target_dir: str | Path, aux_layer_ids: list[int], *,
                init: str | Path | None = None, t2d=None, d2t=None,
                options: DraftOptions | None = None,
                ttt_steps: int = TrainConfig.ttt_steps):
    """A speculators ``Eagle3DraftModel`` for ``target_dir`` (fresh, or ``init``'s weights)."""
    require_speculators()
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel

    options = options or DraftOptions()

    target_dir = Path(target_dir)
    tcfg = target_text_config(target_dir)
    vocab = int(tcfg["vocab_size"])
    head_cfg, head_state = None, None
    if init is not None:
        init = Path(init)
        head_cfg = read_json(init / "config.json", "draft config")
        if "speculators_model_type" in head_cfg:  # a speculators checkpoint
            return Eagle3DraftModel.from_pretrained(str(init))
        archs = head_cfg.get("architectures") or []
        if not any(a in _FLAT_ARCHS for a in archs):
            raise DataError(f"{init / 'config.json'}: architectures {archs}; expected a "
                            f"Llama-style EAGLE-3 head ({' / '.join(_FLAT_ARCHS)})")
        head_ids = head_aux_layer_ids(head_cfg)
        if head_ids is not None and head_ids != list(aux_layer_ids):
            raise DataError(f"{init}: trained on aux layers {head_ids}, the data holds "
                            f"{list(aux_layer_ids)} (capture with --layer-ids "
                            f"{' '.join(map(str, head_ids + [tcfg['num_hidden_layers']]))})")
        if t2d is None:
            t2d, d2t = read_vocab_maps(init)
        head_state = _read_flat_state(init)
    layer_cfg = (_layer_config_from_flat(head_cfg) if head_cfg is not None
                 else _layer_config_from_target(target_dir, options))
    if int(layer_cfg.hidden_size) != int(tcfg["hidden_size"]):
        raise DataError(f"draft hidden_size {layer_cfg.hidden_size} != target hidden_size "
                        f"{tcfg['hidden_size']}")
    draft_vocab = int(t2d.sum()) if t2d is not None else vocab
    opts = options if head_cfg is None else dataclasses.replace(
        options, **{k: bool(head_cfg.get(k, getattr(options, k))) for k in (
            "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")})
    model = Eagle3DraftModel.from_training_args(
        layer_cfg, t2d=t2d, d2t=d2t, target_layer_ids=list(aux_layer_ids),
        verifier_name_or_path=str(target_dir), trust_remote_code=opts.trust_remote_code,
        draft_attn_impl=opts.attn_impl, draft_vocab_size=draft_vocab,
        norm_before_residual=opts.norm_before_residual, norm_before_fc=opts.norm_before_fc,
        fc_norm=opts.fc_norm, norm_output=opts.norm_output, ttt_steps=ttt_steps)
    if head_state is not None:
        own = model.state_dict()
        missing = [k for k in own if not k.startswith(_NOT_EXPORTED) and k not in head_state
                   and k not in ("embed_tokens.weight", "t2d", "d2t")]
        if missing:
            raise DataError(f"{init}: tensor(s) {', '.join(missing[:4])} missing")
        bad = [k for k, v in head_state.items() if k in own and tuple(v.shape) !=
               tuple(own[k].shape)]
        if bad:
            raise DataError(f"{init}: tensor {bad[0]} has shape {tuple(head_state[bad[0]].shape)},"
                            f" the draft expects {tuple(own[bad[0]].shape)}")
        with torch.no_grad():
            model.load_state_dict({k: v for k, v in head_state.items()
                                   if k in own and k not in ("t2d", "d2t")}, strict=False)
    return model


def _read_flat_state(head_dir: Path) -> dict:
    from safetensors.torch import load_file

    state = {}
    for f in sorted(head_dir.glob("*.safetensors")):
        for k, v in load_file(str(f)).items():
            state[k.replace("midlayer.", "layers.0.").removeprefix("model.")] = v
    if not state:
        raise DataError(f"{head_dir}: no safetensors files")
    return state


# --------------------------------------------------------------------------- #
# Export                                                                       #
# --------------------------------------------------------------------------- #


def export_flat(model, target_dir: str | Path, out_dir: str | Path, *,
                dtype: str = "bfloat16", extra: dict | None = None) -> Path:
    """Write ``model`` as a flat EAGLE-3 directory vLLM 0.34.0 loads for ``target_dir``."""
    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tcfg = target_text_config(target_dir)
    spec_cfg = model.config
    layer = spec_cfg.transformer_layer_config.to_dict()
    cfg = {k: layer[k] for k in _LAYER_KEYS if layer.get(k) is not None}
    cfg.update(
        architectures=["Eagle3LlamaForCausalLM"], model_type="llama",
        vocab_size=int(tcfg["vocab_size"]), draft_vocab_size=int(spec_cfg.draft_vocab_size),
        eagle_aux_hidden_state_layer_ids=list(spec_cfg.eagle_aux_hidden_state_layer_ids),
        num_aux_hidden_states=len(spec_cfg.eagle_aux_hidden_state_layer_ids),
        target_hidden_size=int(tcfg["hidden_size"]),
        norm_before_residual=bool(spec_cfg.norm_before_residual),
        norm_before_fc=bool(spec_cfg.norm_before_fc), fc_norm=bool(spec_cfg.fc_norm),
        norm_output=bool(spec_cfg.norm_output), tie_word_embeddings=False,
        torch_dtype=dtype,
    )
    # RoPE and context stay the draft layer's own (a fresh layer copies the target's; a
    # fine-tuned head keeps what it was trained with: the doctor compares them)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        cfg[key] = tcfg.get(key)
    if extra:
        cfg.update(extra)
    dt = getattr(torch, dtype)
    tensors = {}
    for k, v in model.state_dict().items():
        if k.startswith(_NOT_EXPORTED) or v is None:
            continue
        if k in ("t2d", "d2t"):
            if int(spec_cfg.draft_vocab_size) == int(tcfg["vocab_size"]):
                continue
            tensors[k] = v.detach().to(torch.bool if k == "t2d" else torch.int64).clone()
            continue
        tensors[k] = v.detach().to(dt).clone().contiguous()
    (out / "config.json").write_text(json.dumps(cfg, indent=2, default=str) + "\n")
    save_safetensors(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out
