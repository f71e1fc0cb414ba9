"""Runtime patch of ``vllm.config.SpeculativeConfig``.
"""

from __future__ import annotations

from vllm.config import SpeculativeConfig

from vllm_kimi_ext.integration import draft_embedding, kimi_mtp
from vllm_kimi_ext.patching import Patch


class SpeculativeConfigReplicatedEmbeddingFactor(Patch[SpeculativeConfig]):
    """``VLLM_KIMI_EXT_REPLICATE_DRAFT_EMBEDDING`` changes the draft's compiled graph
    (no embedding all-reduce), so it is a compile factor."""

    def compile_factors(self):
        return draft_embedding.compile_factor(
            SpeculativeConfigReplicatedEmbeddingFactor.original("compile_factors")(self))


class SpeculativeConfigKimiK25MTP(Patch[SpeculativeConfig]):
    """A ``kimi_k25`` checkpoint with MTP layers is read as its DeepSeek MTP layers
    (``KimiK25MTPModel``); everything else goes to vLLM's rewrites."""

    @staticmethod
    def hf_config_override(hf_config, *args, **kwargs):
        return kimi_mtp.hf_config_override(
            SpeculativeConfigKimiK25MTP.original("hf_config_override"),
            hf_config, *args, **kwargs)
