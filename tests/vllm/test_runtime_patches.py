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
             "VLLM_KIMI_EXT_SHARDED_VERIFY": "true", "VLLM_KIMI_EXT_REPLICATE_DRAFT_EMBEDDING": "1"}


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


def test_step_counting_labels_sample_tokens_verify(monkeypatch, clean_runtime):
    """The logits all-gather inside vLLM's ``sample_tokens`` counts as ``verify`` (as in
    the cost model), not as ``target``."""
    from vllm_kimi_ext.comm import CollectiveCounter, accounting
    from vllm_kimi_ext.runtime.gpu_model_runner import GPUModelRunnerStepCounting as P

    seen = []
    monkeypatch.setattr(accounting, "live_step_done", lambda: None)
    monkeypatch.setattr(P, "original", classmethod(lambda cls, name: lambda *a, **k: seen.append(
        accounting.active_counter().current_phase)))
    with CollectiveCounter():
        P.__dict__["sample_tokens"](SimpleNamespace(), None)
    assert seen == ["verify"]


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
    from vllm_kimi_ext.integration import sharded_verify as vllm_runner
    from vllm_kimi_ext.runtime.sampler import SamplerRememberParams as P

    sampler = SimpleNamespace(sampling_states=SimpleNamespace(add_request=_raise))
    with pytest.raises(Sentinel):  # vLLM's add_request reached its first line
        P.__dict__["add_request"](sampler, 3, "params-3")
    assert vllm_runner.request_params(sampler, np.array([3])) == ["params-3"]


def _raise(*_a, **_k):
    raise Sentinel


def test_sharded_verify_patch_hands_vllms_sample_to_sample_step(monkeypatch):
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    from vllm_kimi_ext.integration import sharded_verify as vllm_runner
    from vllm_kimi_ext.runtime.gpu_model_runner import GPUModelRunnerShardedVerify as P

    got = []
    monkeypatch.setattr(vllm_runner, "sample_step", lambda *a: got.append(a) or "out")
    assert P.__dict__["sample"]("runner", "h", "batch", "grammar") == "out"
    assert got == [("runner", GPUModelRunner.sample, "h", "batch", "grammar")]


def test_capture_model_patch_warms_the_verification_graphs_up(monkeypatch):
    """vLLM's capture first, then the verification graphs; never in a profiling capture;
    a vLLM attribute the warm-up reads missing: nothing captured, logged, no crash."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    from vllm_kimi_ext.integration import sharded_verify as vllm_runner
    from vllm_kimi_ext.runtime.gpu_model_runner import GPUModelRunnerShardedVerify as P

    calls = []
    monkeypatch.setattr(GPUModelRunner, "capture_model",
                        lambda self, **kw: calls.append(("vllm", kw)) or 7)
    monkeypatch.setattr(P, "original", staticmethod(lambda name: getattr(GPUModelRunner, name)))
    monkeypatch.setattr(vllm_runner, "warm_up", lambda runner: calls.append(("ours", runner)))
    assert P.__dict__["capture_model"]("runner") == 7
    assert P.__dict__["capture_model"]("runner", profile_only=True) == 7
    assert calls == [("vllm", {}), ("ours", "runner"), ("vllm", {"profile_only": True})]
    monkeypatch.undo()

    class Broken:  # no rejection_sampler, model, ... (an upstream rename)
        pass

    monkeypatch.setattr("vllm.distributed.get_tp_group", lambda: type("G", (), {"world_size": 2}))
    assert vllm_runner.warm_up(Broken()) == 0


def _runner(params, *, tp_vocab=1000):
    from testkit.runner_stand_ins import stand_in_runner

    return stand_in_runner(params, vocab=tp_vocab)


def _batch(num_reqs, num_draft_tokens=3):
    from testkit.runner_stand_ins import stand_in_batch

    return stand_in_batch(num_reqs, num_draft_tokens)


@pytest.fixture
def tp8(monkeypatch):
    import vllm.distributed as dist

    monkeypatch.setattr(dist, "get_tp_group", lambda: SimpleNamespace(world_size=8))
    monkeypatch.setattr(dist, "get_tensor_model_parallel_rank", lambda: 0)


@pytest.fixture
def stock_sample(monkeypatch):
    """vLLM's ``GPUModelRunner.sample`` replaced by a recorder: the patch body (not
    applied) reaches it through ``GPUModelRunnerShardedVerify.original("sample")``."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    calls = []
    monkeypatch.setattr(GPUModelRunner, "sample",
                        lambda *a: calls.append(a) or "stock", raising=True)
    return calls


def _patched_sample(runner, batch, grammar=None):
    from vllm_kimi_ext.runtime.gpu_model_runner import GPUModelRunnerShardedVerify as P

    return P.__dict__["sample"](runner, "h", batch, grammar)


@pytest.mark.parametrize("params,extra,reason", [
    ([{"temperature": 1.0, "top_p": 0.95, "logprobs": 5}], None, "logprobs"),
    ([{"temperature": 1.0, "top_p": 0.95, "presence_penalty": 0.5}], None, "penalties"),
    ([{"temperature": 0.6, "top_p": 0.95}], "fourth_processor", "logits_processors"),
    ([{"temperature": 1.0, "top_p": 0.95}], "missing_attribute", "unknown_vllm_state"),
])
def test_patched_sample_runs_stock_and_counts_a_top_p_fallback(tp8, stock_sample, monkeypatch,
                                                               params, extra, reason):
    """A top-p step that must fall back: vLLM's sample runs with the runner's own
    arguments, the sharded path does not, and the reason is counted once."""
    from testkit.runner_stand_ins import stand_in
    from vllm_kimi_ext.integration import sharded_verify as vllm_runner

    monkeypatch.setattr(vllm_runner, "sharded_sample", _raise)
    runner, batch = _runner(params), _batch(1)
    if extra == "fourth_processor":
        runner.sampler.logits_processors.append(stand_in("my_plugin.BanTokens"))
    if extra == "missing_attribute":
        del runner.sampler.trace_replay_state
    before = vllm_runner.FALLBACKS.as_dict()
    assert _patched_sample(runner, batch) == "stock"
    assert stock_sample == [(runner, "h", batch, None)]
    after = vllm_runner.FALLBACKS.as_dict()
    assert after.get(reason, 0) == before.get(reason, 0) + 1
    assert sum(after.values()) == sum(before.values()) + 1


def test_patched_sample_verifies_a_kimi_top_p_step_sharded(tp8, stock_sample, monkeypatch):
    """T=1.0 and T=0.6 with top_p 0.95 (Kimi's recommended settings): sharded, uncounted."""
    from vllm_kimi_ext.integration import sharded_verify as vllm_runner

    seen = []
    monkeypatch.setattr(vllm_runner, "sharded_sample",
                        lambda r, h, b, make, plan: seen.append((make(125).tp_size,
                                                                  plan.escalation_slots))
                        or "sharded")
    before = vllm_runner.FALLBACKS.as_dict()
    runner = _runner([{"temperature": 1.0, "top_p": 0.95}, {"temperature": 0.6, "top_p": 0.95}])
    assert _patched_sample(runner, _batch(2)) == "sharded"
    assert seen == [(8, 2)] and stock_sample == []  # the gate's plan: one slot per request
    assert vllm_runner.FALLBACKS.as_dict() == before


def test_with_the_batch_sharder_a_large_top_p_step_runs_vllms_sample(tp8, stock_sample,
                                                                    monkeypatch):
    """Both on: a Kimi T=1.0 top-p step of 32 requests (priced faster batch-sharded at
    k = 3) runs vLLM's own sample (which shards it by batch), counted as handed over and
    not as a fallback; one of 2 requests and a greedy one of 32 run sharded."""
    from vllm_kimi_ext.integration import sharded_verify as vllm_runner

    monkeypatch.delenv("VLLM_KIMI_EXT_SHARDED_VERIFY_HANDOFF", raising=False)
    monkeypatch.setattr(vllm_runner, "sharded_sample", lambda *a: "sharded")
    monkeypatch.setitem(vllm_runner._state, "handed", 0)
    before = vllm_runner.FALLBACKS.as_dict()

    def run(params):
        runner = _runner(params)
        runner.batch_sharder = object()
        return _patched_sample(runner, _batch(len(params)))

    assert run([{"temperature": 1.0, "top_p": 0.95}] * 32) == "stock"
    assert len(stock_sample) == 1 and vllm_runner._state["handed"] == 1
    assert run([{"temperature": 1.0, "top_p": 0.95}] * 2) == "sharded"
    assert run([{"temperature": 0.0}] * 32) == "sharded"
    assert len(stock_sample) == 1 and vllm_runner._state["handed"] == 1
    assert vllm_runner.FALLBACKS.as_dict() == before


def test_sample_step_does_not_count_a_step_without_drafts(tp8, monkeypatch):
    from vllm_kimi_ext.integration import sharded_verify as vllm_runner

    before = vllm_runner.FALLBACKS.as_dict()
    out = vllm_runner.sample_step(_runner([{"temperature": 0.0}]), lambda *a: "stock", "h",
                                  _batch(1, 0), None)
    assert out == "stock" and vllm_runner.FALLBACKS.as_dict() == before


def test_sample_step_verifies_an_eligible_step_over_shards(tp8, monkeypatch):
    from vllm_kimi_ext.integration import sharded_verify as vllm_runner
    from vllm_kimi_ext.verify import ranks

    monkeypatch.setattr(ranks, "group_coordinator_all_gather", lambda group: "gather")
    made = []

    def fake_sharded_sample(runner, hidden, batch, make_verifier, plan=None):
        made.append(make_verifier(125))
        made.append(make_verifier(125))  # cached per shard width
        return "sharded"

    monkeypatch.setattr(vllm_runner, "sharded_sample", fake_sharded_sample)
    runner = _runner([{"temperature": 0.0}, {"temperature": 0.8, "top_k": 20}])
    out = vllm_runner.sample_step(runner, _raise, "h", _batch(2), None)
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
