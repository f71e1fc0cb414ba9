"""The draft doctor's individual checks (run by :mod:`vllm_kimi_ext.drafts.doctor.diagnosis`).

Every function here takes configs already validated by
:func:`vllm_kimi_ext.drafts.doctor.config_fields.validated_config` (each value it reads has
the documented type, or is absent) and returns findings made with
:func:`~vllm_kimi_ext.drafts.doctor.codes.finding`. Standard library only.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any

from vllm_kimi_ext.checkpoints.safetensors_headers import TensorIndex
from vllm_kimi_ext.findings import Finding

from .codes import finding

# RoPE types whose max_position_embeddings only sizes the cos/sin cache; vLLM
# raises such a draft's limit to the target's instead of capping the context
# (mirrors vllm.config.speculative._CACHE_ONLY_ROPE_TYPES).
CACHE_ONLY_ROPE_TYPES = frozenset({"default", "linear", "llama3", "ntk", "proportional"})
# model_types that vLLM's hf_config_override rewrites into DeepSeek MTP drafts.
_DEEPSEEK_MTP_REWRITTEN = ("deepseek_v3", "deepseek_v32", "glm_moe_dsa")
#: The architectures vLLM 0.34.0's model registry implements with an EAGLE-3 head
#: (``llama_eagle3``, ``qwen3_eagle3``, ``deepseek_eagle3``): the eagle3-deepseek-not-mtp
#: patch keeps exactly these out of the DeepSeek MTP rewrite, whatever other names look like.
EAGLE3_HEAD_ARCHITECTURES = frozenset({
    "Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3", "Eagle3MiniMaxM2ForCausalLM",
    "Eagle3Qwen2_5vlForCausalLM", "Eagle3Qwen3vlForCausalLM", "Eagle3Qwen3ForCausalLM",
    "Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM",
})
_MTP_LAYER_PARTS = ("enorm.weight", "hnorm.weight", "eh_proj.weight",
                    "shared_head.norm.weight", "shared_head.head.weight",
                    "input_layernorm.weight", "post_attention_layernorm.weight",
                    "self_attn.kv_a_proj_with_mqa.weight", "self_attn.o_proj.weight",
                    "mlp.gate.weight")
_INTEGER_DTYPES = ("I64", "I32", "I16", "I8", "U8")


# --------------------------------------------------------------------------- #
# Config helpers                                                               #
# --------------------------------------------------------------------------- #


def text_config(cfg: dict) -> dict:
    """The language-model part of a (possibly multimodal) HF config."""
    tc = cfg.get("text_config")
    return tc if isinstance(tc, dict) else cfg


def text_field(cfg: dict, name: str) -> Any:
    """``name`` from the text config, else from the top level."""
    value = text_config(cfg).get(name)
    return value if value is not None else cfg.get(name)


def architectures(cfg: dict) -> list[str]:
    return list(cfg.get("architectures") or [])


def _arch(cfg: dict) -> str:
    archs = architectures(cfg)
    return archs[0] if archs else ""


def _is_eagle3_arch(arch: str) -> bool:
    return arch in EAGLE3_HEAD_ARCHITECTURES


def infer_method(draft_cfg: dict, draft_name: str = "") -> str | None:
    """The speculative method vLLM would detect for this draft (best effort).
    ``draft_name``: the draft directory's name (not its whole path)."""
    from .draft_kinds import is_draft_architecture

    joined = " ".join(architectures(draft_cfg)).lower()
    name = draft_name.lower()
    if "dflash" in joined or "dflash" in name or "dflash_config" in draft_cfg:
        return "dflash"
    if "eagle3" in joined or "eagle3" in name:
        return "eagle3"
    if "eagle" in joined:
        return "eagle"
    n_mtp = text_field(draft_cfg, "num_nextn_predict_layers")
    if n_mtp and not any(is_draft_architecture(a) for a in architectures(draft_cfg)):
        return "mtp"
    return None


def _rope(cfg: dict) -> dict:
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    return rope if isinstance(rope, dict) else {}


def _theta(cfg: dict) -> Any:
    theta = cfg.get("rope_theta")
    return theta if theta is not None else _rope(cfg).get("rope_theta")


def rope_type(cfg: dict) -> str:
    rope = _rope(cfg)
    return str(rope.get("rope_type") or rope.get("type") or "default")


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value if v is not None]
    return [int(value)]


def effective_aux_layer_ids(draft_cfg: dict) -> tuple[list[int] | None, str]:
    """Aux layer ids as vLLM 0.34.0 reads them
    (``eagle3_utils.get_eagle3_aux_layers_from_config``) and where from."""
    ids = draft_cfg.get("eagle_aux_hidden_state_layer_ids")
    if ids:
        return list(ids), "eagle_aux_hidden_state_layer_ids"
    dflash = draft_cfg.get("dflash_config")
    if isinstance(dflash, dict) and dflash.get("target_layer_ids"):
        return [i + 1 for i in dflash["target_layer_ids"]], "dflash_config.target_layer_ids (+1)"
    if draft_cfg.get("target_layer_ids"):
        return [i + 1 for i in draft_cfg["target_layer_ids"]], "target_layer_ids (+1)"
    for key in ("dflash_config", "eagle_config"):
        sub = draft_cfg.get(key)
        if isinstance(sub, dict) and sub.get("layer_ids"):
            return list(sub["layer_ids"]), f"{key}.layer_ids"
    return None, "defaults"


def default_aux_layer_ids(num_target_layers: int) -> list[int]:
    """DeepSeek-V2/V3 (and Kimi-K2.5) default EAGLE-3 taps: (2, L//2, L-3)."""
    return [2, num_target_layers // 2, num_target_layers - 3]


# --------------------------------------------------------------------------- #
# Architecture, context, hidden states                                         #
# --------------------------------------------------------------------------- #


def check_mtp_rewrite(draft_cfg: dict, vllm_keeps_heads: bool | None) -> list[Finding]:
    """DeepSeek-type EAGLE-3 heads and vLLM's MTP rewrite."""
    arch, model_type = _arch(draft_cfg), draft_cfg.get("model_type")
    if model_type not in _DEEPSEEK_MTP_REWRITTEN:
        return []
    if _is_eagle3_arch(arch):  # only such heads can be kept, and only by a fixed vLLM
        if vllm_keeps_heads is None:
            from vllm_kimi_ext.compat import vllm_keeps_eagle3_deepseek_heads

            vllm_keeps_heads = vllm_keeps_eagle3_deepseek_heads()
        if vllm_keeps_heads:
            return []
    fix = ("set model_type 'deepseek_v2' in the draft's config.json, or use a vLLM "
           "carrying the EAGLE-3 rewrite fix" if _is_eagle3_arch(arch) else
           "name an EAGLE-3 architecture such as 'Eagle3DeepseekV2ForCausalLM' and "
           "set model_type 'deepseek_v2' in the draft's config.json")
    return [finding("E-ARCH-MTP-REWRITE", (
        f"draft model_type {model_type!r} with architecture {arch!r}: vLLM rewrites "
        "it into an MTP draft (DeepSeekMTPModel), which EAGLE-3 turns into the "
        f"non-existent 'Eagle3DeepSeekMTPModel'. To fix: {fix}."), field="model_type")]


def check_context_cap(tgt: dict, draft_cfg: dict,
                      served_max_model_len: int | None) -> list[Finding]:
    """A draft with a shorter (non cache-only) RoPE context caps the served one."""
    served = served_max_model_len or int(tgt.get("max_position_embeddings") or 0)
    d_mpe = draft_cfg.get("max_position_embeddings")
    if d_mpe is None or not served or int(d_mpe) >= served:
        return []
    rtype = rope_type(draft_cfg)
    if rtype in CACHE_ONLY_ROPE_TYPES:
        return []
    return [finding("W-CONTEXT-CAP", (
        f"draft max_position_embeddings={d_mpe} with {rtype} RoPE is below the "
        f"served context {served}: vLLM lowers max_model_len from {served} to "
        f"{d_mpe} for every request. Pass --max-model-len {d_mpe} knowingly, or "
        "use a draft exported for the target's full context."),
        field="max_position_embeddings")]


def uses_aux(draft_cfg: dict) -> bool:
    """False when the draft's eagle/dflash config turns aux hidden states off."""
    for key in ("eagle_config", "dflash_config"):
        sub = draft_cfg.get(key)
        if isinstance(sub, dict) and sub.get("use_aux_hidden_state") is False:
            return False
    return True


def check_hidden(draft_cfg: dict, t_hidden: int) -> list[Finding]:
    """The hidden size the draft expects from the target."""
    declared = draft_cfg.get("target_hidden_size")
    d_hidden = draft_cfg.get("hidden_size")
    if t_hidden and declared is not None and int(declared) != t_hidden:
        return [finding("E-HIDDEN-MISMATCH", (
            f"draft target_hidden_size={declared} but the target's hidden_size is "
            f"{t_hidden}."), field="target_hidden_size")]
    if t_hidden and declared is None and d_hidden is not None and int(d_hidden) != t_hidden:
        return [finding("E-HIDDEN-MISMATCH", (
            f"draft hidden_size={d_hidden} differs from the target's hidden_size "
            f"{t_hidden} and the draft declares no target_hidden_size."), field="hidden_size")]
    return []


def check_rope(tgt: dict, draft_cfg: dict) -> list[Finding]:
    out: list[Finding] = []
    t_theta, d_theta = _theta(tgt), _theta(draft_cfg)
    if t_theta is not None and d_theta is not None and float(t_theta) != float(d_theta):
        out.append(finding("W-ROPE-THETA", (
            f"draft rope_theta={d_theta} differs from the target's {t_theta}; drafts "
            "trained on the target's positions use its theta."), field="rope_theta"))
    tr, dr = _rope(tgt), _rope(draft_cfg)
    if tr and dr:
        diffs = []
        if rope_type(tgt) != rope_type(draft_cfg):
            diffs.append(f"type {rope_type(draft_cfg)} vs {rope_type(tgt)}")
        for key in ("factor", "original_max_position_embeddings"):
            if key in tr and key in dr and float(tr[key]) != float(dr[key]):
                diffs.append(f"{key} {dr[key]} vs {tr[key]}")
        if diffs:
            out.append(finding("W-ROPE-SCALING", (
                "draft RoPE scaling differs from the target's (draft vs target): "
                + "; ".join(diffs) + "."), field="rope_scaling"))
    return out


def check_yarn_factor(draft_cfg: dict, method: str | None) -> list[Finding]:
    """The attention factor vLLM 0.34.0 derives for a YaRN DFlash draft, when it is not the
    plain-YaRN value other stacks use (:mod:`vllm_kimi_ext.drafts.rope_config`): which of
    the two the draft was trained with is unknown, so both are named."""
    from vllm_kimi_ext.drafts.rope_config import (
        effective_attention_factor,
        is_yarn,
        mla_reason,
        plain_yarn_factor,
        rope_parameters,
    )

    if method != "dflash" or mla_reason(draft_cfg):
        # DFlash drafts run on vLLM's plain-YaRN path; MLA heads take vLLM's DeepSeek YaRN,
        # which never reads attention_factor (rope-config refuses them), and for
        # Llama-style EAGLE-3 heads no other stack's value is in question here.
        return []
    rope = rope_parameters(draft_cfg)
    try:
        if not is_yarn(rope) or float(rope.get("factor") or 0) <= 1:
            return []
        used, why = effective_attention_factor(rope)
        plain = plain_yarn_factor(rope)
    except (TypeError, ValueError):
        return []  # malformed values are the config-field checks' findings
    if rope.get("attention_factor") is not None or math.isclose(used, plain, rel_tol=1e-6):
        return []
    return [finding("W-ROPE-YARN-FACTOR", (
        f"vLLM 0.34.0 runs this draft's YaRN rotary embedding (factor {float(rope['factor']):g}) "
        f"at attention factor {used:.4f}, from {why}; plain YaRN (vLLM <= 0.29, SGLang) uses "
        f"{plain:.4f}. Which one the draft was trained with is not established (for "
        "z-lab/Kimi-K2.5-DFlash, Hugging Face transformers also gives 1.0 and vllm-ascend "
        "restores 1.4159): serve both and compare acceptance; vllm-kimi-ext draft "
        f"rope-config --draft DIR --out DIR-rope-{plain:.4f} --attention-factor {plain:.4f} "
        "writes the other arm (the acceptance difference is unmeasured on this box class)."),
        field="rope_scaling")]


def _aux_ids_with_defaults(draft_cfg: dict, method: str, t_layers: int,
                           out: list[Finding]) -> tuple[list[int] | None, str]:
    """The aux ids vLLM taps; ids only under ``eagle_config`` are reported (ignored)."""
    ids, source = effective_aux_layer_ids(draft_cfg)
    if ids is not None or method != "eagle3":
        return ids, source
    eagle = draft_cfg.get("eagle_config") or {}
    hidden_ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    defaults = default_aux_layer_ids(t_layers) if t_layers else None
    if not hidden_ids or defaults is None:
        return defaults, "vLLM defaults (2, L//2, L-3)"
    if list(hidden_ids) == defaults:
        out.append(finding("W-AUX-IDS-IGNORED", (
            f"aux layer ids {list(hidden_ids)} are only given as eagle_config."
            "eagle_aux_hidden_state_layer_ids, which vLLM 0.34.0 does not read; "
            f"its defaults {defaults} agree."),
            field="eagle_config.eagle_aux_hidden_state_layer_ids"))
    else:
        out.append(finding("E-AUX-IDS-IGNORED", (
            f"aux layer ids {list(hidden_ids)} are only given as eagle_config."
            "eagle_aux_hidden_state_layer_ids, which vLLM 0.34.0 does not read: it "
            f"taps its defaults {defaults} instead. Move them to the top-level "
            "'eagle_aux_hidden_state_layer_ids'."),
            field="eagle_config.eagle_aux_hidden_state_layer_ids"))
    return list(hidden_ids), "eagle_config.eagle_aux_hidden_state_layer_ids"


def check_aux(draft_cfg: dict, tensors: TensorIndex, method: str, t_hidden: int,
              t_layers: int) -> list[Finding]:
    """Aux layer ids (range, count) and the ``fc`` width they imply."""
    out: list[Finding] = []
    ids, source = _aux_ids_with_defaults(draft_cfg, method, t_layers, out)
    if ids and t_layers:
        bad = [i for i in ids if not 0 <= int(i) <= t_layers]
        if bad:
            out.append(finding("E-AUX-RANGE", (
                f"aux layer ids {list(ids)} (from {source}) include {bad}, outside the "
                f"target's 0..{t_layers} ({t_layers} layers)."), field=source.split(" ")[0]))
    declared_hidden = int(draft_cfg.get("target_hidden_size") or draft_cfg.get("hidden_size")
                          or t_hidden or 0)
    if method == "eagle3":
        n_aux = draft_cfg.get("num_aux_hidden_states")
        n_aux_eff = int(n_aux) if n_aux is not None else (len(ids) if ids else 3)
        if ids and n_aux is not None and int(n_aux) != len(ids):
            out.append(finding("E-AUX-COUNT", (
                f"num_aux_hidden_states={n_aux} but {len(ids)} aux layer ids {list(ids)} "
                f"(from {source}): the target would feed {len(ids)}x{t_hidden} features to "
                f"an fc built for {n_aux}."), field="num_aux_hidden_states"))
        expected = declared_hidden * n_aux_eff
    else:  # dflash: one feature per tap, or per draft layer without taps
        n = len(ids) if ids else int(draft_cfg.get("num_hidden_layers") or 0)
        expected = declared_hidden * n
    fc = tensors.find("fc.weight")
    shape = tensors.shape(fc) if fc is not None else None
    if shape is not None and expected and (len(shape) != 2 or shape[-1] != expected):
        width = shape[-1] if shape else None
        per = f"{width / declared_hidden:g}" if declared_hidden and width else "?"
        out.append(finding("E-FC-WIDTH", (
            f"{fc} has shape {list(shape)}: input width {width} (= {per} x hidden "
            f"{declared_hidden}) but vLLM builds it for {expected} (aux ids "
            f"{list(ids) if ids else None} from {source})."), field=fc))
    return out


# --------------------------------------------------------------------------- #
# Vocabulary                                                                   #
# --------------------------------------------------------------------------- #


def check_vocab_size(draft_cfg: dict, t_vocab: int) -> list[Finding]:
    d_vocab = draft_cfg.get("vocab_size")
    if d_vocab is not None and t_vocab and int(d_vocab) != t_vocab:
        return [finding("E-VOCAB-MISMATCH", (
            f"draft vocab_size={d_vocab} differs from the target's {t_vocab}; drafts must "
            "use the target's tokenizer ids (a reduced head declares draft_vocab_size "
            "and ships d2t instead)."), field="vocab_size")]
    return []


def check_vocab(draft_cfg: dict, tensors: TensorIndex, t_vocab: int, *,
                tensors_complete: bool = True) -> list[Finding]:
    """Vocabulary size, the reduced-vocabulary ``d2t`` / ``t2d`` maps and ``lm_head`` rows."""
    out = check_vocab_size(draft_cfg, t_vocab)
    d_vocab = draft_cfg.get("vocab_size")
    dv = int(draft_cfg.get("draft_vocab_size") or d_vocab or t_vocab or 0)
    d2t_name = tensors.find("d2t")
    if t_vocab and dv and dv < t_vocab and d2t_name is None and tensors_complete:
        out.append(finding("E-D2T-MISSING", (
            f"draft_vocab_size={dv} < target vocab_size={t_vocab} but the checkpoint has "
            "no 'd2t' tensor: stock vLLM keeps an all-zero map, reads every draft id i as "
            "target id i and acceptance collapses silently."), field="draft_vocab_size"))
    if d2t_name is not None and t_vocab:
        out += check_d2t(tensors, d2t_name, dv, t_vocab)
    lm = tensors.find("lm_head.weight")
    shape = tensors.shape(lm) if lm is not None else None
    if shape is not None and dv and (len(shape) != 2 or shape[0] != dv):
        odd = f" (shape {list(shape)}, expected 2-D)" if len(shape) != 2 else ""
        out.append(finding("E-LM-HEAD-ROWS", (
            f"{lm} has {shape[0] if shape else 0} rows{odd} but draft_vocab_size is {dv}."),
            field=lm))
    return out


def _read_values(tensors: TensorIndex, name: str) -> list[int] | None:
    """The tensor's values, or None when its file cannot give them (already reported
    as E-WEIGHTS-SIZE)."""
    try:
        return tensors.read_ints(name)
    except (ValueError, OSError):
        return None


def check_d2t(tensors: TensorIndex, name: str, dv: int, t_vocab: int) -> list[Finding]:
    """``d2t``: integer, ``[draft_vocab_size]``, in range and injective; ``t2d`` agrees."""
    dtype, shape = tensors.dtype(name), tensors.shape(name)
    if dtype not in _INTEGER_DTYPES:
        return [finding("E-D2T-DTYPE", (
            f"{name} has dtype {dtype}; vLLM reads it as integer offsets "
            "(target id = i + d2t[i]), expected int64."), field=name)]
    if shape != (dv,):
        return [finding("E-D2T-SHAPE", (
            f"{name} has shape {shape}, expected ({dv},) (draft_vocab_size)."), field=name)]
    values = _read_values(tensors, name)
    if values is None:
        return []
    targets = [i + d for i, d in enumerate(values)]
    bad = [(i, t) for i, t in enumerate(targets) if not 0 <= t < t_vocab]
    if bad:
        i, t = bad[0]
        return [finding("E-D2T-RANGE", (
            f"{name} maps {len(bad)} draft id(s) outside the target vocabulary "
            f"[0, {t_vocab}) (target id = i + d2t[i]; first: draft id {i} -> {t})."),
            field=name)]
    by_target: dict[int, list[int]] = defaultdict(list)
    for i, t in enumerate(targets):
        by_target[t].append(i)
    shared = {t: ids for t, ids in by_target.items() if len(ids) > 1}
    if shared:
        t, ids = min(shared.items(), key=lambda kv: kv[1][0])
        return [finding("E-D2T-DUPLICATE", (
            f"{name} maps {dv} draft ids onto only {len(by_target)} distinct target ids "
            f"({sum(len(v) - 1 for v in shared.values())} collisions; first: draft ids "
            f"{ids[:3]} -> target id {t}): the head proposes fewer tokens than it has rows "
            "and their probabilities are merged."), field=name)]
    t2d = tensors.find("t2d")
    return check_t2d(tensors, t2d, set(targets), t_vocab) if t2d is not None else []


def check_t2d(tensors: TensorIndex, name: str, d2t_targets: set[int],
              t_vocab: int) -> list[Finding]:
    """``t2d`` (bool ``[vocab]``) must mark exactly the target ids ``d2t`` maps to."""
    dtype, shape = tensors.dtype(name), tensors.shape(name)
    if dtype not in ("BOOL", "U8") or shape != (t_vocab,):
        return [finding("E-T2D-MISMATCH", (
            f"{name} has dtype {dtype} and shape {shape}, expected BOOL ({t_vocab},) "
            "(one flag per target id)."), field=name)]
    values = _read_values(tensors, name)
    if values is None:
        return []
    marked = {i for i, v in enumerate(values) if v}
    if marked != d2t_targets:
        only_t2d = sorted(marked - d2t_targets)[:3]
        only_d2t = sorted(d2t_targets - marked)[:3]
        return [finding("E-T2D-MISMATCH", (
            f"{name} marks {len(marked)} target ids but d2t maps to {len(d2t_targets)}; "
            f"marked but not mapped: {only_t2d}, mapped but not marked: {only_d2t}. The "
            "two maps of the head disagree (re-export it)."), field=name)]
    return []


def check_special_ids(draft_cfg: dict, t_vocab: int) -> list[Finding]:
    """The draft's bos / eos / pad ids must exist in the target vocabulary."""
    if not t_vocab:
        return []
    out: list[Finding] = []
    for key, code in (("bos_token_id", "E-SPECIAL-ID"), ("eos_token_id", "E-SPECIAL-ID"),
                      ("pad_token_id", "W-PAD-ID")):
        bad = [i for i in _ids(draft_cfg.get(key)) if not 0 <= i < t_vocab]
        if bad:
            out.append(finding(code, (
                f"draft {key}={draft_cfg.get(key)} is outside the target vocabulary "
                f"[0, {t_vocab})."), field=key))
    return out


# --------------------------------------------------------------------------- #
# DFlash                                                                       #
# --------------------------------------------------------------------------- #


def check_dflash_mask(draft_cfg: dict, t_vocab: int) -> list[Finding]:
    """A DFlash draft embeds its masked block slots with ``mask_token_id``."""
    d_vocab = draft_cfg.get("vocab_size")
    dfc = draft_cfg.get("dflash_config") or {}
    mask = dfc.get("mask_token_id", draft_cfg.get("mask_token_id"))
    if mask is None or not 0 <= int(mask) < int(d_vocab or t_vocab or 0):
        return [finding("E-DFLASH-MASK-ID", (
            f"DFlash mask_token_id={mask} is missing or outside the draft vocabulary "
            f"[0, {d_vocab or t_vocab}); masked block slots would embed garbage."),
            field="dflash_config.mask_token_id")]
    return []


def check_dflash_block(draft_cfg: dict) -> list[Finding]:
    """A DFlash draft is trained for one block size (tokens drafted per step + 1)."""
    dfc = draft_cfg.get("dflash_config") or {}
    if draft_cfg.get("block_size") is None and dfc.get("block_size") is None:
        return [finding("E-DFLASH-BLOCK", (
            "DFlash draft declares no block_size (top level or dflash_config.block_size): "
            "the block it was trained on, and so num_speculative_tokens (block_size - 1), "
            "is unknown. Add the training block_size to its config.json."),
            field="block_size")]
    return []


# --------------------------------------------------------------------------- #
# MTP                                                                          #
# --------------------------------------------------------------------------- #


def diagnose_mtp(target_cfg: dict, draft_cfg: dict, tensors: TensorIndex, *,
                 tensors_complete: bool = True) -> list[Finding]:
    """MTP layers: declared, present with the right shapes and quantization; the
    layer's hidden size and vocabulary are the target's."""
    cfg = text_config(draft_cfg)
    n = int(cfg.get("num_nextn_predict_layers") or 0)
    layers = int(cfg.get("num_hidden_layers") or 0)
    if n <= 0:
        return [finding("E-MTP-NO-LAYERS", (
            f"method 'mtp' needs MTP layers but the checkpoint declares "
            f"num_nextn_predict_layers={cfg.get('num_nextn_predict_layers')} "
            f"(model_type {draft_cfg.get('model_type')!r}); loading it would build a second "
            "full target model."), field="num_nextn_predict_layers")]
    tgt = text_config(target_cfg)
    out = check_vocab_size(cfg, int(tgt.get("vocab_size") or 0))
    out += check_hidden(cfg, int(tgt.get("hidden_size") or 0))
    # A separate MTP directory for a kimi_k25 target may carry the target's
    # kimi_k25 config or a DeepSeek-V3 text config (deepseek_v3 / kimi_k2): patches
    # the kimi-k25-mtp and kimi-mtp-deepseek-dir patches load both as KimiK25MTPModel.
    h = int(cfg.get("hidden_size") or 0)
    vocab = int(cfg.get("vocab_size") or 0)
    for k in range(layers, layers + n):
        prefix = _mtp_prefix(tensors, k)
        missing = [p for p in _MTP_LAYER_PARTS if f"{prefix}{p}" not in tensors]
        if missing and tensors_complete:
            out.append(finding("E-MTP-TENSORS-MISSING", (
                f"num_nextn_predict_layers={n} but MTP layer {k} lacks "
                f"{', '.join(prefix + p for p in missing)}"
                + (" (no tensor of the layer at all)" if len(missing) == len(_MTP_LAYER_PARTS)
                   else "") + ".")))
            continue
        want = {"eh_proj.weight": (h, 2 * h), "enorm.weight": (h,), "hnorm.weight": (h,),
                "shared_head.head.weight": (vocab, h)}
        for part, shape in want.items():
            got = tensors.shape(prefix + part)
            if h and vocab and got is not None and got != shape:
                out.append(finding("E-MTP-SHAPE", (
                    f"{prefix}{part} has shape {got}, expected {shape} "
                    f"(hidden_size {h}, vocab_size {vocab})."), field=prefix + part))
        out += _check_mtp_quant_format(draft_cfg, tensors, prefix, k)
    return out


def _ct_matches(name: str, pattern: str) -> bool:
    """compressed-tensors ``ignore`` / ``targets`` matching as vLLM does it: exact
    name, or ``re:`` + a regex matched at the start."""
    if pattern.startswith("re:"):
        try:
            return re.match(pattern[3:], name) is not None
        except re.error:
            return False
    return pattern == name


def mtp_experts_quantized(quant_config: dict | None, layer: int) -> bool | None:
    """Whether vLLM quantizes the routed experts of MTP layer ``layer`` under a
    compressed-tensors ``quantization_config`` (None: not compressed-tensors, not
    decided here).  vLLM 0.34.0 names the layer's experts
    ``model.layers.{layer}.mlp.experts`` (no ``language_model.``, no
    ``mtp_block``) and checks the unfused names ``<that>.0.{gate,up,down}_proj``
    against ``ignore``; a config group whose
    ``targets`` contain ``Linear`` (or match those names) quantizes them."""
    if not quant_config or quant_config.get("quant_method") != "compressed-tensors":
        return None
    base = f"model.layers.{layer}.mlp.experts.0."
    names = [base + p for p in ("gate_proj", "up_proj", "down_proj")]
    ignore = [p for p in quant_config.get("ignore") or [] if isinstance(p, str)]
    if all(any(_ct_matches(n, pat) for pat in ignore) for n in names):
        return False
    for group in (quant_config.get("config_groups") or {}).values():
        if not isinstance(group, dict) or not group.get("weights"):
            continue
        for target in group.get("targets") or []:
            if target == "Linear" or any(_ct_matches(n, target) for n in names):
                return True
    return False


def _check_mtp_quant_format(draft_cfg: dict, tensors: TensorIndex, prefix: str,
                            layer: int) -> list[Finding]:
    """The MTP layer's routed experts must be stored the way vLLM will build them
    from the (target's or MTP directory's) ``quantization_config``."""
    quantized = mtp_experts_quantized(draft_cfg.get("quantization_config")
                                      or text_config(draft_cfg).get("quantization_config"),
                                      layer)
    if quantized is None:
        return []
    expert = f"{prefix}mlp.experts.0.down_proj."
    packed = tensors.shape(expert + "weight_packed") is not None
    plain = tensors.shape(expert + "weight") is not None
    if quantized and plain and not packed:
        return [finding("E-MTP-QUANT-FORMAT", (
            f"the quantization_config (compressed-tensors) quantizes the routed experts of "
            f"MTP layer {layer}, so vLLM expects {expert}weight_packed / weight_scale / "
            f"weight_shape, but the checkpoint stores {expert}weight (unquantized): loading "
            "would fail on the first expert. Quantize the MTP experts like the target's, or "
            f"add 're:.*layers\\.{layer}\\..*' to the quantization_config's ignore list."))]
    if not quantized and packed and not plain:
        return [finding("E-MTP-QUANT-FORMAT", (
            f"the checkpoint stores the routed experts of MTP layer {layer} quantized "
            f"({expert}weight_packed) but the quantization_config's ignore list / targets "
            "leave them unquantized in vLLM: loading would fail. Remove the MTP layer from "
            "the ignore list."))]
    return []


def _mtp_prefix(tensors: TensorIndex, layer: int) -> str:
    for pre in ("language_model.model.layers.", "model.layers.", "language_model.layers."):
        if any(n.startswith(f"{pre}{layer}.") for n in tensors.names()):
            return f"{pre}{layer}."
    return f"model.layers.{layer}."
