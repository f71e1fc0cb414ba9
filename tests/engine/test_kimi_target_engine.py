"""A Kimi-K2.5-shaped target (MLA, MoE with a shared expert, 1 dense + 2 MoE layers) in
vLLM 0.34.0's real engine on CPU, against Hugging Face transformers on the same checkpoint.

The engine picks ``CPU_MLA`` (decode through the stand-in of testkit/engine_mla_ops.py,
prefill through SDPA) and ``CPUUnquantizedExperts`` (``_C::cpu_fused_moe``, the stand-in of
testkit/cpu_stand_ins.py); the reference is transformers' ``DeepseekV3ForCausalLM`` (eager
attention, its own yarn RoPE, router and expert loop): no vLLM code. Token-for-token
equality over 98 greedy tokens crossing 16-token KV blocks, three requests finishing at
different steps.
"""

from __future__ import annotations

import pytest

from testkit import engine_kimi as ek

pytestmark = [pytest.mark.engine, pytest.mark.vllm]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return ek.shared_target(tmp_path_factory)


@pytest.fixture(scope="module")
def plain(target):
    return ek.reference(ek.kimi_spec(target))


def test_kimi_target_greedy_equals_transformers(target, plain):
    ref = ek.hf_greedy(target, ek.PROMPTS, ek.MAX_TOKENS)
    assert [len(t) for t in plain.tokens] == ek.MAX_TOKENS
    for i, (got, want) in enumerate(zip(plain.tokens, ref)):
        first = next((j for j, (a, b) in enumerate(zip(got, want.tokens)) if a != b), None)
        assert first is None, (
            f"request {i}: engine and transformers differ first at token {first} "
            f"(engine {got[first]}, transformers {want.tokens[first]}, transformers' top-1 "
            f"margin there {want.margins[first]:.4g})")
    log = plain.log
    assert "Using CPU_MLA backend" in log and "CPUUnquantizedExperts" in log


def test_engine_path_goes_through_the_stand_ins(plain):
    """Each decode step of each of the 3 MLA layers calls the decode stand-in once; each
    forward of each of the 2 MoE layers calls the fused-MoE stand-in once."""
    (calls,) = plain.probes["calls"]
    decode_steps = max(ek.MAX_TOKENS) - 1  # the first token comes from the prefill
    assert calls["mla_decode_kvcache"] == ek.ENGINE_KIMI.num_hidden_layers * decode_steps
    moe_layers = len(ek.ENGINE_KIMI.moe_layer_ids())
    assert calls["cpu_fused_moe"] == moe_layers * max(ek.MAX_TOKENS)
    assert calls["prepack_moe_weight"] == 2 * moe_layers  # w13 and w2, after loading


def test_greedy_is_deterministic_across_batches(plain):
    """The same engine, the prompts again in reverse order: the greedy tokens are the
    first :data:`~testkit.engine_kimi.AGAIN` of the first batch's."""
    assert plain.again == [t[: ek.AGAIN] for t in plain.tokens]
