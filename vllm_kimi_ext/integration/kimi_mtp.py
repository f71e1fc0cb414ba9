"""DeepSeek-style MTP drafts for a Kimi-K2.5 target (``method: "mtp"``).

Kimi-K2.5 (``model_type: kimi_k25``) is a DeepSeek-V3 language model under a vision
wrapper: its text config is nested under ``text_config`` and its tensors are stored
under ``language_model.``. No checkpoint Moonshot publishes has MTP layers
(``num_nextn_predict_layers: 0``); a third-party DeepSeek-style layer 61 exists
(``modularai/Kimi-K2.5-MTP``), in a directory whose config is a DeepSeek-V3 text config
(``deepseek_v3`` or ``kimi_k2``). vLLM 0.34.0 cannot load either shape for a K2.5
target, and since no public checkpoint of the first shape exists this stays in the
plugin (runtime patches ``vllm_kimi_ext/runtime/speculative_config.py`` and
``vllm_kimi_ext/runtime/mtp_speculator_config.py``) rather than going upstream:

* :func:`promote_kimi_k25` (``SpeculativeConfig.hf_config_override``): a ``kimi_k25``
  config that declares MTP layers becomes its text config, marked ``deepseek_mtp`` with
  ``n_predict`` layers and the architecture :data:`ARCHITECTURE` (keeping a top-level
  ``quantization_config``); without MTP layers it is left alone, so vLLM (and the
  ``mtp-refusal`` git patch) still refuse ``method: "mtp"``;
* :func:`kimi_target_override` (``MTPSpeculatorConfig.draft_hf_overrides``): for a
  ``kimi_k25`` target, a DeepSeek-typed MTP directory loads as :data:`ARCHITECTURE`
  too (``kimi_k2`` is rewritten like ``deepseek_v3``); vLLM's own overrides (callable or
  dict) are applied first, never dropped;
* :data:`ARCHITECTURE` is ``vllm_kimi_ext.integration.kimi_k25_mtp_model.KimiK25MTP``,
  registered with vLLM's ``ModelRegistry`` in every process the plugin runs in.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

ARCHITECTURE = "KimiK25MTPModel"
MODEL_CLASS = "vllm_kimi_ext.integration.kimi_k25_mtp_model:KimiK25MTP"


def _mtp_layers(config: Any) -> int:
    return int(getattr(config, "num_nextn_predict_layers", None) or 0)


def promote_kimi_k25(hf_config: Any) -> Any | None:
    """The draft config of a ``kimi_k25`` checkpoint with MTP layers, else None
    (the caller then applies vLLM's own rewrites)."""
    if getattr(hf_config, "model_type", None) != "kimi_k25":
        return None
    text = getattr(hf_config, "text_config", None)
    if text is None or not _mtp_layers(text):
        return None
    quantization_config = getattr(hf_config, "quantization_config", None)
    draft = copy.deepcopy(text)
    if quantization_config is not None and getattr(draft, "quantization_config", None) is None:
        draft.quantization_config = copy.deepcopy(quantization_config)
    draft.model_type = "deepseek_mtp"
    draft.update({"n_predict": _mtp_layers(draft), "architectures": [ARCHITECTURE]})
    return draft


def kimi_target_override(hf_config: Any, base: Any = None) -> Any:
    """Draft-config rewrite for a Kimi-K2.5 target (module level: picklable). ``base``:
    vLLM's own ``hf_overrides`` for the draft, a callable or a dict, applied first."""
    if callable(base):
        hf_config = base(hf_config)
    elif base:
        hf_config.update(base)
    model_type = getattr(hf_config, "model_type", None)
    n_layers = _mtp_layers(hf_config)
    if model_type == "kimi_k2" and n_layers:
        hf_config.model_type = "deepseek_mtp"
        hf_config.update({"n_predict": n_layers, "architectures": ["DeepSeekMTPModel"]})
    if getattr(hf_config, "model_type", None) == "deepseek_mtp" and getattr(
            hf_config, "architectures", None) == ["DeepSeekMTPModel"]:
        hf_config.update({"architectures": [ARCHITECTURE]})
    return hf_config


def draft_hf_overrides(spec: Any, overrides: Any) -> Any:
    """``overrides`` (vLLM's ``draft_hf_overrides`` for an MTP draft) for any target but
    Kimi-K2.5; for a ``kimi_k25`` target, :func:`kimi_target_override` around them."""
    target = getattr(spec, "target_model_config", None)
    if target is None or getattr(target.hf_config, "model_type", None) != "kimi_k25":
        return overrides
    return functools.partial(kimi_target_override, base=overrides)


def hf_config_override(original: Callable[..., Any], hf_config: Any, *args: Any,
                       **kwargs: Any) -> Any:
    """vLLM's ``SpeculativeConfig.hf_config_override`` (``original``) with the
    ``kimi_k25`` promotion in front (the Transformers-backend path is left to vLLM)."""
    transformers_overrides = args[0] if args else kwargs.get("transformers_mtp_overrides")
    if transformers_overrides is None:
        promoted = promote_kimi_k25(hf_config)
        if promoted is not None:
            return promoted
    return original(hf_config, *args, **kwargs)


def register_model() -> None:
    """Make :data:`ARCHITECTURE` resolvable by vLLM's model registry (idempotent)."""
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
