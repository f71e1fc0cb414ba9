"""Runtime patch of ``vllm.v1.worker.gpu.spec_decode.rejection_sampler.RejectionSampler``.
"""

from __future__ import annotations

from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

from vllm_kimi_ext.comm.accounting import phase
from vllm_kimi_ext.patching import Patch


class RejectionSamplerVerifyPhase(Patch[RejectionSampler]):
    """Live collective counting: collectives inside the stock rejection sampler
    count as phase ``"verify"``."""

    def __call__(self, *args, **kwargs):
        with phase("verify"):
            return RejectionSamplerVerifyPhase.original("__call__")(self, *args, **kwargs)
