"""Exact speculative-decoding verification over vocabulary shards.

Pure torch (Triton optional, imported lazily; vLLM never imported):

* :mod:`.reference`: :class:`ReferenceVerifier`, vLLM's standard rejection rules
  on full ``[rows, V]`` logits;
* :mod:`.sharded`: :class:`VocabShardedVerifier`, the same decisions from one
  vocabulary shard per rank plus one small all-gather (see its docstring for
  the proof sketch and :func:`comm_plan` for the bytes);
* :mod:`.kernels`: the fused shard-local statistics (Triton on CUDA, fused torch
  elsewhere); :mod:`.hashing`: the counter-based noise both sides share;
* :mod:`.plan`: when to fall back to the full gather (top-p, logprobs, ...).
"""

from .batch import VerifyBatch, VerifyOutput
from .plan import Fallback, FallbackCounter, ShardedPlan, plan_verification
from .reference import ReferenceVerifier
from .sharded import (
    BatchModes,
    CommPlan,
    CountingAllGather,
    VocabShardedVerifier,
    comm_plan,
    group_coordinator_all_gather,
    torch_distributed_all_gather,
)

__all__ = [
    "BatchModes",
    "CommPlan",
    "CountingAllGather",
    "Fallback",
    "FallbackCounter",
    "ReferenceVerifier",
    "ShardedPlan",
    "VerifyBatch",
    "VerifyOutput",
    "VocabShardedVerifier",
    "comm_plan",
    "group_coordinator_all_gather",
    "plan_verification",
    "torch_distributed_all_gather",
]
