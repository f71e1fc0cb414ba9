"""Exact speculative-decoding verification over vocabulary shards.

Pure torch plus Triton kernels (Triton imported only where a Triton path runs); vLLM is
never imported here: the glue that runs inside vLLM's model runner is
:mod:`vllm_kimi_ext.integration.sharded_verify`.

* :mod:`.step_plan`: the host-side plan of a step, :func:`plan_from_params` →
  :class:`StepPlan` (shapes and rounds) or :class:`Fallback` (the full logits gather,
  with its reason: logprobs, penalties, structured output, ...), and the step's device
  inputs :class:`StepInputs`;
* :mod:`.graph_step`: :class:`GraphVerifyStep`, the product's verifier (one rank, a
  fixed sequence of launches and all-gathers: greedy, temperature, top-k, min-p, top-p
  and probabilistic drafts), and :class:`StepGraphs`, its CUDA graphs captured at
  warm-up for a fixed list of padded row counts;
* :mod:`.step_torch` / :mod:`._graph_kernels` / :mod:`._escalate_kernels`: the torch and
  Triton implementations of the step's stages (one rule picks one,
  :func:`.ranks.use_triton`); :mod:`.kernels` / :mod:`._triton_kernels`: the fused
  shard statistics and the shared Triton helpers; :mod:`.step_hist`: the histogram
  escalation (``StepPlan.escalation == "hist"``: the exact top-p / min-p cut of bf16 rows
  from three small all-gathers instead of whole shard rows; opt-in: measured slower on a
  GPU than the whole-row default);
* :mod:`.ranks`: the shard geometry and the ``all_gather`` adapters
  (``torch.distributed``, vLLM's ``GroupCoordinator``, a counting wrapper);
* :mod:`.reference`: :class:`ReferenceVerifier`, vLLM's standard rejection rules on full
  ``[rows, V]`` logits, the oracle of every test; :mod:`.hashing`: the counter-based
  noise both sides share; :mod:`.batch`: the reference's batch layout.
"""

from .batch import VerifyBatch, VerifyOutput
from .graph_step import GraphVerifyStep, StepGraphs
from .ranks import (
    CountingAllGather,
    full_gather_bytes_per_row,
    group_coordinator_all_gather,
    torch_distributed_all_gather,
)
from .reference import ReferenceVerifier
from .step_plan import (
    Fallback,
    FallbackCounter,
    StepInputs,
    StepOutput,
    StepPlan,
    plan_from_params,
)

__all__ = [
    "CountingAllGather",
    "Fallback",
    "FallbackCounter",
    "GraphVerifyStep",
    "ReferenceVerifier",
    "StepGraphs",
    "StepInputs",
    "StepOutput",
    "StepPlan",
    "VerifyBatch",
    "VerifyOutput",
    "full_gather_bytes_per_row",
    "group_coordinator_all_gather",
    "plan_from_params",
    "torch_distributed_all_gather",
]
