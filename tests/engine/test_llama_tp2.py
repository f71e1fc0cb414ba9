"""The Llama draft kinds the patches touch, through vLLM's engine at TP 2 over gloo, with the
plugin on and its live collective counter (``VLLM_KIMI_EXT_COUNT_COLLECTIVES``):

* greedy output equal, token for token, to the same engine without speculation (plugin
  off): EAGLE, EAGLE-3 and draft_model drafts sharded like the target, and EAGLE-3 and
  draft_model drafts at ``draft_tensor_parallel_size: 1`` (patches 0006 / 0007);
* collectives of every decode step by phase (``target``: the forward, ``verify``: logits
  and sampling, ``draft``: ``propose``), counted inside the engine on every rank, equal to
  the cost model's count for the same tiny configuration
  (:func:`testkit.engine_cases.cost_model_collectives`): at K = 3 draft tokens, 5 + 1 + 12
  with a sharded 1-layer draft (3 forwards x (embedding + 2 all-reduces + top-token
  gather)), 5 + 1 + 1 at draft TP 1 (rank 0's drafts broadcast). In the last step, where
  every request finishes, vLLM drafts only the first forward.
"""

from __future__ import annotations

import pytest

from testkit.engine import EngineSpec
from testkit.engine_cases import (
    MAX_TOKENS,
    K,
    assert_same_tokens,
    cost_model_collectives,
    engine_steps,
    reference,
    run_engine,
    speculative,
)
from testkit.engine_models import TinyLlamaSpec

pytestmark = [pytest.mark.vllm, pytest.mark.engine]

COUNTING = {"VLLM_KIMI_EXT_COUNT_COLLECTIVES": "1000000"}  # counted, logged never
CASES = {  # name -> (draft kind, draft layers, draft TP 1?)
    "eagle": ("eagle", 1, False),
    "eagle3": ("eagle3", 1, False),
    "draft_model": ("draft_model", 1, False),
    "eagle3-draft-tp1": ("eagle3", 1, True),
    "draft_model-draft-tp1": ("draft_model", 1, True),
}


def tp2_spec(llama, kind: str, draft_tp1: bool = False, **env) -> EngineSpec:
    extra = {"draft_tensor_parallel_size": 1} if draft_tp1 else {}
    return EngineSpec(llama["target"], tp=2, plugin=True, env={**COUNTING, **env},
                      speculative_config=speculative(llama, kind, **extra))


#: in the CPU tier; the others are the same path with another draft class (slow tier). The
#: draft-TP-1 count is in the CPU tier through test_draft_tp1_ranks.py (a self-draft).
FAST = ("eagle3",)


@pytest.mark.parametrize("case", [c if c in FAST else pytest.param(c, marks=pytest.mark.slow)
                                  for c in CASES])
def test_tp2_greedy_equal_and_collectives_match_cost_model(llama, case):
    kind, draft_layers, draft_tp1 = CASES[case]
    spec = tp2_spec(llama, kind, draft_tp1)
    run = run_engine(spec, before=("testkit.engine_probes:track_steps",),
                     probes={"steps": "testkit.engine_probes:step_collectives"})
    ref = reference(EngineSpec(llama["target"], tp=2))  # plugin off, no speculation
    assert_same_tokens(run, ref, f"{case} at TP 2")
    assert run.metrics["num_drafts"] > 0, run.metrics

    t = TinyLlamaSpec()
    want = cost_model_collectives(target_layers=t.num_hidden_layers, hidden=t.hidden_size,
                                  vocab=t.vocab_size, k=K, draft_layers=draft_layers,
                                  placement="tp1" if draft_tp1 else "tp8")
    steps = engine_steps(run.extra["steps"])
    assert len(steps) >= max(MAX_TOKENS) // (K + 1), steps
    # every step but the last is a full decode step; in the last one every request finishes
    # and vLLM stops drafting after the first draft forward
    for i, got in enumerate(steps[:-1]):
        assert got == want, f"{case}: step {i} counted {got} in the engine, cost model {want}"
    last = steps[-1]
    assert last["target"] == want["target"] and last["verify"] == want["verify"], last
    assert last["draft"] <= want["draft"], last
