"""vllm_kimi_ext.runtime inside vLLM 0.34.0 (in-process, CPU): every patch class
installs together with the others, reverts to vLLM's own attributes, and its body
hands vLLM's call to the product function it names; the plugin registers its
environment variables so vLLM's own check does not call them unknown."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.vllm

ALL_FLAGS = {"VLLM_KIMI_EXT_COUNT_COLLECTIVES": "5", "VLLM_KIMI_EXT_CHECK_DRAFT_AGREEMENT": "on",
             "VLLM_KIMI_EXT_SHARDED_VERIFY": "true"}


class Sentinel(Exception):
    pass


@pytest.fixture
def clean_runtime():
    """No runtime patch applied before or after (a CollectiveCounter installs one)."""
    from vllm_kimi_ext import runtime

    runtime.revert_all()
    yield runtime
    runtime.revert_all()


def test_every_patch_installs_together_and_reverts_to_vllms_attributes(clean_runtime,
                                                                       monkeypatch):
    runtime = clean_runtime
    classes = [runtime.resolve(d.ref) for d in runtime.declared_patches()]
    before = {(c.__name__, a): c._target.__dict__.get(a) for c in classes
              for a in c.replacements()}
    for name, value in ALL_FLAGS.items():
        monkeypatch.setenv(name, value)
    applied = runtime.apply_all()
    assert sorted(applied) == sorted(c.__name__ for c in classes)
    assert runtime.apply_all() == []  # re-entrant
    from vllm_kimi_ext.comm import active_counter

    assert active_counter() is not None  # live counting started
    for (cls_name, attr), original in before.items():
        cls = next(c for c in classes if c.__name__ == cls_name)
        assert cls._target.__dict__.get(attr) is not original, f"{cls_name}.{attr}"
    assert sorted(runtime.revert_all()) == sorted(applied)
    assert active_counter() is None
    for (cls_name, attr), original in before.items():
        cls = next(c for c in classes if c.__name__ == cls_name)
        assert cls._target.__dict__.get(attr) is original, f"{cls_name}.{attr} not restored"


def test_group_coordinator_patch_covers_every_counted_collective():
    from vllm_kimi_ext.comm import COLLECTIVE_METHODS
    from vllm_kimi_ext.runtime.group_coordinator import GroupCoordinatorCounting

    assert set(GroupCoordinatorCounting.replacements()) == set(COLLECTIVE_METHODS)


def test_step_counting_labels_the_draft_then_runs_vllms_execute_model(monkeypatch):
    from vllm_kimi_ext.comm import accounting
    from vllm_kimi_ext.runtime.gpu_model_runner import GPUModelRunnerStepCounting as P

    calls = []
    monkeypatch.setattr(accounting, "label_draft_phase", lambda r: calls.append(r))
    runner = SimpleNamespace()  # vLLM's execute_model then fails on the stand-in
    with pytest.raises(AttributeError):
        P.__dict__["execute_model"](runner, None)
    assert calls == [runner]


def test_step_counting_reports_each_finished_step(monkeypatch):
    from vllm_kimi_ext.comm import accounting
    from vllm_kimi_ext.runtime.gpu_model_runner import GPUModelRunnerStepCounting as P

    steps = []
    monkeypatch.setattr(accounting, "live_step_done", lambda: steps.append(1))
    # vLLM's sample_tokens returns None at once when the prior execute_model failed
    runner = SimpleNamespace(execute_model_state=None,
                             eplb=SimpleNamespace(step=lambda **kw: None))
    assert P.__dict__["sample_tokens"](runner, None) is None
    assert steps == [1]


def test_label_draft_phase_labels_propose_once(clean_runtime):
    from vllm_kimi_ext.comm import CollectiveCounter, accounting

    seen = []
    spec = SimpleNamespace()
    spec.propose = lambda *a: seen.append(accounting.active_counter().current_phase)
    runner = SimpleNamespace(speculator=spec)
    with CollectiveCounter():
        accounting.label_draft_phase(runner)
        accounting.label_draft_phase(runner)  # not wrapped twice
        spec.propose()
        assert accounting.active_counter().current_phase == "target"
    assert seen == ["draft"]
    assert spec.propose.__wrapped__.__name__ == "<lambda>"


def test_verify_phase_label_is_active_inside_vllms_rejection_sampler(clean_runtime,
                                                                   monkeypatch):
    import vllm.v1.worker.gpu.spec_decode.rejection_sampler as rs

    from vllm_kimi_ext.comm import CollectiveCounter, accounting
    from vllm_kimi_ext.runtime.rejection_sampler import RejectionSamplerVerifyPhase as P

    seen = []

    def first_call_inside(logits):
        seen.append(accounting.active_counter().current_phase)
        raise Sentinel

    monkeypatch.setattr(rs, "get_num_nans", first_call_inside)
    sampler = SimpleNamespace(sampler=SimpleNamespace(compute_nans=True))
    with CollectiveCounter(), pytest.raises(Sentinel):
        P.__dict__["__call__"](sampler, torch.zeros(1, 4), None)
    assert seen == ["verify"]


def test_sampler_patch_remembers_params_then_runs_vllms_add_request(monkeypatch):
    from vllm_kimi_ext.runtime.sampler import SamplerRememberParams as P
    from vllm_kimi_ext.verify import vllm_runner

    sampler = SimpleNamespace(sampling_states=SimpleNamespace(add_request=_raise))
    with pytest.raises(Sentinel):  # vLLM's add_request reached its first line
        P.__dict__["add_request"](sampler, 3, "params-3")
    assert vllm_runner.request_params(sampler, np.array([3])) == ["params-3"]


def _raise(*_a, **_k):
    raise Sentinel


def test_sharded_verify_patch_hands_vllms_sample_to_sample_step(monkeypatch):
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    from vllm_kimi_ext.runtime.gpu_model_runner import GPUModelRunnerShardedVerify as P
    from vllm_kimi_ext.verify import vllm_runner

    got = []
    monkeypatch.setattr(vllm_runner, "sample_step", lambda *a: got.append(a) or "out")
    assert P.__dict__["sample"]("runner", "h", "batch", "grammar") == "out"
    assert got == [("runner", GPUModelRunner.sample, "h", "batch", "grammar")]


def _runner(params, *, tp_vocab=1000):
    sampler = SimpleNamespace(
        get_logprobs_dims=lambda idx: None, return_sampling_mask=False, compute_nans=False,
        trace_replay_state=None, logits_processors=[object()] * 3)
    for i, p in enumerate(params):
        from vllm_kimi_ext.verify import vllm_runner

        vllm_runner.remember_sampling_params(sampler, i, p)
    return SimpleNamespace(
        rejection_sampler=SimpleNamespace(use_block_verification=False, fly_window_size=0,
                                          synthetic_conditional_rates=None,
                                          watermark_key=None),
        batch_sharder=None, model=SimpleNamespace(compute_logits_local=lambda h: h),
        speculator=SimpleNamespace(draft_logits=None), sampler=sampler,
        model_config=SimpleNamespace(get_vocab_size=lambda: tp_vocab))


@pytest.fixture
def tp8(monkeypatch):
    import vllm.distributed as dist

    monkeypatch.setattr(dist, "get_tp_group", lambda: SimpleNamespace(world_size=8))
    monkeypatch.setattr(dist, "get_tensor_model_parallel_rank", lambda: 0)


def test_sample_step_runs_stock_sample_and_counts_an_ineligible_step(tp8, monkeypatch):
    from vllm_kimi_ext.verify import vllm_runner

    monkeypatch.setattr(vllm_runner, "sharded_sample", _raise)
    before = vllm_runner.FALLBACKS.as_dict().get("top_p", 0)
    runner = _runner([{"temperature": 1.0, "top_p": 0.9}])
    batch = SimpleNamespace(num_draft_tokens=2, idx_mapping_np=np.arange(1))
    stock = []
    out = vllm_runner.sample_step(runner, lambda *a: stock.append(a) or "stock", "h", batch,
                                  None)
    assert out == "stock" and stock == [(runner, "h", batch, None)]
    assert vllm_runner.FALLBACKS.as_dict()["top_p"] == before + 1


def test_sample_step_does_not_count_a_step_without_drafts(tp8, monkeypatch):
    from vllm_kimi_ext.verify import vllm_runner

    before = vllm_runner.FALLBACKS.as_dict()
    batch = SimpleNamespace(num_draft_tokens=0, idx_mapping_np=np.arange(1))
    out = vllm_runner.sample_step(_runner([{"temperature": 0.0}]), lambda *a: "stock", "h",
                                  batch, None)
    assert out == "stock" and vllm_runner.FALLBACKS.as_dict() == before


def test_sample_step_verifies_an_eligible_step_over_shards(tp8, monkeypatch):
    from vllm_kimi_ext.verify import sharded, vllm_runner

    monkeypatch.setattr(sharded, "group_coordinator_all_gather", lambda group: "gather")
    made = []

    def fake_sharded_sample(runner, hidden, batch, make_verifier):
        made.append(make_verifier(125))
        made.append(make_verifier(125))  # cached per shard width
        return "sharded"

    monkeypatch.setattr(vllm_runner, "sharded_sample", fake_sharded_sample)
    batch = SimpleNamespace(num_draft_tokens=3, idx_mapping_np=np.arange(2))
    runner = _runner([{"temperature": 0.0}, {"temperature": 0.8, "top_k": 20}])
    out = vllm_runner.sample_step(runner, _raise, "h", batch, None)
    assert out == "sharded"
    assert made[0] is made[1] and made[0].shard_width == 125 and made[0].tp_size == 8


def test_registered_variables_pass_vllms_environment_check(monkeypatch):
    import vllm.envs as vllm_envs
    from vllm.platforms import current_platform

    from vllm_kimi_ext import envs, plugin

    monkeypatch.setattr(vllm_envs, "environment_variables",
                        dict(vllm_envs.environment_variables))
    for name in [k for k in __import__("os").environ if k.startswith("VLLM_KIMI_EXT")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("VLLM_KIMI_EXT", "1")
    monkeypatch.setenv("VLLM_KIMI_EXT_SHARDED_VERIFY", "1")
    with pytest.raises(ValueError, match="Unknown vLLM environment variable detected: "
                                         "VLLM_KIMI_EXT"):
        current_platform.validate_environ(hard_fail=True)  # vLLM's own check, stock
    assert sorted(plugin.register_env_vars()) == sorted(f.name for f in envs.FLAGS)
    assert plugin.register_env_vars() == []  # re-entrant
    current_platform.validate_environ(hard_fail=True)  # no longer unknown
    assert vllm_envs.VLLM_KIMI_EXT_SHARDED_VERIFY is True  # vLLM reads them our way
    monkeypatch.setenv("VLLM_KIMI_EXT_TYPO", "1")
    with pytest.raises(ValueError, match="VLLM_KIMI_EXT_TYPO"):  # a typo is still named
        current_platform.validate_environ(hard_fail=True)
