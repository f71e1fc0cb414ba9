"""The vocabulary-sharded verifier (``VLLM_KIMI_EXT_SHARDED_VERIFY=1``) engaged inside
vLLM's engine at TP 2 with an EAGLE-3 draft. vLLM 0.34.0's ``LlamaForCausalLM`` has
``compute_logits_local`` (``model_executor/models/llama.py:553``), so the Llama target is
eligible (the DeepSeek/Kimi targets get it from patch 0002):

* greedy output equal, token for token, to the engine without speculation (plugin off),
  with every verification step taken by the sharded verifier (its step counter read back
  from each worker; no fallback counted);
* a mixed batch sampling with top-p, top-k and min-p (one per request, fixed seeds): every
  sampled token lies in the target's kept set, recomputed with Hugging Face transformers
  on each generated prefix (asking the engine for logprobs would make the step fall back
  to the full gather).
"""

from __future__ import annotations

import pytest

from testkit.engine import Engine, EngineSpec
from testkit.engine_cases import (
    GREEDY,
    PROMPTS,
    SAMPLED,
    Run,
    assert_same_tokens,
    kept_set_violations,
    reference,
    speculative,
)

pytestmark = [pytest.mark.vllm, pytest.mark.engine]

SHARDED = {"VLLM_KIMI_EXT_SHARDED_VERIFY": "1",
           "VLLM_KIMI_EXT_SHARDED_VERIFY_GRAPHS": "0"}  # no CUDA graphs on CPU: eager step
COUNTERS = "testkit.engine_probes:sharded_verify_counters"


@pytest.fixture(scope="module")
def engine(llama):
    spec = EngineSpec(llama["target"], tp=2, plugin=True, env=SHARDED,
                      speculative_config=speculative(llama, "eagle3"))
    with Engine(spec) as eng:
        yield eng


def test_sharded_verify_greedy_equal(engine, llama):
    facts = engine.rpc("testkit.engine_probes:runner_facts")
    assert all(f["has_compute_logits_local"] for f in facts), facts
    outs = engine.generate(PROMPTS, GREEDY)
    ref = reference(EngineSpec(llama["target"], tp=2))
    assert_same_tokens(Run([o.token_ids for o in outs], {}, {}), ref,
                       "EAGLE-3, sharded verifier, TP 2")
    counters = engine.rpc(COUNTERS)
    drafts = engine.spec_metrics()["num_drafts"]
    for c in counters:
        assert c["fallbacks"] == {}, c
        assert c["steps"] > 0, c
    # every step but the prefill verifies drafts: the verifier took them all, on each rank
    assert counters[0]["steps"] == counters[1]["steps"], counters
    assert drafts > 0


def test_sharded_verify_sampling_stays_in_kept_set(engine, llama):
    before = engine.rpc(COUNTERS)
    outs = engine.generate(PROMPTS, SAMPLED)
    after = engine.rpc(COUNTERS)
    tokens = [o.token_ids for o in outs]
    assert [len(t) for t in tokens] == [p["max_tokens"] for p in SAMPLED]
    assert kept_set_violations(llama["target"], PROMPTS, tokens, SAMPLED) == []
    for b, a in zip(before, after):
        assert a["steps"] > b["steps"], (b, a)  # the sampling steps went sharded too
        assert a["fallbacks"] == b["fallbacks"], (b, a)
