"""Runtime patch of ``vllm.v1.worker.gpu.sample.sampler.Sampler``.
"""

from __future__ import annotations

from vllm.v1.worker.gpu.sample.sampler import Sampler

from vllm_kimi_ext.integration.sharded_verify.gate import remember_sampling_params
from vllm_kimi_ext.patching import Patch


class SamplerRememberParams(Patch[Sampler]):
    """Sharded verification: keep each request slot's ``SamplingParams`` so a
    step's eligibility is decided from the real parameters."""

    def add_request(self, req_idx, sampling_params):
        remember_sampling_params(self, req_idx, sampling_params)
        return SamplerRememberParams.original("add_request")(self, req_idx, sampling_params)
