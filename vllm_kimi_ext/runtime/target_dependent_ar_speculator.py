"""Runtime patch of
``vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator.TargetDependentARSpeculator``
(the EAGLE / EAGLE-3 / MTP speculator).
"""

from __future__ import annotations

from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator import (
    TargetDependentARSpeculator,
)

from vllm_kimi_ext.integration import draft_embedding
from vllm_kimi_ext.patching import Patch


class TargetDependentARSpeculatorReplicatedEmbedding(Patch[TargetDependentARSpeculator]):
    """``VLLM_KIMI_EXT_REPLICATE_DRAFT_EMBEDDING``: once the EAGLE-family draft is
    loaded, swap its vocab-sharded input embedding for a whole copy on every rank."""

    def load_model(self, target_model):
        TargetDependentARSpeculatorReplicatedEmbedding.original("load_model")(
            self, target_model)
        draft_embedding.after_load(self)
