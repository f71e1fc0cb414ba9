"""The recommender: sane choices at the limits, explicit requirements, an explanation."""

from __future__ import annotations

import pytest

from vllm_kimi_ext.costmodel import Acceptance, CostModel, load_draft, recommend
from vllm_kimi_ext.costmodel.acceptance import from_draft_profile
from vllm_kimi_ext.costmodel.recommend import enumerate_options


@pytest.fixture(scope="module")
def cm() -> CostModel:
    return CostModel.build("rtx-pro-6000-pcie-x8")


@pytest.fixture(scope="module")
def lightseek():
    d = load_draft("lightseek-eagle3")
    return d, from_draft_profile(d.acceptance)


@pytest.mark.parametrize("rate", [0.0, 0.01, 0.05])
def test_picks_no_speculation_when_nothing_is_accepted(cm, lightseek, rate):
    d, _ = lightseek
    rec = recommend(cm, [(d, Acceptance.from_conditional([rate]))])
    assert not rec.best.plan.speculative
    assert rec.best.plan.k == 0
    assert any("No speculation" in line for line in rec.explanation)


def test_picks_speculation_with_reported_acceptance(cm, lightseek):
    rec = recommend(cm, [lightseek])
    p = rec.best.plan
    assert p.speculative and 1 <= p.k <= 7
    assert p.placement in ("tp1", "tp8") and p.verifier in ("gather", "sharded")
    assert rec.best.tokens_per_s > rec.no_spec_best.tokens_per_s
    assert rec.speedup_vs_stock > 1
    # within the tolerance of the fastest, and never beaten by it by more
    assert rec.best.tokens_per_s >= rec.fastest.tokens_per_s * 0.98
    assert rec.best.estimate.fits
    d = rec.to_dict()
    assert d["recommended"]["k"] == p.k and d["explanation"] and d["caveats"]


def test_stock_only_uses_no_project_feature(cm, lightseek):
    rec = recommend(cm, [lightseek], stock_only=True)
    for o in rec.options:
        assert o.stock
        assert o.plan.backend != "custom_oneshot"
        if o.plan.speculative:
            assert o.plan.placement == "tp8" and o.plan.verifier == "gather"
            assert o.plan.vocab == "full"
    assert rec.best_stock is rec.best


def test_requirements_are_named(cm, lightseek):
    opts = enumerate_options(cm, [lightseek], k_max=2)
    by = {(o.plan.k, o.plan.placement, o.plan.vocab, o.plan.verifier, o.plan.backend): o
          for o in opts}
    assert by[(1, "tp8", "full", "gather", "nccl")].requires == ()
    assert any("sharded verifier" in r for r in by[(1, "tp8", "full", "sharded", "nccl")].requires)
    assert any("TP=1" in r for r in by[(1, "tp1", "full", "gather", "nccl")].requires)
    assert any("32K" in r for r in by[(1, "tp8", "reduced", "gather", "nccl")].requires)
    assert any("refuses" in r for r in by[(0, "tp8", "full", "gather", "custom_oneshot")].requires)


def test_better_acceptance_never_lowers_the_recommendation(cm, lightseek):
    d, _ = lightseek
    prev = 0.0
    for tau in (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0):
        rec = recommend(cm, [(d, Acceptance.from_tau(tau, 3))], tolerance=0.0)
        assert rec.best.tokens_per_s >= prev
        prev = rec.best.tokens_per_s


def test_large_drafts_go_to_tp8_on_pcie(cm, lightseek):
    rec = recommend(cm, [lightseek])
    assert rec.best.plan.placement == "tp8"


def test_nvlink_box_runs_uncalibrated_with_caveat(lightseek):
    nv = CostModel.build("h200-nvlink-x8")
    rec = recommend(nv, [lightseek])
    assert not rec.calibrated
    assert any("no published figure" in c for c in rec.caveats)
    pcie = recommend(CostModel.build("rtx-pro-6000-pcie-x8"), [lightseek])
    assert rec.no_spec_stock.tokens_per_s > pcie.no_spec_stock.tokens_per_s
