"""The plugin's vocabulary-sharded verifier on the Kimi-K2.5-shaped target (MLA + MoE) in
vLLM 0.34.0's engine at TP 2 over gloo: ``VLLM_KIMI_EXT=1``,
``VLLM_KIMI_EXT_SHARDED_VERIFY=1`` (eager step: no CUDA graphs on CPU), ngram drafts.
``KimiK25ForConditionalGeneration`` gets ``compute_logits_local`` from patch 0002, so the
steps are eligible:

* greedy output equal, token for token, to the same TP 2 engine without speculation and
  without the plugin; every verification step taken by the sharded verifier on both ranks
  (its counters read back from each worker): no fallback, no uncaptured step;
* requests with top-p (T 0.7, p 0.8), top-k 5 and Kimi's own T 1.0 / top-p 0.95 (fixed
  seeds): every sampled token lies in the target's kept set, recomputed with
  transformers' ``DeepseekV3ForCausalLM`` on each generated prefix, and those steps went
  through the sharded verifier too. min-p cannot be asked for: vLLM 0.34.0 refuses it
  with speculative decoding, which the engine's answer shows.

(The tiny Llama target's cells are ``test_sharded_verify_engine.py``.)
"""

from __future__ import annotations

import pytest

from testkit import engine_kimi as ek
from testkit.engine import Engine
from testkit.engine_cases import kept_set_violations

pytestmark = [pytest.mark.engine, pytest.mark.vllm, pytest.mark.distributed, pytest.mark.slow]

SHARDED = {"VLLM_KIMI_EXT_SHARDED_VERIFY": "1", "VLLM_KIMI_EXT_SHARDED_VERIFY_GRAPHS": "0"}
COUNTERS = "testkit.engine_probes:sharded_verify_counters"
#: one filter per request (vLLM applies temperature, then the filter); seeded. Kimi's own
#: setting (T = 1.0, top_p 0.95) is the third. min-p cannot be one of them: vLLM 0.34.0
#: refuses it with any speculative decoding (``sampling_params.py:1197``,
#: :func:`test_min_p_refused_with_speculation`).
SAMPLED = [
    {"max_tokens": 16, "ignore_eos": True, "temperature": 0.7, "top_p": 0.8, "seed": 1},
    {"max_tokens": 16, "ignore_eos": True, "temperature": 1.0, "top_k": 5, "seed": 2},
    {"max_tokens": 16, "ignore_eos": True, "temperature": 1.0, "top_p": 0.95, "seed": 3},
]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return ek.shared_target(tmp_path_factory)


@pytest.fixture(scope="module")
def engine(target):
    spec = ek.kimi_spec(target, ek.speculative("ngram", {}), tp=2, plugin=True, env=SHARDED)
    with Engine(spec) as eng:
        yield eng


def _check_counters(counters: list[dict], before: list[dict] | None = None) -> None:
    assert [c["rank"] for c in counters] == [0, 1]
    assert counters[0]["steps"] == counters[1]["steps"] > 0, counters
    for i, c in enumerate(counters):
        assert c["fallbacks"] == (before[i]["fallbacks"] if before else {}), c
        assert not any(k.startswith("uncaptured") for k in c["graphs"]), c
        if before:
            assert c["steps"] > before[i]["steps"], (before[i], c)


def test_kimi_tp2_sharded_verify_greedy_equal(engine, target):
    facts = engine.rpc("testkit.engine_probes:runner_facts")
    assert all(f["has_compute_logits_local"] and f["tp"] == 2 for f in facts), facts
    outs = engine.generate(ek.PROMPTS, ek.GREEDY)
    ref = ek.reference(ek.kimi_spec(target, tp=2))
    tokens = [o.token_ids for o in outs]
    assert tokens == ref.tokens, [
        next((j for j, (a, b) in enumerate(zip(g, w)) if a != b), None)
        for g, w in zip(tokens, ref.tokens)]
    assert engine.spec_metrics()["num_drafts"] > 0
    _check_counters(engine.rpc(COUNTERS))


def test_kimi_tp2_sharded_sampling_stays_in_kept_set(engine, target):
    before = engine.rpc(COUNTERS)
    outs = engine.generate(ek.PROMPTS, SAMPLED)
    tokens = [o.token_ids for o in outs]
    assert [len(t) for t in tokens] == [p["max_tokens"] for p in SAMPLED]
    assert kept_set_violations(str(target), ek.PROMPTS, tokens, SAMPLED,
                               model=ek.hf_model(target)) == []
    _check_counters(engine.rpc(COUNTERS), before)


def test_min_p_refused_with_speculation(engine):
    from testkit.engine import EngineError

    with pytest.raises(EngineError) as err:
        engine.generate(ek.PROMPTS[:1], {"max_tokens": 2, "temperature": 1.0, "min_p": 0.2})
    assert err.value.message == ("The min_p and logit_bias sampling parameters are not yet "
                                 "supported with speculative decoding.")
