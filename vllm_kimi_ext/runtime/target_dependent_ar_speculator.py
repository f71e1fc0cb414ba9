"""Runtime patch of
``vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator.TargetDependentARSpeculator``
(the EAGLE / EAGLE-3 / MTP speculator, the ones that can run their draft un-sharded).
"""

from __future__ import annotations

from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator import (
    TargetDependentARSpeculator,
)

from vllm_kimi_ext.integration import draft_agreement, draft_embedding
from vllm_kimi_ext.patching import Patch


class TargetDependentARSpeculatorAgreementCheck(Patch[TargetDependentARSpeculator]):
    """Debug: after every ``propose`` of an un-sharded draft, all TP ranks must
    hold the same draft tokens."""

    def propose(self, *args, **kwargs):
        tokens = TargetDependentARSpeculatorAgreementCheck.original("propose")(
            self, *args, **kwargs)
        draft_agreement.check_after_propose(self, tokens)
        return tokens


class TargetDependentARSpeculatorReplicatedEmbedding(Patch[TargetDependentARSpeculator]):
    """``VLLM_KIMI_EXT_REPLICATE_DRAFT_EMBEDDING``: once the EAGLE-family draft is
    loaded, swap its vocab-sharded input embedding for a whole copy on every rank."""

    def load_model(self, target_model):
        TargetDependentARSpeculatorReplicatedEmbedding.original("load_model")(
            self, target_model)
        draft_embedding.after_load(self)
