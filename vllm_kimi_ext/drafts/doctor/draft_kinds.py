"""What a draft is, per speculative method, in vLLM 0.34.0 — and what a target is not.

- ``eagle3``: an EAGLE-3 head: an ``fc`` weight (fuses the target's aux hidden states)
  and an architecture vLLM resolves to an EAGLE-3 class. ``EAGLEConfig`` keeps a name
  that starts or ends with ``Eagle3`` and prefixes any other with ``Eagle3``
  (``transformers_utils/configs/eagle.py``), so ``LlamaForCausalLM`` is accepted as
  ``Eagle3LlamaForCausalLM``, while ``KimiK25ForConditionalGeneration`` (a target) is not.
- ``dflash``: the same with ``DFlash`` (plus ``LiLiCorrDraftModel``), an ``fc`` weight and
  a block size.
- ``mtp``: a checkpoint with MTP layers (``num_nextn_predict_layers`` > 0); it may be the
  target itself.
- ``draft_model``: an ordinary causal LM (``*ForCausalLM``), not a draft head.

The class-name sets mirror vLLM 0.34.0's ``_SPECULATIVE_DECODING_MODELS``
(``model_executor/models/registry.py``); ``tests/canary`` checks them against the
installed registry. Standard library only.
"""

from __future__ import annotations

__all__ = [
    "DFLASH_ARCHITECTURES",
    "EAGLE3_ARCHITECTURES",
    "DRAFT_ONLY_KEYS",
    "is_draft_architecture",
    "resolved_architecture",
]

EAGLE3_ARCHITECTURES = frozenset({
    "Eagle3LlamaForCausalLM", "Eagle3MiniMaxM2ForCausalLM", "LlamaForCausalLMEagle3",
    "Eagle3Qwen2_5vlForCausalLM", "Eagle3Qwen3vlForCausalLM", "Eagle3Qwen3ForCausalLM",
    "Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM",
})
DFLASH_ARCHITECTURES = frozenset({
    "DFlashDraftModel", "DFlash2DraftModel", "DFlash2BeamDraftModel",
    "DFlash2RicursiveDraftModel", "DFlashMuseGlimmerAssistantModel", "DFlashQwen3XPressModel",
    "DFlashLagunaForCausalLM", "LiLiCorrDraftModel",
})
#: Config keys only draft checkpoints carry.
DRAFT_ONLY_KEYS = ("draft_vocab_size", "eagle_config", "dflash_config",
                   "eagle_aux_hidden_state_layer_ids", "num_aux_hidden_states",
                   "target_hidden_size", "speculators_config")
_DRAFT_NAME_MARKERS = ("eagle", "dflash", "dspark", "medusa", "mtpmodel", "speculator",
                       "draftmodel")


def resolved_architecture(arch: str, method: str) -> str:
    """The class name vLLM looks up for a draft declaring ``arch`` under ``method``."""
    if method == "eagle3":
        return arch if arch.startswith("Eagle3") or arch.endswith("Eagle3") else f"Eagle3{arch}"
    if method == "dflash":
        keep = arch.startswith("DFlash") or arch.endswith("DFlash") or arch == "LiLiCorrDraftModel"
        return arch if keep else f"DFlash{arch}"
    return arch


def is_draft_architecture(arch: str) -> bool:
    """Whether ``arch`` names a draft head (EAGLE / DFlash / DSpark / MTP / Medusa ...)."""
    return any(m in arch.lower() for m in _DRAFT_NAME_MARKERS)
