"""Runtime patch of ``vllm.v1.worker.gpu.spec_decode.mtp.config.MTPSpeculatorConfig``.
"""

from __future__ import annotations

from vllm.v1.worker.gpu.spec_decode.mtp.config import MTPSpeculatorConfig

from vllm_kimi_ext.integration import kimi_mtp
from vllm_kimi_ext.patching import Patch


class MTPSpeculatorConfigKimiK25MTP(Patch[MTPSpeculatorConfig]):
    """For a Kimi-K2.5 target, a DeepSeek-typed MTP directory (``deepseek_v3`` or
    ``kimi_k2``) loads as ``KimiK25MTPModel`` (needs the ``draft-model-arch`` git
    patch, which adds ``draft_hf_overrides``)."""

    @classmethod
    def draft_hf_overrides(cls, spec):
        return kimi_mtp.draft_hf_overrides(
            spec, MTPSpeculatorConfigKimiK25MTP.original("draft_hf_overrides")(spec))
