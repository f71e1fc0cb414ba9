"""Draft-checkpoint checks against a Kimi-K2.5 target, before anything is served.

``diagnose(target_dir, draft_dir)`` reads the two ``config.json`` files and the
draft's safetensors *headers* (names, dtypes, shapes; no tensor is loaded,
except the small ``d2t`` vocabulary map whose values are range-checked) and
reports every way the pair is known to go wrong in vLLM 0.34.0, each as a
:class:`Finding` with a stable code, a severity and a message that names the
values involved:

==========================  ========  ==============================================
code                        severity  what
==========================  ========  ==============================================
E-ARCH-MTP-REWRITE          error     DeepSeek-type EAGLE-3 head rewritten to an MTP
                                      class (``Eagle3DeepSeekMTPModel``) by vLLM
W-CONTEXT-CAP               warning   draft's shorter yarn context lowers the served
                                      ``max_model_len`` (``config/vllm.py``)
E-AUX-COUNT                 error     aux layer ids vs ``num_aux_hidden_states``
E-FC-WIDTH                  error     ``fc`` weight width vs aux count x hidden
E-AUX-RANGE                 error     an aux layer id outside the target's layers
W-AUX-IDS-IGNORED           warning   ids only under ``eagle_config`` (vLLM ignores
                                      them; its defaults are used and agree)
E-AUX-IDS-IGNORED           error     same, and vLLM's defaults differ from them
E-VOCAB-MISMATCH            error     draft ``vocab_size`` != target vocabulary
E-D2T-MISSING               error     ``draft_vocab_size`` < vocab without ``d2t``
E-D2T-SHAPE                 error     ``d2t`` length != ``draft_vocab_size``
E-D2T-RANGE                 error     ``d2t`` maps an id outside [0, vocab)
E-LM-HEAD-ROWS              error     ``lm_head`` rows != ``draft_vocab_size``
E-HIDDEN-MISMATCH           error     draft's target hidden size != target's
W-ROPE-THETA                warning   ``rope_theta`` differs from the target's
W-ROPE-SCALING              warning   RoPE scaling type / factor / original length
                                      differ from the target's
E-SPECIAL-ID                error     draft bos/eos id outside the target vocabulary
W-PAD-ID                    warning   draft pad id outside the target vocabulary
E-DFLASH-MASK-ID            error     DFlash ``mask_token_id`` missing / outside vocab
E-MTP-NO-LAYERS             error     ``method: mtp`` but no MTP layers declared
E-MTP-TENSORS-MISSING       error     MTP layer declared, tensors absent
E-MTP-SHAPE                 error     an MTP tensor has the wrong shape
E-MTP-QUANT-FORMAT          error     MTP experts stored unquantized where the
                                      compressed-tensors config quantizes them (or
                                      the reverse)
E-CONFIG                    error     a config or weight file cannot be read
==========================  ========  ==============================================

Nothing here imports vLLM or torch; :func:`check_speculative_config` (the
plugin's configuration-time hook) lives in :mod:`vllm_kimi_ext.drafts.hook`.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from vllm_kimi_ext.findings import Finding

__all__ = [
    "CACHE_ONLY_ROPE_TYPES",
    "DoctorReport",
    "TensorIndex",
    "diagnose",
    "diagnose_configs",
    "effective_aux_layer_ids",
]

ERROR = "error"
WARNING = "warning"

# RoPE types whose max_position_embeddings only sizes the cos/sin cache; vLLM
# raises such a draft's limit to the target's instead of capping the context
# (mirrors vllm.config.speculative._CACHE_ONLY_ROPE_TYPES).
CACHE_ONLY_ROPE_TYPES = frozenset({"default", "linear", "llama3", "ntk", "proportional"})
# model_types that vLLM's hf_config_override rewrites into DeepSeek MTP drafts.
_DEEPSEEK_MTP_REWRITTEN = ("deepseek_v3", "deepseek_v32", "glm_moe_dsa")
_MTP_LAYER_PARTS = ("enorm.weight", "hnorm.weight", "eh_proj.weight",
                    "shared_head.norm.weight", "shared_head.head.weight",
                    "input_layernorm.weight", "post_attention_layernorm.weight",
                    "self_attn.kv_a_proj_with_mqa.weight", "self_attn.o_proj.weight",
                    "mlp.gate.weight")


@dataclasses.dataclass
class DoctorReport:
    target: str
    draft: str
    method: str | None
    findings: list[Finding]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "draft": self.draft, "method": self.method,
                "ok": self.ok, "findings": [f.to_dict() for f in self.findings]}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def format_text(self) -> str:
        head = (f"draft {self.draft} for target {self.target} "
                f"(method {self.method or 'auto'}): ")
        if not self.findings:
            return head + "no findings"
        head += f"{len(self.errors)} error(s), {len(self.warnings)} warning(s)"
        return "\n".join([head, *(f"  {f}" for f in self.findings)])


# --------------------------------------------------------------------------- #
# Safetensors headers                                                          #
# --------------------------------------------------------------------------- #


class TensorIndex:
    """Tensor names, dtypes and shapes of a directory's ``*.safetensors`` files,
    read from their headers only (8-byte length + JSON)."""

    def __init__(self, entries: dict[str, tuple[str, tuple[int, ...], Path]] | None = None):
        self.entries = entries or {}

    @classmethod
    def from_dir(cls, path: str | Path) -> TensorIndex:
        entries: dict[str, tuple[str, tuple[int, ...], Path]] = {}
        for file in sorted(Path(path).glob("*.safetensors")):
            for name, (dtype, shape) in read_safetensors_header(file).items():
                entries[name] = (dtype, shape, file)
        return cls(entries)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def names(self) -> list[str]:
        return list(self.entries)

    def shape(self, name: str) -> tuple[int, ...] | None:
        entry = self.entries.get(name)
        return entry[1] if entry else None

    def find(self, suffix: str) -> str | None:
        """The one tensor named ``suffix`` or ending in ``.suffix``."""
        if suffix in self.entries:
            return suffix
        hits = [n for n in self.entries if n.endswith("." + suffix)]
        return hits[0] if len(hits) == 1 else None

    def read_ints(self, name: str) -> list[int]:
        """The values of a small integer tensor (used for ``d2t`` only)."""
        dtype, shape, file = self.entries[name]
        fmt = {"I64": "q", "I32": "i", "I16": "h", "I8": "b", "U8": "B"}.get(dtype)
        if fmt is None:
            raise ValueError(f"{name} has dtype {dtype}, expected an integer type")
        with open(file, "rb") as fh:
            (hlen,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(hlen))
            start, end = header[name]["data_offsets"]
            fh.seek(8 + hlen + start)
            raw = fh.read(end - start)
        return list(struct.unpack(f"<{len(raw) // struct.calcsize(fmt)}{fmt}", raw))


def read_safetensors_header(path: str | Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (dtype, shape)}`` from a safetensors file's header."""
    with open(path, "rb") as fh:
        raw_len = fh.read(8)
        if len(raw_len) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (hlen,) = struct.unpack("<Q", raw_len)
        if hlen > 100 * 1024 * 1024:
            raise ValueError(f"{path}: safetensors header length {hlen} is implausible")
        header = json.loads(fh.read(hlen))
    return {name: (meta["dtype"], tuple(meta["shape"]))
            for name, meta in header.items() if name != "__metadata__"}


# --------------------------------------------------------------------------- #
# Config helpers                                                               #
# --------------------------------------------------------------------------- #


def _text(cfg: dict) -> dict:
    """The language-model part of a (possibly multimodal) HF config."""
    tc = cfg.get("text_config")
    return tc if isinstance(tc, dict) else cfg


def _arch(cfg: dict) -> str:
    archs = cfg.get("architectures") or [""]
    return archs[0] or ""


def _is_eagle3_arch(arch: str) -> bool:
    return arch.startswith("Eagle3") or arch.endswith("Eagle3")


def infer_method(draft_cfg: dict, draft_name: str = "") -> str | None:
    """The speculative method vLLM would detect for this draft (best effort)."""
    arch = _arch(draft_cfg)
    if "DFlash" in arch or "dflash" in draft_name.lower() or "dflash_config" in draft_cfg:
        return "dflash"
    if "eagle3" in arch.lower() or "eagle3" in draft_name.lower():
        return "eagle3"
    if "eagle" in arch.lower():
        return "eagle"
    return None


def _rope(cfg: dict) -> dict:
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    return rope if isinstance(rope, dict) else {}


def _theta(cfg: dict) -> Any:
    theta = cfg.get("rope_theta")
    return theta if theta is not None else _rope(cfg).get("rope_theta")


def _rope_type(cfg: dict) -> str:
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
# The checks                                                                   #
# --------------------------------------------------------------------------- #


def _vllm_keeps_eagle3_deepseek_heads() -> bool:
    """Whether the installed vLLM carries the fix that keeps DeepSeek-type
    EAGLE-3 heads out of the MTP rewrite (our patch adds the symbol)."""
    try:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            return False
        from vllm.config import speculative  # noqa: PLC0415
    except Exception:  # noqa: BLE001 - any import problem means "stock"
        return False
    return hasattr(speculative, "_is_eagle3_draft_architecture")


def diagnose_configs(
    target_cfg: dict,
    draft_cfg: dict,
    tensors: TensorIndex,
    *,
    method: str | None = None,
    served_max_model_len: int | None = None,
    draft_name: str = "draft",
    vllm_keeps_eagle3_deepseek_heads: bool | None = None,
) -> list[Finding]:
    """All findings for a (target config, draft config, draft tensors) triple."""
    method = method or infer_method(draft_cfg, draft_name)
    if method == "mtp":
        return _diagnose_mtp(target_cfg, draft_cfg, tensors)
    tgt = _text(target_cfg)
    t_vocab = int(tgt.get("vocab_size") or target_cfg.get("vocab_size") or 0)
    t_hidden = int(tgt.get("hidden_size") or 0)
    t_layers = int(tgt.get("num_hidden_layers") or 0)
    out: list[Finding] = []
    if method == "eagle3":
        out += _check_mtp_rewrite(draft_cfg, vllm_keeps_eagle3_deepseek_heads)
    out += _check_context_cap(tgt, draft_cfg, served_max_model_len)
    if method in ("eagle3", "dflash") and _uses_aux(draft_cfg):
        out += _check_aux(draft_cfg, tensors, method, t_hidden, t_layers)
    out += _check_vocab(draft_cfg, tensors, t_vocab)
    out += _check_hidden(draft_cfg, t_hidden)
    out += _check_rope(tgt, draft_cfg)
    out += _check_special_ids(draft_cfg, t_vocab)
    if method == "dflash":
        out += _check_dflash_mask(draft_cfg, t_vocab)
    return out


def _check_mtp_rewrite(draft_cfg: dict, vllm_keeps_heads: bool | None) -> list[Finding]:
    """DeepSeek-type EAGLE-3 heads and vLLM's MTP rewrite."""
    arch, model_type = _arch(draft_cfg), draft_cfg.get("model_type")
    if model_type not in _DEEPSEEK_MTP_REWRITTEN:
        return []
    if vllm_keeps_heads is None:
        vllm_keeps_heads = _vllm_keeps_eagle3_deepseek_heads()
    if _is_eagle3_arch(arch) and vllm_keeps_heads:
        return []
    fix = ("set model_type 'deepseek_v2' in the draft's config.json, or use a vLLM "
           "carrying the EAGLE-3 rewrite fix" if _is_eagle3_arch(arch) else
           "name an EAGLE-3 architecture such as 'Eagle3DeepseekV2ForCausalLM' and "
           "set model_type 'deepseek_v2' in the draft's config.json")
    return [Finding("E-ARCH-MTP-REWRITE", ERROR, (
        f"draft model_type {model_type!r} with architecture {arch!r}: vLLM rewrites "
        "it into an MTP draft (DeepSeekMTPModel), which EAGLE-3 turns into the "
        f"non-existent 'Eagle3DeepSeekMTPModel'. To fix: {fix}."))]


def _check_context_cap(tgt: dict, draft_cfg: dict,
                       served_max_model_len: int | None) -> list[Finding]:
    """A draft with a shorter (non cache-only) RoPE context caps the served one."""
    served = served_max_model_len or int(tgt.get("max_position_embeddings") or 0)
    d_mpe = draft_cfg.get("max_position_embeddings")
    if d_mpe is None or not served or int(d_mpe) >= served:
        return []
    rtype = _rope_type(draft_cfg)
    if rtype in CACHE_ONLY_ROPE_TYPES:
        return []
    return [Finding("W-CONTEXT-CAP", WARNING, (
        f"draft max_position_embeddings={d_mpe} with {rtype} RoPE is below the "
        f"served context {served}: vLLM lowers max_model_len from {served} to "
        f"{d_mpe} for every request. Pass --max-model-len {d_mpe} knowingly, or "
        "use a draft exported for the target's full context."))]


def _uses_aux(draft_cfg: dict) -> bool:
    """False when the draft's eagle/dflash config turns aux hidden states off."""
    for key in ("eagle_config", "dflash_config"):
        sub = draft_cfg.get(key)
        if isinstance(sub, dict) and sub.get("use_aux_hidden_state") is False:
            return False
    return True


def _check_vocab(draft_cfg: dict, tensors: TensorIndex, t_vocab: int) -> list[Finding]:
    """Vocabulary size, the reduced-vocabulary ``d2t`` map and ``lm_head`` rows."""
    out: list[Finding] = []
    d_vocab = draft_cfg.get("vocab_size")
    if d_vocab is not None and t_vocab and int(d_vocab) != t_vocab:
        out.append(Finding("E-VOCAB-MISMATCH", ERROR, (
            f"draft vocab_size={d_vocab} differs from the target's {t_vocab}; drafts must "
            "use the target's tokenizer ids (a reduced head declares draft_vocab_size "
            "and ships d2t instead).")))
    dv = int(draft_cfg.get("draft_vocab_size") or d_vocab or t_vocab or 0)
    d2t_name = tensors.find("d2t")
    if t_vocab and dv and dv < t_vocab and d2t_name is None:
        out.append(Finding("E-D2T-MISSING", ERROR, (
            f"draft_vocab_size={dv} < target vocab_size={t_vocab} but the checkpoint has "
            "no 'd2t' tensor: stock vLLM keeps an all-zero map, reads every draft id i as "
            "target id i and acceptance collapses silently.")))
    if d2t_name is not None and t_vocab:
        out += _check_d2t(tensors, d2t_name, dv, t_vocab)
    lm = tensors.find("lm_head.weight")
    if lm is not None and dv and tensors.shape(lm)[0] != dv:
        out.append(Finding("E-LM-HEAD-ROWS", ERROR, (
            f"{lm} has {tensors.shape(lm)[0]} rows but draft_vocab_size is {dv}.")))
    return out


def _check_hidden(draft_cfg: dict, t_hidden: int) -> list[Finding]:
    """The hidden size the draft expects from the target."""
    declared = draft_cfg.get("target_hidden_size")
    d_hidden = draft_cfg.get("hidden_size")
    if t_hidden and declared is not None and int(declared) != t_hidden:
        return [Finding("E-HIDDEN-MISMATCH", ERROR, (
            f"draft target_hidden_size={declared} but the target's hidden_size is "
            f"{t_hidden}."))]
    if t_hidden and declared is None and d_hidden is not None and int(d_hidden) != t_hidden:
        return [Finding("E-HIDDEN-MISMATCH", ERROR, (
            f"draft hidden_size={d_hidden} differs from the target's hidden_size "
            f"{t_hidden} and the draft declares no target_hidden_size."))]
    return []


def _check_special_ids(draft_cfg: dict, t_vocab: int) -> list[Finding]:
    """The draft's bos / eos / pad ids must exist in the target vocabulary."""
    if not t_vocab:
        return []
    out: list[Finding] = []
    for key, code, sev in (("bos_token_id", "E-SPECIAL-ID", ERROR),
                           ("eos_token_id", "E-SPECIAL-ID", ERROR),
                           ("pad_token_id", "W-PAD-ID", WARNING)):
        bad = [i for i in _ids(draft_cfg.get(key)) if not 0 <= i < t_vocab]
        if bad:
            out.append(Finding(code, sev, (
                f"draft {key}={draft_cfg.get(key)} is outside the target vocabulary "
                f"[0, {t_vocab}).")))
    return out


def _check_dflash_mask(draft_cfg: dict, t_vocab: int) -> list[Finding]:
    """A DFlash draft embeds its masked block slots with ``mask_token_id``."""
    d_vocab = draft_cfg.get("vocab_size")
    dfc = draft_cfg.get("dflash_config") if isinstance(draft_cfg.get("dflash_config"),
                                                      dict) else {}
    mask = dfc.get("mask_token_id", draft_cfg.get("mask_token_id"))
    if mask is None or not 0 <= int(mask) < int(d_vocab or t_vocab or 0):
        return [Finding("E-DFLASH-MASK-ID", ERROR, (
            f"DFlash mask_token_id={mask} is missing or outside the draft vocabulary "
            f"[0, {d_vocab or t_vocab}); masked block slots would embed garbage."))]
    return []


def _check_aux(draft_cfg: dict, tensors: TensorIndex, method: str, t_hidden: int,
               t_layers: int) -> list[Finding]:
    out: list[Finding] = []
    ids, source = effective_aux_layer_ids(draft_cfg)
    eagle = draft_cfg.get("eagle_config") if isinstance(draft_cfg.get("eagle_config"),
                                                       dict) else {}
    hidden_ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    if ids is None and method == "eagle3":
        defaults = default_aux_layer_ids(t_layers) if t_layers else None
        if hidden_ids and defaults is not None:
            if list(hidden_ids) == defaults:
                out.append(Finding("W-AUX-IDS-IGNORED", WARNING, (
                    f"aux layer ids {list(hidden_ids)} are only given as eagle_config."
                    "eagle_aux_hidden_state_layer_ids, which vLLM 0.34.0 does not read; "
                    f"its defaults {defaults} agree.")))
            else:
                out.append(Finding("E-AUX-IDS-IGNORED", ERROR, (
                    f"aux layer ids {list(hidden_ids)} are only given as eagle_config."
                    "eagle_aux_hidden_state_layer_ids, which vLLM 0.34.0 does not read: it "
                    f"taps its defaults {defaults} instead. Move them to the top-level "
                    "'eagle_aux_hidden_state_layer_ids'.")))
            ids, source = list(hidden_ids), "eagle_config.eagle_aux_hidden_state_layer_ids"
        else:
            ids, source = defaults, "vLLM defaults (2, L//2, L-3)"
    if ids and t_layers:
        bad = [i for i in ids if not 0 <= int(i) <= t_layers]
        if bad:
            out.append(Finding("E-AUX-RANGE", ERROR, (
                f"aux layer ids {list(ids)} (from {source}) include {bad}, outside the "
                f"target's 0..{t_layers} ({t_layers} layers).")))
    declared_hidden = int(draft_cfg.get("target_hidden_size") or draft_cfg.get("hidden_size")
                          or t_hidden or 0)
    fc = tensors.find("fc.weight")
    if method == "eagle3":
        n_aux = draft_cfg.get("num_aux_hidden_states")
        n_aux_eff = int(n_aux) if n_aux is not None else (len(ids) if ids else 3)
        if ids and n_aux is not None and int(n_aux) != len(ids):
            out.append(Finding("E-AUX-COUNT", ERROR, (
                f"num_aux_hidden_states={n_aux} but {len(ids)} aux layer ids {list(ids)} "
                f"(from {source}): the target would feed {len(ids)}x{t_hidden} features to "
                f"an fc built for {n_aux}.")))
        expected = declared_hidden * n_aux_eff
    else:  # dflash: one feature per tap, or per draft layer without taps
        n = len(ids) if ids else int(draft_cfg.get("num_hidden_layers") or 0)
        expected = declared_hidden * n
    if fc is not None and expected and tensors.shape(fc)[-1] != expected:
        width = tensors.shape(fc)[-1]
        per = f"{width / declared_hidden:g}" if declared_hidden else "?"
        out.append(Finding("E-FC-WIDTH", ERROR, (
            f"{fc} has input width {width} (= {per} x hidden {declared_hidden}) but vLLM "
            f"builds it for {expected} (aux ids {list(ids) if ids else None} from {source}).")))
    return out


def _check_d2t(tensors: TensorIndex, name: str, dv: int, t_vocab: int) -> list[Finding]:
    shape = tensors.shape(name)
    if shape != (dv,):
        return [Finding("E-D2T-SHAPE", ERROR, (
            f"{name} has shape {shape}, expected ({dv},) (draft_vocab_size)."))]
    try:
        values = tensors.read_ints(name)
    except (ValueError, OSError, KeyError) as exc:
        return [Finding("E-CONFIG", ERROR, f"cannot read {name}: {exc}")]
    bad = [(i, i + d) for i, d in enumerate(values) if not 0 <= i + d < t_vocab]
    if not bad:
        return []
    i, t = bad[0]
    return [Finding("E-D2T-RANGE", ERROR, (
        f"{name} maps {len(bad)} draft id(s) outside the target vocabulary [0, {t_vocab}) "
        f"(target id = i + d2t[i]; first: draft id {i} -> {t})."))]


def _check_rope(tgt: dict, draft_cfg: dict) -> list[Finding]:
    out: list[Finding] = []
    t_theta, d_theta = _theta(tgt), _theta(draft_cfg)
    if t_theta is not None and d_theta is not None and float(t_theta) != float(d_theta):
        out.append(Finding("W-ROPE-THETA", WARNING, (
            f"draft rope_theta={d_theta} differs from the target's {t_theta}; drafts "
            "trained on the target's positions use its theta.")))
    tr, dr = _rope(tgt), _rope(draft_cfg)
    if tr and dr:
        diffs = []
        if _rope_type(tgt) != _rope_type(draft_cfg):
            diffs.append(f"type {_rope_type(draft_cfg)} vs {_rope_type(tgt)}")
        for key in ("factor", "original_max_position_embeddings"):
            if key in tr and key in dr and float(tr[key]) != float(dr[key]):
                diffs.append(f"{key} {dr[key]} vs {tr[key]}")
        if diffs:
            out.append(Finding("W-ROPE-SCALING", WARNING, (
                "draft RoPE scaling differs from the target's (draft vs target): "
                + "; ".join(diffs) + ".")))
    return out


def _diagnose_mtp(target_cfg: dict, draft_cfg: dict, tensors: TensorIndex) -> list[Finding]:
    cfg = _text(draft_cfg)
    n = int(cfg.get("num_nextn_predict_layers") or 0)
    layers = int(cfg.get("num_hidden_layers") or 0)
    if n <= 0:
        return [Finding("E-MTP-NO-LAYERS", ERROR, (
            f"method 'mtp' needs MTP layers but the checkpoint declares "
            f"num_nextn_predict_layers={cfg.get('num_nextn_predict_layers')} "
            f"(model_type {draft_cfg.get('model_type')!r}); loading it would build a second "
            "full target model."))]
    out: list[Finding] = []
    # A separate MTP directory for a kimi_k25 target may carry the target's
    # kimi_k25 config or a DeepSeek-V3 text config (deepseek_v3 / kimi_k2): patches
    # 0005 and 0012 load both as KimiK25MTPModel.
    h = int(cfg.get("hidden_size") or 0)
    vocab = int(cfg.get("vocab_size") or 0)
    for k in range(layers, layers + n):
        prefix = _mtp_prefix(tensors, k)
        missing = [p for p in _MTP_LAYER_PARTS if f"{prefix}{p}" not in tensors]
        if missing:
            out.append(Finding("E-MTP-TENSORS-MISSING", ERROR, (
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
                out.append(Finding("E-MTP-SHAPE", ERROR, (
                    f"{prefix}{part} has shape {got}, expected {shape} "
                    f"(hidden_size {h}, vocab_size {vocab}).")))
        out += _check_mtp_quant_format(draft_cfg, tensors, prefix, k)
    return out


def _ct_matches(name: str, pattern: str) -> bool:
    """compressed-tensors ``ignore`` / ``targets`` matching as vLLM does it: exact
    name, or ``re:`` + a regex matched at the start."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
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
    ignore = quant_config.get("ignore") or []
    if all(any(_ct_matches(n, pat) for pat in ignore) for n in names):
        return False
    for group in (quant_config.get("config_groups") or {}).values():
        if not (group or {}).get("weights"):
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
                                      or _text(draft_cfg).get("quantization_config"), layer)
    if quantized is None:
        return []
    expert = f"{prefix}mlp.experts.0.down_proj."
    packed = tensors.shape(expert + "weight_packed") is not None
    plain = tensors.shape(expert + "weight") is not None
    if quantized and plain and not packed:
        return [Finding("E-MTP-QUANT-FORMAT", ERROR, (
            f"the quantization_config (compressed-tensors) quantizes the routed experts of "
            f"MTP layer {layer}, so vLLM expects {expert}weight_packed / weight_scale / "
            f"weight_shape, but the checkpoint stores {expert}weight (unquantized): loading "
            "would fail on the first expert. Quantize the MTP experts like the target's, or "
            f"add 're:.*layers\\.{layer}\\..*' to the quantization_config's ignore list."))]
    if not quantized and packed and not plain:
        return [Finding("E-MTP-QUANT-FORMAT", ERROR, (
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


# --------------------------------------------------------------------------- #
# Entry point                                                                  #
# --------------------------------------------------------------------------- #


def _load_config(path: Path, what: str) -> dict:
    file = path / "config.json" if path.is_dir() else path
    try:
        return json.loads(file.read_text())
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{what}: no config.json at {file}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what}: {file} is not valid JSON ({exc})") from exc


def diagnose(
    target: str | Path,
    draft: str | Path,
    *,
    method: str | None = None,
    served_max_model_len: int | None = None,
    vllm_keeps_eagle3_deepseek_heads: bool | None = None,
) -> DoctorReport:
    """Check draft directory ``draft`` against target directory ``target``.

    ``method`` is the speculative method (``eagle3``, ``dflash``, ``mtp``;
    detected from the draft when omitted). For ``mtp`` the draft may be the
    target itself. ``served_max_model_len`` defaults to the target's
    ``max_position_embeddings``.
    """
    target, draft = Path(target), Path(draft)
    findings: list[Finding] = []
    try:
        t_cfg = _load_config(target, "target")
        d_cfg = _load_config(draft, "draft")
        tensors = TensorIndex.from_dir(draft if draft.is_dir() else draft.parent)
    except (OSError, ValueError) as exc:
        return DoctorReport(str(target), str(draft), method,
                            [Finding("E-CONFIG", ERROR, str(exc))])
    method = method or infer_method(d_cfg, str(draft))
    findings = diagnose_configs(
        t_cfg, d_cfg, tensors, method=method, served_max_model_len=served_max_model_len,
        draft_name=str(draft), vllm_keeps_eagle3_deepseek_heads=vllm_keeps_eagle3_deepseek_heads)
    return DoctorReport(str(target), str(draft), method, findings)


def format_findings(findings: Iterable[Finding]) -> str:
    return "\n".join(str(f) for f in findings)


def raise_on_errors(report: DoctorReport, logger=None, *, context: Sequence[str] = ()) -> None:
    """Log warnings; raise ``ValueError`` listing every error."""
    if logger is not None:
        for f in report.warnings:
            logger.warning("vllm-kimi-ext draft check: %s", f)
    if report.errors:
        lines = [f"draft {report.draft} is not usable with target {report.target} "
                 f"(method {report.method}):", *context,
                 *(f"  {f}" for f in report.errors)]
        raise ValueError("\n".join(lines))
