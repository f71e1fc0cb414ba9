"""Exact speculative-decoding verification over vocabulary shards.

The names below are loaded on first use, so ``import vllm_kimi_ext.verify.protocol`` (the
cost model does) does not import torch.

Pure torch plus Triton kernels (Triton imported only where a Triton path runs); vLLM is
never imported here: the glue that runs inside vLLM's model runner is
:mod:`vllm_kimi_ext.integration.sharded_verify`.

* :mod:`.protocol`: the step's contract, torch-free (the cost model and the runner's gate
  import it too): :func:`plan_from_params` → :class:`StepPlan` (shapes and rounds) or
  :class:`Fallback` (the full logits gather, with its reason: logprobs, penalties,
  structured output, ...), the round sizes and the escalation kinds;
* :mod:`.step_io`: the step's device inputs :class:`StepInputs`, round 1's merged
  statistics ``Merged`` and the outputs :class:`StepOutput`;
* :mod:`.graph_step`: :class:`GraphVerifyStep`, the product's verifier (one rank, a
  fixed sequence of launches and all-gathers: greedy, temperature, top-k, min-p, top-p
  and probabilistic drafts), and :class:`StepGraphs`, its CUDA graphs captured at
  warm-up for a fixed list of padded row counts;
* the step's rounds, each one module with its torch body and its Triton launcher side by
  side: :mod:`.stats` (round 1's shard pass), :mod:`.merge`, :mod:`.escalate` (one module
  per escalation kind, :data:`.escalate.VARIANTS`), :mod:`.decide` and :mod:`.residual`;
  :mod:`.shard_stats`: the fused shard statistics two rounds use; :mod:`.rowmath`: the row
  math the rounds share (the product's only: the oracle computes its own);
* :mod:`.backend`: the one backend switch (:func:`.backend.use_triton`) and the Triton
  kernels' one availability guard; :mod:`._kernels`: the Triton kernels, by round;
* :mod:`.ranks`: the shard geometry and the ``all_gather`` adapters
  (``torch.distributed``, vLLM's ``GroupCoordinator``, a counting wrapper);
* :mod:`.reference`: :class:`ReferenceVerifier`, vLLM's standard rejection rules on full
  ``[rows, V]`` logits, the oracle of every test; :mod:`.hashing`: the counter-based
  noise both sides share; :mod:`.batch`: the reference's batch layout.
"""

_EXPORTS = {
    "VerifyBatch": "batch", "VerifyOutput": "batch",
    "GraphVerifyStep": "graph_step", "StepGraphs": "graph_step",
    "CountingAllGather": "ranks", "full_gather_bytes_per_row": "ranks",
    "group_coordinator_all_gather": "ranks", "torch_distributed_all_gather": "ranks",
    "ReferenceVerifier": "reference",
    "Fallback": "protocol", "FallbackCounter": "protocol", "StepPlan": "protocol",
    "plan_from_params": "protocol",
    "StepInputs": "step_io", "StepOutput": "step_io",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
