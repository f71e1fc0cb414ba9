"""Canaries for what the long-run training and the evaluation modes rely on upstream:
vLLM 0.34.0 drafts greedily unless ``draft_sample_method`` says otherwise (the docs'
serve command sets ``"probabilistic"``; ``draft eval`` reports both), and speculators
0.9.0's distributed setup and per-rank packing sampler (``vllm_kimi_ext.train.runstate``,
``trainer.make_sampler``). A failure names the code to revisit."""

from __future__ import annotations

import inspect
import typing

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.canary]


def test_vllm_drafts_greedily_by_default_and_accepts_probabilistic():
    from vllm.config import speculative

    fields = speculative.SpeculativeConfig.__dataclass_fields__
    assert fields["draft_sample_method"].default == "greedy"
    assert {"greedy", "probabilistic"} <= set(typing.get_args(speculative.DraftSampleMethod))


def test_speculators_distributed_setup_and_sampler():
    pytest.importorskip("speculators")
    from speculators.train import distributed
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    for name in ("maybe_setup_distributed", "maybe_destroy_distributed", "get_rank",
                 "get_world_size", "get_local_rank"):
        assert callable(getattr(distributed, name)), name
    params = inspect.signature(MultipackDistributedBatchSamplerV2).parameters
    assert {"batch_max_length", "lengths", "num_replicas", "rank", "seed"} <= set(params)
    assert callable(MultipackDistributedBatchSamplerV2.set_epoch)
    # every rank gets the same number of batches (DDP steps in lockstep)
    lengths = [5, 9, 3, 7, 8, 2, 6, 4, 9]
    counts = {len(MultipackDistributedBatchSamplerV2(12, lengths, 2, r, seed=1))
              for r in (0, 1)}
    assert len(counts) == 1
