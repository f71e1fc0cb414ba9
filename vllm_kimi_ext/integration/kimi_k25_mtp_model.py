"""``KimiK25MTP``: vLLM's DeepSeek MTP draft for a Kimi-K2.5 target (see
:mod:`vllm_kimi_ext.integration.kimi_mtp`). Imported by vLLM's model registry only
when a draft with the architecture ``KimiK25MTPModel`` is built."""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from vllm.config import VllmConfig
from vllm.model_executor.models.deepseek_mtp import DeepSeekMTP

_LM_PREFIX = "language_model."


def _draft_view(vllm_config: VllmConfig) -> VllmConfig:
    """A shallow copy of ``vllm_config`` whose ``model_config`` is the draft's.
    vLLM's ``DeepSeekMTP`` reads its layer counts from ``model_config.hf_config``,
    which here is the target's multimodal ``Kimi_K25Config``. The engine's own
    config is never modified."""
    spec = vllm_config.speculative_config
    draft = spec.draft_model_config if spec is not None else None
    if draft is None or vllm_config.model_config is draft:
        return vllm_config
    view = copy.copy(vllm_config)
    object.__setattr__(view, "model_config", draft)  # no re-validation of a copy
    return view


def _language_model_weights(weights: Iterable[tuple[str, torch.Tensor]], seen: list):
    """Tensors of the language model with ``language_model.`` stripped; the vision
    tower and projector are skipped; ``seen[0]`` names the tensor in flight."""
    for name, tensor in weights:
        seen[0] = name
        if name.startswith(_LM_PREFIX):
            name = name[len(_LM_PREFIX):]
            if name.startswith("layers."):  # NVFP4 exports without the model. level
                name = "model." + name
        elif not name.startswith("model."):
            continue
        yield name, tensor


class KimiK25MTP(DeepSeekMTP):
    """DeepSeek-style MTP layers (enorm, hnorm, eh_proj, a MoE decoder layer and the
    shared head at index ``num_hidden_layers``) for a Kimi-K2.5 target, from the
    target checkpoint (``language_model.``-prefixed) or a separate directory."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=_draft_view(vllm_config), prefix=prefix)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        seen: list[str | None] = [None]
        try:
            return super().load_weights(_language_model_weights(weights, seen))
        except (AssertionError, KeyError, ValueError) as exc:  # shape errors name nothing
            raise ValueError(f"Cannot load Kimi-K2.5 MTP weight {seen[0]!r}: {exc}") from exc
