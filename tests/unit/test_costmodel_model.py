"""Limits and monotonicity of the decode cost model (pure Python, no vLLM)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from vllm_kimi_ext.costmodel import Acceptance, CalibParams, CostModel, Plan, Variant, load_draft
from vllm_kimi_ext.costmodel.catalog import expert_probabilities, list_profiles
from vllm_kimi_ext.costmodel.draft_cost import collectives_per_forward
from vllm_kimi_ext.costmodel.model import SHARDED_VERIFIER_BYTES_PER_ROW_PER_RANK

DRAFTS = list_profiles("drafts")
ACC = Acceptance.from_tau(2.7, 3)


@pytest.fixture(scope="module")
def cm() -> CostModel:
    return CostModel.build("rtx-pro-6000-pcie-x8")


def plans(cm, draft_names=DRAFTS, ks=(1, 7), batches=(1, 8)):
    for name in draft_names:
        d = load_draft(name)
        for k in ks:
            for pl in cm.placement_options(d):
                for vo in cm.vocab_options(d):
                    for ve in ("gather", "sharded"):
                        for be in cm.backends:
                            for b in batches:
                                yield Plan(k=k, draft=d, placement=pl, vocab=vo, verifier=ve,
                                           backend=be, batch=b)


def test_target_matches_published_sizes(cm):
    m = cm.model
    assert 1.0e12 < m.total_params() < 1.06e12  # ~1.04T published (text stack)
    assert 31e9 < m.active_params() < 34e9  # ~32B active
    w = cm.target_weight_bytes(1)
    assert 5.7e9 < sum(w.values()) < 6.2e9
    assert sum(w.values()) - w["router"] == pytest.approx(5.70e9, rel=0.01)


def test_k0_is_exactly_no_speculation(cm):
    d = load_draft("lightseek-eagle3")
    for be in cm.backends:
        for batch in (1, 4):
            base = cm.no_spec(batch=batch, backend=be)
            for pl in cm.placement_options(d):
                e = cm.estimate(Plan(k=0, draft=d, placement=pl, backend=be, batch=batch), ACC)
                assert e.step_s == base.step_s and e.tau == 1.0
                assert e.collectives_per_step == base.collectives_per_step


def test_no_spec_collective_counts(cm):
    e = cm.no_spec()
    assert cm.code_allreduce_per_pass() == 123
    assert sum(t.allreduces for t in e.terms if t.phase == "target") == 123
    assert sum(t.allreduces for t in e.terms) == 127  # + 4 unattributed (profile mode)
    assert e.collectives_per_step == 128
    code = CostModel.build("rtx-pro-6000-pcie-x8", count_mode="code").no_spec()
    assert code.collectives_per_step == 124


def test_draft_collectives_per_placement(cm):
    d = load_draft("lightseek-eagle3")  # one layer: 2L + 2 stock, 2L + 1 replicated embedding
    counts = {pl: cm.estimate(Plan(k=3, draft=d, placement=pl), ACC).total("collectives", "draft")
              for pl in ("tp8", "tp8-repemb", "tp1")}
    # draft TP 1: no collective while drafting, then one broadcast of rank 0's draft tokens
    # per step (counted in vLLM's engine: tests/engine/test_llama_tp2.py)
    assert counts == {"tp8": 3 * 4, "tp8-repemb": 3 * 3, "tp1": 1}
    assert [collectives_per_forward(d, p) for p in ("tp8", "tp8-repemb", "tp1")] == [4, 3, 0]
    dflash = load_draft("zlab-dflash")  # one pass of L layers per step
    e = cm.estimate(Plan(k=5, draft=dflash, placement="tp8"), ACC)
    assert e.total("collectives", "draft") == 2 * dflash.num_layers + 2


def test_replicated_embedding_costs_memory_not_bytes_per_step(cm):
    d = load_draft("lightseek-eagle3-mla")
    a, b = (Plan(k=3, draft=d, placement=p) for p in ("tp8", "tp8-repemb"))
    extra = cm.memory_gb(b) - cm.memory_gb(a)
    assert extra == pytest.approx(163840 * 7168 * 2 * (1 - 1 / 8) / 1e9, rel=1e-6)
    assert cm.estimate(b, ACC).step_s < cm.estimate(a, ACC).step_s


def test_bytes_never_negative_and_finite(cm):
    for p in plans(cm):
        e = cm.estimate(p, ACC)
        for t in e.terms:
            assert t.time_s >= 0 and t.hbm_bytes >= 0 and t.comm_bytes >= 0
        assert math.isfinite(e.tokens_per_s) and e.tokens_per_s > 0


def test_higher_acceptance_never_hurts(cm):
    rates = [0.0, 0.2, 0.5, 0.8, 0.95, 1.0]
    for p in plans(cm, ["lightseek-eagle3", "zlab-dflash"], ks=(1, 4, 7), batches=(1,)):
        tps = [cm.estimate(p, Acceptance.from_conditional([a] * 7)).tokens_per_s for a in rates]
        assert tps == sorted(tps)


def test_more_context_batch_or_tokens_never_make_a_step_cheaper(cm):
    d = load_draft("lightseek-eagle3-mla")
    for k in (0, 3):
        steps = [cm.estimate(Plan(k=k, draft=d if k else None, context=c), ACC).step_s
                 for c in (0, 1024, 16384, 65536, 131072)]
        assert steps == sorted(steps)
        steps = [cm.estimate(Plan(k=k, draft=d if k else None, batch=b), ACC).step_s
                 for b in (1, 2, 4, 16, 64, 128)]
        assert steps == sorted(steps)
    steps = [cm.estimate(Plan(k=k, draft=d), ACC).step_s for k in range(1, 8)]
    assert steps == sorted(steps)


def test_faster_link_or_memory_never_slows_a_step(cm):
    fast_link = cm.with_latency(cm.latency.scaled(0.5))
    less_skew = cm.with_params(dataclasses.replace(cm.params, collective_overhead_us=1.0))
    more_bw = cm.with_hardware(cm.hw.with_overrides(
        memory_bandwidth_GBps=cm.hw.memory_bandwidth_GBps * 1.5))
    for p in plans(cm, ["lightseek-eagle3", "modular-mtp"], ks=(1, 5), batches=(1, 16)):
        step = cm.estimate(p, ACC).step_s
        for other in (fast_link, less_skew, more_bw):
            assert other.estimate(p, ACC).step_s <= step


def test_context_cost_terms_at_their_limits(cm):
    kv = cm.kv_bytes_per_token()
    shared = cm.with_params(dataclasses.replace(cm.params, kv_query_share=0.0))
    each = cm.with_params(dataclasses.replace(cm.params, kv_query_share=1.0))
    # share 0: the k+1 tokens of a sequence read its cache once; 1: once per token
    assert shared.kv_read_bytes(2, 1000, 4) == pytest.approx(2 * 1000 * kv)
    assert each.kv_read_bytes(2, 1000, 4) == pytest.approx(4 * 2 * 1000 * kv)
    # the read factor scales the KV time linearly and nothing else
    base = cm.with_params(dataclasses.replace(cm.params, kv_read_factor=1.0))
    slow = cm.with_params(dataclasses.replace(cm.params, kv_read_factor=3.0))
    t1, t3 = (next(t for t in m.no_spec(context=65536).terms if t.name == "attention KV reads")
              for m in (base, slow))
    assert t3.time_s == pytest.approx(3 * t1.time_s) and t3.hbm_bytes == t1.hbm_bytes
    assert base.no_spec(context=0).step_s == slow.no_spec(context=0).step_s


def test_distinct_experts_limits(cm):
    m = cm.model
    for pop in (0.0, 0.5, 1.0):
        p = expert_probabilities(384, 8, pop)
        assert sum(p) == pytest.approx(8.0) and max(p) <= 1.0
        prev = 0.0
        for n in (1, 2, 4, 16, 64, 256, 4096):
            e = m.expected_distinct_experts(n, skew=1.0, popularity=pop, batch=n)
            assert prev < e <= 384
            prev = e
        assert m.expected_distinct_experts(1, skew=1.0, popularity=pop) == pytest.approx(8.0)
    # popularity 0 is exactly the uniform formula
    assert (m.expected_distinct_experts(4, skew=1.0, batch=4) ==
        pytest.approx(384 * (1 - (1 - 8 / 384) ** 4)))
    assert (m.expected_distinct_experts(64, skew=1, popularity=0.8, batch=64) <
        m.expected_distinct_experts(64, skew=1, batch=64))
    # one sequence's verified tokens (correlated) touch fewer experts than independent ones
    assert cm.distinct_experts(4, 1) < cm.distinct_experts(4, 4)


def test_sharded_verifier_never_more_than_gather(cm):
    for rows in (1, 4, 8, 64, 256, 2048):
        for be in cm.backends:
            g = cm.verification(rows, "gather", be)
            s = cm.verification(rows, "sharded", be)
            assert sum(t.comm_bytes for t in s) <= sum(t.comm_bytes for t in g)
            assert (sum(t.comm_bytes_per_rank for t in s) ==
                rows * SHARDED_VERIFIER_BYTES_PER_ROW_PER_RANK)
            assert sum(t.time_s for t in s) <= sum(t.time_s for t in g)
    g = cm.verification(4, "gather", "nccl")
    assert sum(t.comm_bytes for t in g) == 4 * 163840 * 2  # 1.3 MB at B=1, k=3


def test_tp1_draft_streams_whole_draft_and_its_kv(cm):
    d = load_draft("lightseek-eagle3")
    tp1 = cm.estimate(Plan(k=2, draft=d, placement="tp1"), ACC)
    tp8 = cm.estimate(Plan(k=2, draft=d, placement="tp8"), ACC)
    assert tp1.total("hbm_bytes", "draft") > 6 * tp8.total("hbm_bytes", "draft")
    tli = load_draft("qwen3-0.6b-tli")  # GQA draft at TP=1: its whole KV on every rank
    short, long = (cm.estimate(Plan(k=3, draft=tli, placement="tp1", context=c), ACC)
                   for c in (1024, 65536))
    # 64k tokens x 28 layers x 8 KV heads x 128 x 2 (K, V) x 1 byte = 3.8 GB per forward
    assert long.total("hbm_bytes", "draft") > 3 * short.total("hbm_bytes", "draft")


def test_memory_check_rejects_oversized_placements(cm):
    mtp = load_draft("modular-mtp")  # 384 INT4 experts replicated do not fit beside the target
    assert not cm.estimate(Plan(k=1, draft=mtp, placement="tp1"), ACC).fits
    assert cm.estimate(Plan(k=1, draft=mtp, placement="tp8"), ACC).fits
    assert cm.no_spec(context=131072).fits  # fp8 KV: 128k fits at batch 1


def test_variants_only_ever_help_when_they_should(cm):
    d = load_draft("lightseek-eagle3-mla")
    p = Plan(k=3, draft=d)
    base = cm.estimate(p, ACC)
    hidden = cm.estimate(p, ACC, Variant(hide_draft_behind_comm=True))
    assert hidden.step_s <= base.step_s and all(t.time_s >= 0 for t in hidden.terms)
    fewer = cm.estimate(p, ACC, Variant(verify_tokens_per_seq=2.5))
    assert fewer.step_s < base.step_s and fewer.tau == base.tau
    assert cm.estimate(p, ACC, Variant(tau=3.5)).tau == 3.5


def test_params_refuse_meaningless_values():
    with pytest.raises(ValueError):
        CalibParams(0.0, 1.0)
    with pytest.raises(ValueError):
        CalibParams(0.8, float("nan"))
    with pytest.raises(ValueError):
        Plan(k=2)
    with pytest.raises(ValueError):
        Plan(placement="tp4")


def test_unknown_backend_lists_valid(cm):
    with pytest.raises(KeyError, match="custom_oneshot"):
        cm.estimate(Plan(backend="carrier-pigeon"))
