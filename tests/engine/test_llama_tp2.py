"""The Llama draft kinds the patches touch, through vLLM's engine at TP 2 over gloo, with the
plugin on and its live collective counter (``VLLM_KIMI_EXT_COUNT_COLLECTIVES``):

* greedy output equal, token for token, to the same engine without speculation (plugin
  off): EAGLE, EAGLE-3 and draft_model drafts sharded like the target, and EAGLE-3 and
  draft_model drafts at ``draft_tensor_parallel_size: 1`` (patches 0006 / 0007);
* collectives per decode step by phase, counted inside the engine on every rank, equal to
  the cost model's count for the same tiny configuration
  (:func:`testkit.engine_cases.cost_model_collectives`).
"""

from __future__ import annotations

import pytest

from testkit.engine import EngineSpec
from testkit.engine_cases import (
    K,
    assert_same_tokens,
    cost_model_collectives,
    engine_collectives_per_step,
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


@pytest.mark.parametrize("case", list(CASES))
def test_tp2_greedy_equal_and_collectives_match_cost_model(llama, case):
    kind, draft_layers, draft_tp1 = CASES[case]
    spec = tp2_spec(llama, kind, draft_tp1)
    run = run_engine(spec, before=("testkit.engine_probes:reset_collectives",),
                     probes={"coll": "testkit.engine_probes:collective_summary"})
    ref = reference(EngineSpec(llama["target"], tp=2))  # plugin off, no speculation
    assert_same_tokens(run, ref, f"{case} at TP 2")
    assert run.metrics["num_drafts"] > 0, run.metrics

    got = engine_collectives_per_step(run.extra["coll"])
    t = TinyLlamaSpec()
    want = cost_model_collectives(target_layers=t.num_hidden_layers, hidden=t.hidden_size,
                                  vocab=t.vocab_size, k=K, draft_layers=draft_layers,
                                  placement="tp1" if draft_tp1 else "tp8")
    assert {p: got.get(p, 0) for p in want} == want, \
        f"{case}: counted in the engine {got} per step, cost model {want}; " \
        f"raw: {run.extra['coll'][0]}"
