"""Runtime patches of ``vllm.v1.worker.gpu.model_runner.GPUModelRunner``.

Two features, disjoint attributes: live collective counting owns
``execute_model`` and ``sample_tokens``; sharded verification owns ``sample``.
"""

from __future__ import annotations

from vllm.v1.worker.gpu.model_runner import GPUModelRunner

from vllm_kimi_ext.comm import accounting
from vllm_kimi_ext.integration import sharded_verify
from vllm_kimi_ext.patching import Patch


class GPUModelRunnerStepCounting(Patch[GPUModelRunner]):
    """Live collective counting: ``sample_tokens`` (logits, their all-gather, sampling or
    verification) counts as phase ``"verify"``, the speculator's ``propose`` inside it as
    ``"draft"``, the forward (``execute_model``) as ``"target"``; every finished step feeds
    the per-N-steps report."""

    def execute_model(self, *args, **kwargs):
        accounting.label_draft_phase(self)
        return GPUModelRunnerStepCounting.original("execute_model")(self, *args, **kwargs)

    def sample_tokens(self, *args, **kwargs):
        try:
            with accounting.phase("verify"):
                return GPUModelRunnerStepCounting.original("sample_tokens")(
                    self, *args, **kwargs)
        finally:
            accounting.live_step_done()


class GPUModelRunnerShardedVerify(Patch[GPUModelRunner]):
    """Eligible verification steps over vocabulary shards; every other step
    through the stock method (:func:`~vllm_kimi_ext.integration.sharded_verify.sample_step`).
    ``capture_model`` also captures the verification graphs (before serving, after vLLM's
    own graphs: :func:`~vllm_kimi_ext.integration.sharded_verify.warm_up`)."""

    def capture_model(self, *args, **kwargs):
        out = GPUModelRunnerShardedVerify.original("capture_model")(self, *args, **kwargs)
        if not kwargs.get("profile_only"):
            sharded_verify.warm_up(self)
        return out

    def sample(self, hidden_states, input_batch, grammar_output):
        return sharded_verify.sample_step(self, GPUModelRunnerShardedVerify.original("sample"),
                                       hidden_states, input_batch, grammar_output)
