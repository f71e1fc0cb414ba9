"""Canaries: the vLLM 0.34.0 symbols this project's runtime patches and harness
rely on. When one fails after an upgrade, the named compatibility code is what
must be revisited (or can be deleted)."""

from __future__ import annotations

import inspect

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.canary]


def test_group_coordinator_collectives_exist():
    """vllm_kimi_ext.comm.accounting wraps these methods."""
    from vllm.distributed.parallel_state import GroupCoordinator

    from vllm_kimi_ext.comm import COLLECTIVE_METHODS

    present = [m for m in COLLECTIVE_METHODS if hasattr(GroupCoordinator, m)]
    for core in ("all_reduce", "all_gather", "gather", "reduce_scatter", "broadcast"):
        assert core in present
    from vllm_kimi_ext.runtime.group_coordinator import GroupCoordinatorCounting

    # vLLM's own method, whether or not a CollectiveCounter installed the counting patch
    assert "world_size" in inspect.getsource(GroupCoordinatorCounting.original("all_reduce"))


def test_tp_wrappers_route_through_group_coordinator():
    """Counting at GroupCoordinator level sees tensor_model_parallel_* calls."""
    from vllm.distributed import communication_op

    src = inspect.getsource(communication_op.tensor_model_parallel_all_reduce)
    assert "get_tp_group().all_reduce" in src


def test_cpu_platform_triton_gate_still_exists():
    """testkit.vllm_cpu.cpu_config_without_triton_cpu targets this
    check; delete the workaround when upstream stops requiring triton-cpu."""
    from vllm.platforms.cpu import CpuPlatform

    src = inspect.getsource(CpuPlatform.check_and_update_config)
    assert "from vllm.triton_utils import HAS_TRITON" in src


def test_cpu_moe_ops_signature():
    """testkit.cpu_stand_ins mirrors these op signatures."""
    from vllm import _cpu_ops

    src = inspect.getsource(_cpu_ops.cpu_fused_moe)
    assert "torch.ops._C.cpu_fused_moe" in src and "skip_weighted" in src
    assert "torch.ops._C.prepack_moe_weight" in inspect.getsource(
        _cpu_ops.cpu_prepack_moe_weight)


def test_vllm_is_pinned_version():
    import vllm

    from vllm_kimi_ext import PINNED_VLLM_VERSION

    assert vllm.__version__.split("+")[0] == PINNED_VLLM_VERSION


def test_sharded_verify_runner_hooks():
    """vllm_kimi_ext.integration.sharded_verify relies on these 0.34.0 internals (the patched
    attributes themselves: test_runtime_patch_targets.py)."""
    import dataclasses

    from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected  # noqa: F401
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.gpu.sample.output import SamplerOutput
    from vllm.v1.worker.gpu.sample.sampler import Sampler
    from vllm.v1.worker.gpu.sample.states import SamplingStates
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import gather_draft_sampled  # noqa

    assert list(inspect.signature(GPUModelRunner.sample).parameters) == [
        "self", "hidden_states", "input_batch", "grammar_output"]
    assert list(inspect.signature(Sampler.add_request).parameters) == [
        "self", "req_idx", "sampling_params"]
    fields = {f.name for f in dataclasses.fields(SamplerOutput)}
    assert {"sampled_token_ids", "num_sampled", "num_rejected", "logprobs_tensors"} <= fields
    src = inspect.getsource(SamplingStates.__init__)
    for name in ("temperature", "top_k", "top_p", "min_p", "seeds"):
        assert f"self.{name} =" in src
