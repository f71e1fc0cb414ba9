"""Runtime patch of ``vllm.v1.worker.gpu.spec_decode.speculator.DraftModelSpeculator``
(every speculator with a draft model; with ``draft_tensor_parallel_size: 1`` each rank
drafts on its own and vLLM then adopts rank 0's draft tokens).
"""

from __future__ import annotations

from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

from vllm_kimi_ext.integration import draft_agreement
from vllm_kimi_ext.patching import Patch


class DraftModelSpeculatorAgreementCheck(Patch[DraftModelSpeculator]):
    """Debug: before vLLM replaces every rank's draft tokens with rank 0's, fail
    loudly if the ranks drafted different tokens (a silent override otherwise)."""

    def agree_on_draft_tokens(self, draft_tokens):
        draft_agreement.check_after_propose(self, draft_tokens)
        return DraftModelSpeculatorAgreementCheck.original("agree_on_draft_tokens")(
            self, draft_tokens)
