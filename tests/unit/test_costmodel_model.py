"""Limits and monotonicity of the decode cost model (pure Python, no vLLM)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from vllm_kimi_ext.costmodel import Acceptance, CalibParams, CostModel, Plan, load_draft
from vllm_kimi_ext.costmodel.catalog import list_profiles
from vllm_kimi_ext.costmodel.model import SHARDED_VERIFIER_BYTES_PER_ROW_PER_RANK

DRAFTS = list_profiles("drafts")
ACC = Acceptance.from_tau(2.7, 3)


@pytest.fixture(scope="module")
def cm() -> CostModel:
    return CostModel.build("rtx-pro-6000-pcie-x8")


def plans(cm, draft_names=DRAFTS, ks=(1, 3, 7), batches=(1, 8)):
    for name in draft_names:
        d = load_draft(name)
        for k in ks:
            for pl in ("tp1", "tp8"):
                for vo in cm.vocab_options(d):
                    for ve in ("gather", "sharded"):
                        for be in cm.backends:
                            for b in batches:
                                yield Plan(k=k, draft=d, placement=pl, vocab=vo, verifier=ve,
                                           backend=be, batch=b)


def test_target_matches_published_sizes(cm):
    m = cm.model
    # published: ~1.04T parameters (text stack here, no vision tower), ~32B active
    assert 1.0e12 < m.total_params() < 1.06e12
    assert 31e9 < m.active_params() < 34e9
    # commonly quoted 4.1-5.7 GB/GPU/token excludes the replicated routers; the model adds them
    w = cm.target_weight_bytes(1)
    assert 5.7e9 < sum(w.values()) < 6.2e9
    assert sum(w.values()) - w["router"] == pytest.approx(5.70e9, rel=0.01)


def test_k0_is_exactly_no_speculation(cm):
    d = load_draft("lightseek-eagle3")
    for be in cm.backends:
        for batch in (1, 4):
            base = cm.no_spec(batch=batch, backend=be)
            for pl in ("tp1", "tp8"):
                for ve in ("gather", "sharded"):
                    e = cm.estimate(Plan(k=0, draft=d, placement=pl, verifier=ve, backend=be,
                                         batch=batch), ACC)
                    assert e.step_s == base.step_s
                    assert e.tokens_per_s == base.tokens_per_s
                    assert e.tau == 1.0
                    assert e.collectives_per_step == base.collectives_per_step
                    assert e.total("comm_bytes") == base.total("comm_bytes")


def test_no_spec_collective_counts(cm):
    e = cm.no_spec()
    assert cm.code_allreduce_per_pass() == 123
    target = [t for t in e.terms if t.phase == "target" and t.collectives]
    assert sum(t.allreduces for t in target) == 123
    # 123 from code + 4 unattributed = the 127 the public profile reported, + 1 gather
    assert sum(t.allreduces for t in e.terms) == 127
    assert e.collectives_per_step == 128
    code = CostModel.build("rtx-pro-6000-pcie-x8", count_mode="code").no_spec()
    assert code.collectives_per_step == 124


def test_speculative_collectives(cm):
    d = load_draft("lightseek-eagle3")  # one layer: 2L + 2 = 4 per draft forward at TP=8
    tp8 = cm.estimate(Plan(k=3, draft=d, placement="tp8"), ACC)
    tp1 = cm.estimate(Plan(k=3, draft=d, placement="tp1"), ACC)
    assert tp8.total("collectives", "draft") == 3 * 4
    assert tp1.total("collectives", "draft") == 0
    dflash = load_draft("zlab-dflash")  # one pass of L=5 layers: 12 per step
    e = cm.estimate(Plan(k=5, draft=dflash, placement="tp8"), ACC)
    assert e.total("collectives", "draft") == 2 * dflash.num_layers + 2
    assert tp8.collectives_per_token == pytest.approx(tp8.collectives_per_step / ACC.tau(3))


def test_bytes_never_negative_and_finite(cm):
    for p in plans(cm):
        e = cm.estimate(p, ACC)
        for t in e.terms:
            assert t.time_s >= 0 and t.hbm_bytes >= 0 and t.comm_bytes >= 0
            assert t.comm_bytes_per_rank >= 0 and t.collectives >= 0
        assert math.isfinite(e.tokens_per_s) and e.tokens_per_s > 0
        assert e.memory_gb_per_gpu > 0


def test_higher_acceptance_never_hurts(cm):
    rates = [0.0, 0.2, 0.5, 0.8, 0.95, 1.0]
    for p in plans(cm, ["lightseek-eagle3", "zlab-dflash"], ks=(1, 4, 7), batches=(1,)):
        tps = [cm.estimate(p, Acceptance.from_conditional([a] * 7)).tokens_per_s
               for a in rates]
        assert tps == sorted(tps)


def test_faster_link_or_memory_never_slows_a_step(cm):
    fast_link = cm.with_latency(cm.latency.scaled(0.5))
    less_skew = cm.with_params(dataclasses.replace(cm.params, collective_overhead_us=1.0))
    more_bw = cm.with_hardware(cm.hw.with_overrides(
        memory_bandwidth_GBps=cm.hw.memory_bandwidth_GBps * 1.5))
    for p in plans(cm, ["lightseek-eagle3", "modular-mtp"], ks=(1, 5), batches=(1, 16)):
        step = cm.estimate(p, ACC).step_s
        for other in (fast_link, less_skew, more_bw):
            assert other.estimate(p, ACC).step_s <= step


def test_more_distinct_experts_more_bytes(cm):
    m = cm.model
    prev = 0.0
    for n in range(1, 200):
        e = m.expected_distinct_experts(n)
        assert prev < e <= m.n_routed_experts
        prev = e
    assert m.expected_distinct_experts(1) == pytest.approx(8.0)
    # uniform routing: E[d] = 384 (1 - (1 - 8/384)^n)
    assert m.expected_distinct_experts(4) == pytest.approx(384 * (1 - (1 - 8 / 384) ** 4))
    # correlated routing (skew > 1) touches fewer experts, never fewer than one token's 8
    for n in (2, 8, 64):
        assert 8 < m.expected_distinct_experts(n, skew=4) < m.expected_distinct_experts(n)
    byts = [cm.target_weight_bytes(n)["routed_experts"] for n in (1, 2, 4, 8, 32)]
    assert byts == sorted(byts) and len(set(byts)) == len(byts)
    skewed = cm.with_model(dataclasses.replace(m, routing_skew=4.0))
    d = load_draft("lightseek-eagle3")
    p = Plan(k=3, draft=d)
    assert skewed.estimate(p, ACC).total("hbm_bytes") < cm.estimate(p, ACC).total("hbm_bytes")
    assert skewed.estimate(p, ACC).step_s < cm.estimate(p, ACC).step_s


def test_sharded_verifier_never_more_than_gather(cm):
    for rows in (1, 4, 8, 64, 256, 2048):
        for be in cm.backends:
            g = cm.verification(rows, "gather", be)
            s = cm.verification(rows, "sharded", be)
            assert sum(t.comm_bytes for t in s) <= sum(t.comm_bytes for t in g)
            assert sum(t.comm_bytes_per_rank for t in s) == \
                rows * SHARDED_VERIFIER_BYTES_PER_ROW_PER_RANK
            assert sum(t.time_s for t in s) <= sum(t.time_s for t in g)
            assert sum(t.hbm_bytes for t in s) <= sum(t.hbm_bytes for t in g)
    # the stock payload: [B(k+1), 163840] bf16 = 1.3 MB at B=1, k=3
    g = cm.verification(4, "gather", "nccl")
    assert sum(t.comm_bytes for t in g) == 4 * 163840 * 2


def test_tp1_draft_streams_whole_draft_without_collectives(cm):
    d = load_draft("lightseek-eagle3")
    tp1 = cm.estimate(Plan(k=2, draft=d, placement="tp1"), ACC)
    tp8 = cm.estimate(Plan(k=2, draft=d, placement="tp8"), ACC)
    assert tp1.total("hbm_bytes", "draft") > 6 * tp8.total("hbm_bytes", "draft")
    red = cm.estimate(Plan(k=2, draft=d, placement="tp1", vocab="reduced"), ACC)
    assert red.total("hbm_bytes", "draft") < tp1.total("hbm_bytes", "draft")
    # reduced vocabulary lowers acceptance by the assumed coverage per position
    assert red.tau < tp1.tau


def test_memory_check_rejects_oversized_placements(cm):
    # the MTP layer (384 INT4 experts) replicated on every GPU does not fit beside the target
    mtp = load_draft("modular-mtp")
    assert not cm.estimate(Plan(k=1, draft=mtp, placement="tp1"), ACC).fits
    assert cm.estimate(Plan(k=1, draft=mtp, placement="tp8"), ACC).fits
    assert cm.no_spec().fits


def test_batch_scales_aggregate_not_per_request(cm):
    one, many = cm.no_spec(batch=1), cm.no_spec(batch=16)
    assert many.tokens_per_s > 4 * one.tokens_per_s
    assert many.tokens_per_s_per_request < one.tokens_per_s_per_request


def test_plan_validation():
    with pytest.raises(ValueError):
        Plan(k=2)  # no draft
    with pytest.raises(ValueError):
        Plan(placement="tp4")
    with pytest.raises(ValueError):
        CalibParams(0.0, 1.0)


def test_unknown_backend_lists_valid(cm):
    with pytest.raises(KeyError, match="custom_oneshot"):
        cm.estimate(Plan(backend="carrier-pigeon"))
