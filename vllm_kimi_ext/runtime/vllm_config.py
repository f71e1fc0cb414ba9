"""Runtime patch of ``vllm.config.VllmConfig``.
"""

from __future__ import annotations

from vllm.config import VllmConfig

from vllm_kimi_ext.integration import draft_check
from vllm_kimi_ext.patching import Patch


class VllmConfigDraftCheck(Patch[VllmConfig]):
    """Run the draft checks once the speculative config exists and before vLLM
    lowers ``max_model_len`` to the draft's (``VllmConfig.__post_init__`` calls
    this method at that point)."""

    def _limit_max_model_len_to_draft(self) -> None:
        draft_check.check_unless_skipped(self)
        return VllmConfigDraftCheck.original("_limit_max_model_len_to_draft")(self)
