"""A YaRN draft's RoPE attention factor: what vLLM 0.34.0 uses, what the draft was trained
with, and a local config copy that makes vLLM use the trained one.

vLLM 0.34.0's plain-YaRN rotary embedding
(``vllm/model_executor/layers/rotary_embedding/yarn_scaling_rope.py``) takes its attention
factor (the ``mscale`` it multiplies cos/sin by) from, in order: ``attention_factor``; the
ratio ``yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)`` when both
``mscale`` and ``mscale_all_dim`` are set (vLLM PR 56446); else ``0.1 ln(factor) + 1``.
A draft whose config carries ``mscale = mscale_all_dim`` therefore runs at factor 1.0 on
0.34.0, while the plain YaRN of older vLLM and of SGLang runs it at ``0.1 ln(factor) + 1``:
1.416 for ``z-lab/Kimi-K2.5-DFlash`` (yarn factor 64, ``mscale = mscale_all_dim = 1.0``).
SGLang's ``YaRNScalingRotaryEmbedding`` (``python/sglang/srt/layers/rotary_embedding.py``)
computes ``yarn_get_mscale(scaling_factor) * attn_factor`` and ignores both keys (SGLang PR
22711, which proposed honouring them, was closed). vllm-ascend restores 1.416 for that
checkpoint, reporting lower draft acceptance with the newer value: the evidence that the draft
was trained at the plain-YaRN factor. :data:`TRAINED_DEFAULT` is therefore that value.

0.34.0 honours an explicit ``rope_scaling.attention_factor``, and dict ``--hf-overrides`` do
not reach the draft (``SpeculativeConfig.compose_draft_hf_overrides``), so the supported
route is a local copy of the draft directory whose ``config.json`` carries the factor
(:func:`write_copy`; ``vllm-kimi-ext draft rope-config``). A canary test builds the rotary
embedding through vLLM 0.34.0's own config path and checks :func:`effective_attention_factor`
against it.

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
TRAINED_DEFAULT = ("plain YaRN, 0.1 * ln(factor) + 1: what older vLLM and SGLang (which "
                   "ignore mscale / mscale_all_dim) compute, and the value vllm-ascend restores "
                   "for z-lab/Kimi-K2.5-DFlash")
ROPE_KEYS = ("rope_scaling", "rope_parameters")


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction (the formula vLLM and Transformers share)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_parameters(cfg: dict) -> dict:
    """The config's RoPE scaling dict (``rope_scaling`` or ``rope_parameters``), or {}."""
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


def trained_attention_factor(rope: dict) -> float:
    """The factor the draft's training stack used (see :data:`TRAINED_DEFAULT`)."""
    return yarn_get_mscale(float(rope["factor"]))


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
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) \
            or not math.isfinite(factor) or factor <= 1:
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
    check_out(draft, out)
    before, why = effective_attention_factor(rope)
    chosen = trained_attention_factor(rope) if attention_factor is None else attention_factor
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
