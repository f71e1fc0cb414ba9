"""Every Llama draft kind through vLLM's engine at TP 1: greedy output equal, token for
token, to the same engine without speculation (three requests crossing KV blocks and
finishing at different steps); a self-draft (draft = target) accepts every draft token,
read from the engine's own spec-decode counters; the plugin on (pin check, runtime
patches) changes nothing."""

from __future__ import annotations

import pytest

from testkit.engine import EngineSpec
from testkit.engine_cases import K, assert_same_tokens, reference, run_engine, speculative

pytestmark = [pytest.mark.vllm, pytest.mark.engine]


#: in the CPU tier: draft_model (patches 0005-0007 change how vLLM loads it). The others are
#: in the slow tier: no patch touches ngram or EAGLE-1 at TP 1; EAGLE-3 at TP 1 is in the CPU
#: tier with the plugin on (test_plugin_on_greedy_equal), and a self-draft accepting every
#: token is in it at TP 2 (test_draft_tp1_ranks.py) and on the Kimi target
#: (test_kimi_drafts_engine.py).
FAST = ("draft_model",)


@pytest.mark.parametrize("kind", [k if k in FAST else pytest.param(k, marks=pytest.mark.slow)
                                  for k in ("ngram", "draft_model", "eagle", "eagle3", "self")])
def test_greedy_equal_without_speculation(llama, kind):
    spec = EngineSpec(llama["target"], speculative_config=speculative(llama, kind))
    run = run_engine(spec)
    assert_same_tokens(run, reference(spec), f"{kind} at TP 1")
    m = run.metrics
    assert m["num_drafts"] > 0 and m["num_draft_tokens"] == K * m["num_drafts"], m
    if kind == "self":
        # the draft is the target: every draft token is the target's greedy choice
        assert m["num_accepted_tokens"] == m["num_draft_tokens"], m
        assert m["accepted_per_pos"] == [m["num_drafts"]] * K, m
    elif kind == "ngram":
        assert m["num_accepted_tokens"] > 0, m  # the repetitive prompt is matched


def test_plugin_on_greedy_equal(llama):
    """``VLLM_KIMI_EXT=1``: the plugin passes its pin check in the engine process (it
    registers) and installs its always-on runtime patches; greedy EAGLE-3 output is still
    the engine's output without speculation (plugin off)."""
    spec = EngineSpec(llama["target"], speculative_config=speculative(llama, "eagle3"),
                      plugin=True)
    run = run_engine(spec, probes={"plugin": "testkit.engine_probes:plugin_state"})
    (state,) = run.extra["plugin"]
    assert state["registered"], state
    assert {"VllmConfigDraftCheck", "SpeculativeConfigKimiK25MTP"} <= set(state["patches"])
    assert_same_tokens(run, reference(EngineSpec(llama["target"])), "eagle3, plugin on")
