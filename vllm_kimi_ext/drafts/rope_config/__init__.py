"""A YaRN draft's RoPE attention factor: what vLLM 0.34.0 uses, the other value in use, and a
local config copy that makes vLLM use a chosen one.

vLLM 0.34.0's plain-YaRN rotary embedding
(``vllm/model_executor/layers/rotary_embedding/yarn_scaling_rope.py``) takes its attention
factor (the ``mscale`` it multiplies cos/sin by) from, in order: ``attention_factor``; the
ratio ``yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)`` when both
``mscale`` and ``mscale_all_dim`` are set (vLLM PR 56446); else ``0.1 ln(factor) + 1``.
A draft whose config carries ``mscale = mscale_all_dim`` therefore runs at factor 1.0 on
0.34.0 (Hugging Face transformers' YaRN gives the same), while the plain YaRN of vLLM <= 0.29
and of SGLang (``python/sglang/srt/layers/rotary_embedding.py``, which ignores both keys)
runs it at ``0.1 ln(factor) + 1``: 1.4159 for ``z-lab/Kimi-K2.5-DFlash`` (yarn factor 64,
``mscale = mscale_all_dim = 1.0``). Which of the two such a draft was trained with is not
published; an A/B of both copies on a box settles it. :func:`plain_yarn_factor` is the
command's default (the other value of that A/B), not a claim about training.

0.34.0 honours an explicit ``attention_factor`` on that path, and dict ``--hf-overrides`` do
not reach the draft (``SpeculativeConfig.compose_draft_hf_overrides``), so the supported
route is a local copy of the draft directory whose ``config.json`` carries the factor
(:func:`write_copy`; ``vllm-kimi-ext draft rope-config``). A canary test builds the rotary
embedding through vLLM 0.34.0's own config path and checks :func:`effective_attention_factor`
against it.

Two kinds of config are refused, because the copy would not do what it says:

* **DeepSeek / MLA heads** (``Eagle3DeepseekV2ForCausalLM``, ``model_type`` ``kimi_k2`` /
  ``deepseek_v3``, ...): vLLM 0.34.0's MLA attention rewrites a non-default rope to
  ``deepseek_yarn`` (:data:`DEEPSEEK_ROPE` cites the lines), whose rotary embedding never
  reads ``attention_factor``; an ``attention_factor`` of exactly 1.0 switches it to
  ``deepseek_llama_scaling`` instead, which drops the ``mscale_all_dim`` softmax correction.
* **Both ``rope_scaling`` and ``rope_parameters``, differing**: transformers 5 keeps
  ``rope_scaling`` and drops ``rope_parameters`` (``convert_rope_params_to_dict``:
  ``rope_scaling or rope_parameters``), so which dict vLLM reads depends on the library; when
  both carry the same YaRN values, the copy writes the factor into both.

Standard library only.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from vllm_kimi_ext.user_input import UsageError, UserInputError

#: How the default factor is chosen (printed by the command and the docs).
DEFAULT_FACTOR = ("plain YaRN, 0.1 * ln(factor) + 1: what vLLM <= 0.29 and SGLang (which "
                  "ignore mscale / mscale_all_dim) compute; which factor a draft was trained "
                  "with is not established by its config: an A/B of both settles it")
ROPE_KEYS = ("rope_scaling", "rope_parameters")
#: Where vLLM 0.34.0 ignores or reinterprets ``attention_factor`` for DeepSeek / MLA heads.
DEEPSEEK_ROPE = (
    "vLLM 0.34.0's DeepSeek MLA attention rewrites a yarn rope to deepseek_yarn "
    "(vllm/model_executor/models/deepseek_v2.py:1115-1120), whose rotary embedding takes no "
    "attention_factor (vllm/model_executor/layers/rotary_embedding/__init__.py:284-299), and "
    "an attention_factor of 1.0 switches it to deepseek_llama_scaling, which drops the "
    "mscale_all_dim softmax correction (deepseek_v2.py:1129-1136)")
#: ``model_type`` values vLLM 0.34.0 builds with DeepSeek (MLA) attention.
MLA_MODEL_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_mtp",
                             "kimi_k2", "kimi_k25", "glm_moe_dsa"})
#: The keys that decide a YaRN rotary embedding (compared when both dicts are present).
YARN_KEYS = ("rope_type", "type", "factor", "original_max_position_embeddings", "mscale",
             "mscale_all_dim", "attention_factor", "beta_fast", "beta_slow")
#: Factors below this print as 0.0000.
MIN_FACTOR = 5e-5


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction (the formula vLLM and Transformers share)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_parameters(cfg: dict) -> dict:
    """The config's RoPE scaling dict as transformers 5 keeps it (``rope_scaling`` when
    non-empty, else ``rope_parameters``), or {}."""
    for key in ROPE_KEYS:
        value = cfg.get(key)
        if isinstance(value, dict) and value:
            return value
    return {}


def is_yarn(rope: dict) -> bool:
    return str(rope.get("rope_type") or rope.get("type") or "") == "yarn"


def effective_attention_factor(rope: dict) -> tuple[float, str]:
    """(factor, why) as vLLM 0.34.0's ``YaRNScalingRotaryEmbedding`` computes it for a
    ``yarn`` rope dict."""
    factor = float(rope["factor"])
    if rope.get("attention_factor") is not None:
        return float(rope["attention_factor"]), "its explicit attention_factor"
    ms, ms_all = rope.get("mscale"), rope.get("mscale_all_dim")
    if ms and ms_all:
        return (yarn_get_mscale(factor, float(ms)) / yarn_get_mscale(factor, float(ms_all)),
                f"mscale {ms:g} / mscale_all_dim {ms_all:g} (vLLM PR 56446)")
    return yarn_get_mscale(factor), "plain YaRN, 0.1 * ln(factor) + 1"


def plain_yarn_factor(rope: dict) -> float:
    """Plain YaRN's factor ``0.1 ln(factor) + 1`` (vLLM <= 0.29, SGLang); see
    :data:`DEFAULT_FACTOR`."""
    return yarn_get_mscale(float(rope["factor"]))


def mla_reason(cfg: dict) -> str | None:
    """Why vLLM 0.34.0 builds this draft's attention as DeepSeek MLA (None when it does
    not): its architecture, ``model_type`` or an MLA field."""
    archs = [a for a in cfg.get("architectures") or [] if isinstance(a, str)]
    hit = [a for a in archs if "deepseek" in a.lower() or "kimik2" in a.lower()]
    if hit:
        return f"architectures {hit[0]}"
    if cfg.get("model_type") in MLA_MODEL_TYPES:
        return f"model_type {cfg['model_type']}"
    if "kv_lora_rank" in cfg:
        return "an MLA field (kv_lora_rank)"
    return None


def check_both_dicts(cfg: dict, file: Path) -> None:
    """Refuse a config whose ``rope_scaling`` and ``rope_parameters`` disagree on a YaRN
    key (which one vLLM reads depends on the transformers version)."""
    a, b = cfg.get("rope_scaling"), cfg.get("rope_parameters")
    if not (isinstance(a, dict) and a and isinstance(b, dict) and b):
        return
    differ = [k for k in YARN_KEYS if k in a and k in b and a[k] != b[k]]
    differ += [k for k in YARN_KEYS if (k in a) != (k in b) and k != "type"
               and k != "rope_type"]
    if differ:
        raise UserInputError(
            f"{file}: fields rope_scaling and rope_parameters both present and different in "
            f"{differ[0]} ({a.get(differ[0])!r} vs {b.get(differ[0])!r}): transformers 5 "
            "reads rope_scaling and drops rope_parameters, older code may read the other; "
            "keep one (expected a single RoPE dict, or two equal ones)",
            file=file, field="rope_scaling", expected="one RoPE dict")


def read_config(draft: Path) -> dict:
    """The draft directory's config.json; UserInputError naming the file otherwise."""
    file = draft / "config.json"
    if not draft.is_dir():
        raise UserInputError(f"--draft {draft}: not a directory (expected a draft checkpoint "
                             "directory with config.json)", file=draft)
    try:
        cfg = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserInputError(f"{file}: missing (expected the draft's config.json)",
                             file=file) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserInputError(f"{file}: cannot read ({exc.__class__.__name__})",
                             file=file) from None
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{file}: not valid JSON (line {exc.lineno}: {exc.msg})",
                             file=file) from None
    if not isinstance(cfg, dict):
        raise UserInputError(f"{file}: expected a JSON object", file=file)
    return cfg


def yarn_rope(cfg: dict, file: Path) -> dict:
    """The config's yarn rope dict; UserInputError naming the field otherwise."""
    why = mla_reason(cfg)
    if why:
        raise UserInputError(
            f"{file}: a DeepSeek / MLA draft ({why}): {DEEPSEEK_ROPE}; a copy would not set "
            "its RoPE amplitude, so nothing is written (expected a draft on vLLM's plain "
            "YaRN path, e.g. DFlash or a Llama-style EAGLE-3 head)", file=file,
            field="architectures", expected="a draft vLLM builds with plain YaRN")
    check_both_dicts(cfg, file)
    rope = rope_parameters(cfg)
    if not rope:
        raise UserInputError(f"{file}: field rope_scaling: missing (expected a yarn "
                             "rope_scaling dict; nothing to choose for a draft without YaRN)",
                             file=file, field="rope_scaling", expected="a yarn dict")
    if not is_yarn(rope):
        raise UserInputError(
            f"{file}: field rope_scaling.rope_type: expected 'yarn', got "
            f"{rope.get('rope_type') or rope.get('type')!r} (only YaRN has an attention "
            "factor)", file=file, field="rope_scaling.rope_type", expected="yarn")
    factor = rope.get("factor")
    if (isinstance(factor, bool) or not isinstance(factor, (int, float))
            or not math.isfinite(factor) or factor <= 1):
        raise UserInputError(f"{file}: field rope_scaling.factor: expected a number > 1, got "
                             f"{factor!r}", file=file, field="rope_scaling.factor",
                             expected="a number > 1")
    for key in ("mscale", "mscale_all_dim", "attention_factor"):
        v = rope.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not math.isfinite(v) or v <= 0):
            raise UserInputError(f"{file}: field rope_scaling.{key}: expected a positive "
                                 f"number, got {v!r}", file=file,
                                 field=f"rope_scaling.{key}", expected="a positive number")
    return rope


def check_out(draft: Path, out: Path) -> None:
    """--out: a new directory (or an empty one), not inside --draft, its parent a directory."""
    src, dst = draft.resolve(), out.resolve()
    if dst == src or src in dst.parents:
        raise UsageError(f"--out {out}: inside --draft {draft} (expected a new directory "
                         "beside it)", field="--out", expected="a new directory")
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise UsageError(f"--out {out}: exists and is not an empty directory (expected a new "
                         "directory; nothing was written)", field="--out",
                         expected="a new or empty directory")
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: parent {out.parent} is not a directory",
                         field="--out", expected="a path whose parent directory exists")


def write_copy(draft: Path, out: Path, attention_factor: float | None = None
               ) -> dict[str, Any]:
    """Write ``out``: ``draft``'s config.json with an explicit
    ``attention_factor`` in every YaRN rope dict, every other entry of ``draft`` linked
    (symlinks, absolute). Built in a temporary directory beside ``out`` and renamed into
    place: an interrupted run leaves no ``out``. Returns what was done."""
    draft, out = Path(draft), Path(out)
    cfg = read_config(draft)
    file = draft / "config.json"
    rope = yarn_rope(cfg, file)
    if attention_factor is not None and attention_factor < MIN_FACTOR:
        raise UsageError(f"--attention-factor {attention_factor!r}: prints as 0.0000 and would "
                         "silence the rotary embedding (expected a factor >= 0.0001)",
                         field="--attention-factor", expected="a factor >= 0.0001")
    check_out(draft, out)
    before, why = effective_attention_factor(rope)
    chosen = plain_yarn_factor(rope) if attention_factor is None else attention_factor
    new = json.loads(json.dumps(cfg))
    for key in ROPE_KEYS:
        if isinstance(new.get(key), dict) and is_yarn(new[key]):
            new[key]["attention_factor"] = chosen
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would hide the copy from other users
        linked = 0
        for entry in sorted(draft.iterdir()):
            if entry.name == "config.json":
                continue
            os.symlink(entry.resolve(), tmp / entry.name)
            linked += 1
        (tmp / "config.json").write_text(json.dumps(new, indent=2) + "\n", encoding="utf-8")
        if out.exists():
            out.rmdir()  # empty (checked above)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"out": str(out), "attention_factor": chosen, "vllm_0_34_factor": before,
            "vllm_0_34_why": why, "linked": linked,
            "default": attention_factor is None}
