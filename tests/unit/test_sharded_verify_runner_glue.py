"""The gate of the opt-in runner integration (vllm_kimi_ext.integration.sharded_verify.gate),
on stand-in runner objects: which steps take the sharded path, which fall back with
which counted reason, and that it fails closed (a missing vLLM attribute, an unknown
object type or logits processor → ineligible)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from testkit.runner_stand_ins import (
    PENALTIES,
    owner_of,
    stand_in,
    stand_in_batch,
    stand_in_runner,
)
from vllm_kimi_ext.integration.sharded_verify import gate
from vllm_kimi_ext.integration.sharded_verify.gate import GATE_ATTRIBUTES, ineligibility
from vllm_kimi_ext.integration.sharded_verify.inputs import bonus_layout_drafts, draft_probs_full
from vllm_kimi_ext.integration.sharded_verify.sampler import ShardedSampler
from vllm_kimi_ext.integration.sharded_verify.telemetry import Telemetry

V = 1000
GREEDY = {"temperature": 0.0}
SAMPLE = {"temperature": 0.8, "top_k": 20}
KIMI = {"temperature": 1.0, "top_p": 0.95}
KIMI_INSTANT = {"temperature": 0.6, "top_p": 0.95}


def _probabilistic(params=(GREEDY, SAMPLE, KIMI), draft_vocab=V):
    return stand_in_runner(list(params), vocab=V,
                           draft_logits=torch.zeros(len(params), 3, draft_vocab))


@pytest.mark.parametrize("params", [
    [GREEDY, SAMPLE], [KIMI], [KIMI_INSTANT, GREEDY], [{"temperature": 0.7, "min_p": 0.1}],
    [{"temperature": 1.0, "top_p": 0.95, "top_k": 50, "min_p": 0.05}],
])
def test_verification_steps_kimi_sampling_included_are_eligible(params):
    batch = stand_in_batch(len(params))
    assert ineligibility(stand_in_runner(params), batch, None, 8, V) is None
    # probabilistic drafts (vLLM's cached draft logits) too
    assert ineligibility(_probabilistic(params), batch, None, 8, V) is None


def _set(owner, name, value):
    return lambda r, b: setattr(owner_of(r, b, owner), name, value)


#: Every gate condition: (tweak of an eligible probabilistic-draft step, reason). vLLM's
#: batch sharder is not one: it hands steps over by price (tests/unit/test_verifier_choice.py).
CONDITIONS = [
    (_set("input_batch", "num_draft_tokens", 0), "not_verification"),
    (_set("runner", "rejection_sampler", None), "not_verification"),
    (_set("runner", "model", object()), "no_compute_logits_local"),
    (_set("runner", "rejection_sampler", stand_in(
        "vllm.model_executor.models.custom.CustomRejectionSampler")),
     "rejection_sampler_type"),
    (_set("rejection_sampler", "use_block_verification", True), "block_verification"),
    (_set("rejection_sampler", "synthetic_conditional_rates", torch.ones(3)),
     "lossy_rejection_method"),
    (_set("rejection_sampler", "fly_window_size", 2), "lossy_rejection_method"),
    (_set("rejection_sampler", "enable_adaptive_verification", True), "adaptive_verification"),
    (_set("rejection_sampler", "watermark_key", 3), "watermarking"),
    (_set("runner", "sampler", stand_in(
        "vllm.v1.watermarking.gpu_sampler.GPUWatermarkSampler")), "sampler_type"),
    (_set("speculator", "draft_logits", stand_in("somewhere.OtherCache")), "draft_logits_type"),
    (_set("draft_logits", "row_mapping", torch.zeros(3)), "sharded_draft_logits"),
    (_set("draft_logits", "values", torch.zeros(3, V)), "draft_logits_type"),
    (_set("draft_logits", "values", torch.zeros(3, 3, V - 1)), "draft_vocab_smaller"),
    (_set("sampler", "get_logprobs_dims", lambda idx: (5, 0)), "logprobs"),
    (_set("sampler", "return_sampling_mask", True), "sampling_mask"),
    (_set("sampler", "compute_nans", True), "nan_metrics"),
    (_set("sampler", "trace_replay_state", object()), "trace_replay"),
    (_set("input_batch", "idx_mapping_np", np.array([0, 1, 7])), "unknown_sampling_params"),
    (lambda r, b: r.sampler.logits_processors.append(stand_in("my_plugin.NoRepeat")),
     "logits_processors"),
    (lambda r, b: gate.remember_sampling_params(
        r.sampler, 2, {"temperature": 1.0, "top_p": 0.95, "repetition_penalty": 1.1}),
     "penalties"),
]


@pytest.mark.parametrize("tweak,reason", CONDITIONS,
                         ids=[f"{i}-{r}" for i, (_, r) in enumerate(CONDITIONS)])
def test_every_gate_condition_names_its_reason(tweak, reason):
    r, b = _probabilistic(), stand_in_batch(3)
    assert ineligibility(r, b, None, 8, V) is None
    tweak(r, b)
    assert ineligibility(r, b, None, 8, V) == reason


def test_structured_output_and_tp1():
    r, b = _probabilistic(), stand_in_batch(3)
    assert ineligibility(r, b, object(), 8, V) == "structured_output"
    assert ineligibility(r, b, None, 1, V) == "tp1"


def test_logits_processors_allow_list_is_by_type_not_count():
    """A fourth processor of a built-in type is fine; a third of an unknown type is not."""
    r, b = stand_in_runner([KIMI]), stand_in_batch(1)
    r.sampler.logits_processors.append(stand_in(PENALTIES))
    assert ineligibility(r, b, None, 8, V) is None
    r.sampler.logits_processors[:] = r.sampler.logits_processors[:2] + [stand_in("x.Custom")]
    assert ineligibility(r, b, None, 8, V) == "logits_processors"
    r.sampler.logits_processors[:] = [object()] * 3  # the old `> 3` guess let these through
    assert ineligibility(r, b, None, 8, V) == "logits_processors"


@pytest.mark.parametrize("attr", GATE_ATTRIBUTES, ids=[f"{a.owner}.{a.name}"
                                                       for a in GATE_ATTRIBUTES])
def test_a_missing_vllm_attribute_fails_closed(attr, caplog):
    """Every attribute the gate reads, deleted from an otherwise eligible step (the
    probabilistic-draft one, so every read happens): unknown_vllm_state naming it, counted
    per step by the runner's sampler and logged once."""
    r, b = _probabilistic(), stand_in_batch(3)
    assert ineligibility(r, b, None, 8, V) is None
    delattr(owner_of(r, b, attr.owner), attr.name)
    sampler = ShardedSampler(r)
    with caplog.at_level(logging.WARNING, logger="vllm_kimi_ext.verify"):
        for _ in range(2):
            fb = sampler.plan(b, None, 8, V)
            assert (fb.reason, fb.detail) == ("unknown_vllm_state", f"{attr.owner}.{attr.name}")
    logged = [m for m in caplog.messages if f"{attr.owner}.{attr.name}" in m]
    assert len(logged) == 1
    assert sampler.telemetry.fallbacks.as_dict() == {"unknown_vllm_state": 2}


def test_every_declared_attribute_is_read_by_the_gate():
    """GATE_ATTRIBUTES lists nothing the gate does not read (the canary would otherwise
    guard attributes that do not matter)."""
    seen = []
    real = gate._read

    def spy(obj, owner, name):
        seen.append((owner, name))
        return real(obj, owner, name)

    mp = pytest.MonkeyPatch()
    mp.setattr(gate, "_read", spy)
    try:
        assert ineligibility(_probabilistic(), stand_in_batch(3), None, 8, V) is None
    finally:
        mp.undo()
    assert set(seen) == {(a.owner, a.name) for a in GATE_ATTRIBUTES}


def test_reading_an_undeclared_attribute_is_a_programming_error():
    with pytest.raises(KeyError, match="GATE_ATTRIBUTES"):
        gate._read(object(), "runner", "kv_cache_config")


def test_bonus_layout_drafts_shifts_within_requests():
    # two requests: rows [0,1,2,3] (3 drafts) and [4,5] (1 draft); the input token
    # at each logits row is the previous token, the draft verified at row j is the
    # input of row j+1, the last row of each request is its bonus row.
    draft_sampled = torch.tensor([100, 11, 12, 13, 200, 21])
    cu = torch.tensor([0, 4, 6])
    assert bonus_layout_drafts(draft_sampled, cu).tolist() == [11, 12, 13, -1, 21, -1]


def test_draft_probs_are_vllms_q():
    """q = softmax(cache[req_state, step, :V] / T) per row (vLLM's rejection sampler) over
    the target's V columns of a larger draft vocabulary; bonus rows clamp to the last
    step; greedy rows use T = 1."""
    g = torch.Generator().manual_seed(1)
    values = torch.randn(4, 2, 12, generator=g)  # draft vocab 12 >= V = 10
    req = torch.tensor([3, 3, 3, 0, 0])
    step = torch.tensor([0, 1, 2, 0, 1])
    temp = torch.tensor([0.5, 0.5, 0.5, 0.0, 0.0])
    full = draft_probs_full(values, req, step, temp, 10)
    assert full.shape == (5, 10)
    expect = torch.softmax(values[3, 1, :10] / 0.5, dim=-1)
    assert torch.allclose(full[1], expect)
    assert torch.allclose(full[2], expect)  # bonus row: last step
    assert torch.allclose(full[3], torch.softmax(values[0, 0, :10], dim=-1))  # greedy: T=1
    assert torch.allclose(full.sum(1), torch.ones(5))


def test_escalations_and_deferrals_are_counted_on_the_device():
    """No host read per step: the sampler adds each step's escalated rows and stopped
    requests to a device tensor; ``device_counts`` reads it (the 1000-step log line)."""
    from types import SimpleNamespace

    t = Telemetry(logging.getLogger("test"))
    assert t.device_counts() == {"escalated_rows": 0, "deferred_requests": 0}
    step = SimpleNamespace(uncertified=torch.tensor([1, 0, 1], dtype=torch.int8),
                           stopped=torch.tensor([False, True]))
    t.count_on_device(step)
    t.count_on_device(step)
    assert t.device_counts() == {"escalated_rows": 4, "deferred_requests": 2}


def test_the_runner_holds_one_sampler_and_nothing_else():
    """vLLM's runner carries exactly one attribute of this plugin, the sampler, made once;
    the gate itself keeps no state (two gates of one step answer alike)."""
    r, b = stand_in_runner([KIMI, GREEDY]), stand_in_batch(2)
    before = set(vars(r))
    s = ShardedSampler.of(r)
    assert ShardedSampler.of(r) is s
    assert set(vars(r)) - before == {ShardedSampler.ATTR}
    assert s.plan(b, None, 8, V) == s.plan(b, None, 8, V) == gate.gate(r, b, None, 8, V)
    assert s.telemetry.steps == 2
