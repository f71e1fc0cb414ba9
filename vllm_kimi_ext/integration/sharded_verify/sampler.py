"""One :class:`ShardedSampler` per vLLM model runner: the object behind the runtime patch of
``GPUModelRunner.sample`` / ``capture_model``. It owns everything sharded verification
keeps between steps: the verifier per vocabulary shard width (its CUDA graphs), the per-k
verifier choice, the counters (:class:`~.telemetry.Telemetry`) and the warm-up. vLLM's
runner holds it as its one attribute :attr:`ShardedSampler.ATTR`.

A step: :meth:`ShardedSampler.sample` asks the gate (:func:`~.gate.gate`) for the step's
plan; a :class:`~vllm_kimi_ext.verify.protocol.Fallback` runs vLLM's stock method, a
:class:`~vllm_kimi_ext.verify.protocol.StepPlan` runs :meth:`ShardedSampler.sharded_sample`:
``compute_logits_local`` (git patch logits-local) instead of the logits all-gather, the
step's inputs (:mod:`.inputs`), the verifier (replayed from the graphs captured at warm-up,
:class:`~vllm_kimi_ext.verify.graph_step.StepGraphs`), then vLLM's own
``get_num_sampled_and_rejected`` and ``SamplerOutput``.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm_kimi_ext.integration.verifier_choice import VerifierChoices
from vllm_kimi_ext.verify.protocol import Fallback, StepPlan, plan_from_params

from .gate import _RUNNER, _SPEC, gate
from .inputs import draft_q, step_inputs
from .telemetry import Telemetry

logger = logging.getLogger("vllm_kimi_ext.verify")

#: vLLM attributes :meth:`ShardedSampler.warm_up` reads, ``(vLLM class, attribute)``; a
#: missing one skips the warm-up (logged; every step then runs eagerly, counted
#: ``not_warmed_up``). ``tests/canary/test_sharded_verify_gate.py`` checks each on vLLM
#: 0.34.0.
WARM_UP_ATTRIBUTES = (
    (_RUNNER, "capture_model"), (_RUNNER, "device"), (_RUNNER, "model_config"),
    (_RUNNER, "rejection_sampler"), (_RUNNER, "speculator"), (_RUNNER, "model"),
    ("vllm.config.model.ModelConfig", "get_hidden_size"),
    ("vllm.config.model.ModelConfig", "get_vocab_size"),
    ("vllm.config.model.ModelConfig", "dtype"),
    (_SPEC, "draft_logits"),
)


class EagerStep:
    """The step run eagerly (no CUDA graph), with the call signature of StepGraphs."""

    def __init__(self, step):
        self.step = step

    def __call__(self, logits_shard, inp, plan, q_full=None):
        return self.step.run(logits_shard, inp, plan, q_full)

    def __getattr__(self, name):
        return getattr(self.step, name)


class ShardedSampler:
    """Sharded verification for one vLLM model runner (see the module docstring)."""

    #: The one attribute this plugin keeps on vLLM's ``GPUModelRunner``.
    ATTR = "_kimi_ext_sharded_sampler"

    def __init__(self, runner: Any):
        self.runner = runner
        #: The verifier per vocabulary shard width: StepGraphs, or EagerStep with graphs off.
        self.verifiers: dict[int, Any] = {}
        self.choices = VerifierChoices(logger)
        self.telemetry = Telemetry(logger)

    @classmethod
    def of(cls, runner: Any) -> ShardedSampler:
        """The runner's sampler, made on first use."""
        sampler = runner.__dict__.get(cls.ATTR)
        if sampler is None:
            sampler = runner.__dict__[cls.ATTR] = cls(runner)
        return sampler

    # --- one step -----------------------------------------------------------------
    def plan(self, input_batch: Any, grammar_output: Any, tp_size: int,
             vocab_size: int) -> StepPlan | Fallback:
        """The gate's answer for this step, counted (and the summary line every 1000)."""
        decision = gate(self.runner, input_batch, grammar_output, tp_size, vocab_size,
                        self.choices)
        if self.telemetry.record(decision):
            self.telemetry.summary(self.graph_counts())
        return decision

    def sample(self, original: Any, hidden_states: Any, input_batch: Any,
               grammar_output: Any):
        """``GPUModelRunner.sample``: an eligible verification step runs
        :meth:`sharded_sample`; any other step runs ``original`` (the stock method,
        batch-sharded when vLLM's batch sharder is on)."""
        from vllm.distributed import get_tp_group

        plan = self.plan(input_batch, grammar_output, get_tp_group().world_size,
                         self.runner.model_config.get_vocab_size())
        if isinstance(plan, Fallback):
            return original(self.runner, hidden_states, input_batch, grammar_output)
        return self.sharded_sample(hidden_states, input_batch, plan)

    def sharded_sample(self, hidden_states: Any, input_batch: Any,
                       plan: StepPlan | None = None):
        """The sharded verification step; returns what ``GPUModelRunner.sample`` returns.

        The step's shapes and rounds come from the requests' ``SamplingParams`` (host
        objects; ``plan``: the gate's, re-planned from the same parameters if the logits
        shard's shape differs from the one it assumed), so nothing here reads the device.
        The verifier's ``last_plan`` is set to the plan it ran."""
        import torch
        from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected
        from vllm.v1.worker.gpu.sample.output import SamplerOutput
        from vllm.v1.worker.gpu.spec_decode.rejection_sampler import gather_draft_sampled

        from vllm_kimi_ext.comm import phase

        from .gate import request_params

        runner = self.runner
        sampler = runner.sampler
        states = sampler.sampling_states
        draft_sampled, pos = gather_draft_sampled(
            input_batch.input_ids, input_batch.positions, input_batch.logits_indices,
            input_batch.expanded_idx_mapping, input_batch.expanded_local_pos,
            sampler.req_states.prefill_len.gpu)
        width = runner.rejection_sampler.num_speculative_steps + 1
        cache = runner.speculator.draft_logits
        with phase("verify"):
            local = runner.model.compute_logits_local(hidden_states[input_batch.logits_indices])
            verifier = self.verifier(int(local.shape[-1]))
            V = verifier.vocab_size
            inp = step_inputs(input_batch, states, draft_sampled, pos, V)
            shape = (int(local.shape[0]), int(local.shape[-1]), local.element_size())
            if plan is None or (plan.num_rows, plan.shard_width, plan.logits_bytes) != shape:
                plan = plan_from_params(
                    request_params(sampler, input_batch.idx_mapping_np),
                    tp_size=verifier.tp_size, vocab_size=V, num_rows=shape[0],
                    max_rows_per_req=width, shard_width=shape[1], logits_bytes=shape[2],
                    probabilistic=cache is not None)
                if isinstance(plan, Fallback):  # the gate accepted the same parameters
                    raise RuntimeError(f"sharded verification re-planned to a fallback: {plan}")
            out = verifier(local, inp, plan, draft_q(cache, input_batch, states, V))
            self.telemetry.count_on_device(out)
            verifier.last_plan = plan
        sampled = out.sampled
        if sampled.shape[1] < width:
            pad = sampled.new_full((sampled.shape[0], width - sampled.shape[1]), -1)
            sampled = torch.cat([sampled, pad], dim=1)
        num_sampled, num_rejected = get_num_sampled_and_rejected(
            out.num_sampled.to(torch.int32), input_batch.seq_lens, input_batch.cu_num_logits,
            input_batch.idx_mapping, sampler.req_states.prefill_len.gpu)
        so = SamplerOutput(sampled_token_ids=sampled.to(torch.int64), logprobs_tensors=None,
                           num_nans=None, num_sampled=num_sampled, num_rejected=num_rejected,
                           sampling_mask_tensors=None)
        return so, num_sampled, num_rejected

    # --- the verifier and its graphs ------------------------------------------------
    def verifier(self, shard_width: int):
        """The verifier for the lm_head's (padded) vocab shard: StepGraphs (graphs captured
        by :meth:`warm_up`) or the step run eagerly (``VLLM_KIMI_EXT_SHARDED_VERIFY_GRAPHS
        =0``), made once per shard width."""
        if shard_width not in self.verifiers:
            from vllm_kimi_ext import envs
            from vllm_kimi_ext.verify.graph_step import StepGraphs

            step = self.new_step(shard_width)
            k = self.runner.rejection_sampler.num_speculative_steps
            self.verifiers[shard_width] = (
                StepGraphs(step, max_reqs=self.max_reqs(), rows_per_req=k + 1, log=logger)
                if envs.SHARDED_VERIFY_GRAPHS.get() else EagerStep(step))
        return self.verifiers[shard_width]

    def new_step(self, shard_width: int):
        """This rank's :class:`~vllm_kimi_ext.verify.graph_step.GraphVerifyStep` over vLLM's
        TP group."""
        from vllm.distributed import get_tensor_model_parallel_rank, get_tp_group

        from vllm_kimi_ext.verify.graph_step import GraphVerifyStep
        from vllm_kimi_ext.verify.ranks import group_coordinator_all_gather

        return GraphVerifyStep(self.runner.model_config.get_vocab_size(),
                               get_tp_group().world_size, get_tensor_model_parallel_rank(),
                               group_coordinator_all_gather(get_tp_group()),
                               shard_width=shard_width)

    def max_reqs(self) -> int:
        """Requests of the largest verification step (``max_num_seqs``, 256 if unknown)."""
        config = getattr(self.runner, "scheduler_config", None)
        return int(getattr(config, "max_num_seqs", None) or 256)

    def warm_up(self) -> int:
        """Capture the verification graphs before serving (called after vLLM's own
        ``capture_model``, on every rank in the same order). Returns how many were
        captured (0 when the step would not run sharded: TP = 1, no speculation, graphs
        off, or a vLLM attribute in :data:`WARM_UP_ATTRIBUTES` missing)."""
        try:
            return self._warm_up()
        except AttributeError as e:
            logger.warning("vllm-kimi-ext sharded verification: no verification graphs "
                           "captured (%s); every sharded step runs eagerly (counted "
                           "not_warmed_up)", e)
            return 0

    def _warm_up(self) -> int:
        import torch
        from vllm.distributed import get_tp_group

        from vllm_kimi_ext import envs

        runner = self.runner
        if (get_tp_group().world_size <= 1 or runner.rejection_sampler is None
                or not envs.SHARDED_VERIFY_GRAPHS.get()
                or not hasattr(runner.model, "compute_logits_local")):
            return 0
        hidden = torch.zeros(1, runner.model_config.get_hidden_size(),
                             dtype=runner.model_config.dtype, device=runner.device)
        with torch.inference_mode():
            local = runner.model.compute_logits_local(hidden)
        graphs = self.verifier(int(local.shape[-1]))
        cache = runner.speculator.draft_logits
        n = graphs.warm_up(local.dtype, local.device, probabilistic=cache is not None,
                           q_width=runner.model_config.get_vocab_size())
        logger.info("vllm-kimi-ext sharded verification: %d verification graphs captured "
                    "(%d request counts up to %d, k + 1 = %d rows each)", n,
                    len(graphs.capture_sizes), graphs.max_reqs, graphs.rows_per_req)
        return n

    def graph_counts(self) -> dict[str, int]:
        """Steps replayed from a captured graph and steps run without one (per reason)."""
        out: dict[str, int] = {"replayed": 0}
        for v in self.verifiers.values():
            out["replayed"] += getattr(v, "replayed", 0)
            for reason, n in getattr(v, "uncaptured", {}).items():
                out[f"uncaptured_{reason}"] = out.get(f"uncaptured_{reason}", 0) + n
        return out
