"""Canary: the vLLM 0.34.0 facts behind the cost model's price of
``--enable-batch-sharded-sampling`` (``vllm_kimi_ext/costmodel/verify_cost.py``) and the
comparison in docs/sharded-verification.md. When one fails after an upgrade, revisit
``price_batch_sharded`` and that section."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from vllm_kimi_ext.costmodel import verify_cost

pytestmark = [pytest.mark.vllm, pytest.mark.canary]


def test_requests_are_owned_round_robin_so_batch_1_has_one_owner():
    from vllm.v1.worker.gpu.sample.batch_shard import shard_owners

    assert shard_owners(1, 8).tolist() == [0]
    assert np.bincount(shard_owners(17, 8), minlength=8).max() == 3  # ceil(17 / 8)


def test_one_all_to_all_of_vocab_shards_then_one_packed_all_gather():
    from vllm.v1.worker.gpu.sample import batch_shard

    a2a = inspect.getsource(batch_shard.all_to_all_vocab_shards)
    assert "all_to_all_single" in a2a
    gather = inspect.getsource(batch_shard.gather_sampler_output)
    # k + 1 token ids, num_sampled, num_rejected (+ nan count) per request, int64
    assert (f"max_num_logits_per_req + {verify_cost.BATCH_SHARD_EXTRA_COLUMNS} "
            "+ (1 if gather_num_nans else 0)") in gather
    assert "dtype=torch.int64" in gather
    assert gather.count("tensor_model_parallel_all_gather(") == 1


def test_the_verify_step_runs_on_the_owner_inside_the_sharded_path():
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    src = inspect.getsource(GPUModelRunner.sample)
    order = [src.index(s) for s in ("shard_sampler_inputs(", "all_to_all_vocab_shards(",
                                    "self.rejection_sampler(", "gather_sampler_output(")]
    assert order == sorted(order)


def test_the_flag_needs_max_num_seqs_of_at_least_tp():
    from vllm.config.vllm import VllmConfig

    src = inspect.getsource(VllmConfig._validate_batch_sharded_sampling)
    assert "self.scheduler_config.max_num_seqs < tp_size" in src
