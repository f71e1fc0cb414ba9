"""The recommender: only what can be built, sane limits, explicit requirements, the band."""

from __future__ import annotations

import pytest

from vllm_kimi_ext import patch_ids
from vllm_kimi_ext.costmodel import Acceptance, CostModel, load_draft
from vllm_kimi_ext.costmodel.acceptance import from_draft_profile
from vllm_kimi_ext.costmodel.recommend import (
    enumerate_options,
    recommend,
    requirements,
)


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
    assert any("No speculation" in line for line in rec.explanation)


def test_never_recommends_what_cannot_be_built(cm, lightseek):
    every = enumerate_options(cm, [lightseek, (load_draft("zlab-dflash"),
                                               Acceptance.from_tau(3.7, 7))], k_max=3)
    assert any(not o.buildable for o in every)  # the one-shot all-reduce, DFlash at TP=1
    rec = recommend(cm, [lightseek])
    assert all(o.buildable for o in rec.options)
    assert rec.best.plan.backend == "nccl"
    assert "custom_oneshot" in cm.backends  # costed for the what-if table, never recommended


def test_picks_speculation_with_card_acceptance(cm, lightseek):
    rec = recommend(cm, [lightseek])
    p = rec.best.plan
    assert p.speculative and 1 <= p.k <= 7
    assert rec.best.tokens_per_s > rec.no_spec_best.tokens_per_s
    assert rec.best.tokens_per_s >= rec.fastest.tokens_per_s * 0.98
    d = rec.to_dict()
    assert d["recommended"]["k"] == p.k and d["explanation"] and d["caveats"]


def test_stock_only_uses_no_project_feature(cm, lightseek):
    rec = recommend(cm, [lightseek], stock_only=True)
    for o in rec.options:
        assert o.stock
        if o.plan.speculative:
            assert (o.plan.placement, o.plan.verifier, o.plan.vocab) == ("tp8", "gather", "full")


def test_requirements_are_named_and_classified(cm, lightseek, tmp_path, monkeypatch):
    from vllm_kimi_ext.costmodel import verify_measured as vm

    monkeypatch.setattr(vm, "DEFAULT_REPORT", tmp_path / "absent.json")
    opts = enumerate_options(cm, [lightseek], k_max=2)
    by = {(o.plan.k, o.plan.placement, o.plan.vocab, o.plan.verifier, o.plan.backend): o
          for o in opts}
    assert by[(1, "tp8", "full", "gather", "nccl")].requires == ()
    sharded = by[(1, "tp8", "full", "sharded", "nccl")]
    # offered only where measured verify steps price it below stock (test_verify_cost.py)
    assert not sharded.buildable and any("not measured" in str(r) for r in sharded.requires)
    assert any(patch_ids.ref(*patch_ids.DRAFT_TP1) in str(r)
               for r in by[(1, "tp1", "full", "gather", "nccl")].requires)
    assert any(patch_ids.ref("replicate-draft-embedding") in str(r)
               for r in by[(1, "tp8-repemb", "full", "gather", "nccl")].requires)
    assert any("32K" in str(r) for r in by[(1, "tp8", "reduced", "gather", "nccl")].requires)
    oneshot = by[(0, "tp8", "full", "gather", "custom_oneshot")]
    assert not oneshot.buildable and any("refuses" in str(r) for r in oneshot.requires)


def test_project_drafts_are_buildable_with_their_patches(cm):
    mtp = load_draft("modular-mtp")
    plan = enumerate_options(cm, [(mtp, Acceptance.from_tau(1.39, 1))], k_max=1)[-1].plan
    req = requirements(cm, plan)
    mtp_patch = patch_ids.number("kimi-k25-mtp")
    assert any(mtp_patch in str(r) for r in req) and all(r.buildable for r in req
                                                         if mtp_patch in str(r))
    dflash = load_draft("zlab-dflash")
    opts = enumerate_options(cm, [(dflash, Acceptance.from_tau(3.7, 7))], k_max=1)
    tp1 = [o for o in opts if o.plan.placement == "tp1"]
    assert tp1 and all(not o.buildable for o in tp1)  # no patch builds a block drafter at TP=1


def test_better_acceptance_never_lowers_the_recommendation(cm, lightseek):
    d, _ = lightseek
    prev = 0.0
    for tau in (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0):
        rec = recommend(cm, [(d, Acceptance.from_tau(tau, 3))], tolerance=0.0)
        assert rec.best.tokens_per_s >= prev
        prev = rec.best.tokens_per_s


def test_large_drafts_stay_sharded_on_pcie(cm, lightseek):
    assert recommend(cm, [lightseek]).best.plan.placement in ("tp8", "tp8-repemb")


def test_within_tolerance_the_fewest_changes_win(cm):
    """Planted bug: ``pick`` without ``len(o.requires)`` in its key recommends the
    replicated-embedding patch for a 1 % gain; this fails with placement 'tp8-repemb'."""
    from vllm_kimi_ext.costmodel.acceptance import field_figures

    d = load_draft("lightseek-eagle3-mla")
    pair = [(d, field_figures(d.acceptance)[0])]
    rec = recommend(cm, pair)
    fastest, best = rec.fastest, rec.best
    assert fastest.requires and fastest.plan.placement == "tp8-repemb"  # precondition
    assert best.tokens_per_s >= fastest.tokens_per_s * (1 - 0.02)
    assert best.plan.placement == "tp8" and not best.requires, best.plan
    # with no tolerance the faster option wins despite its requirement
    assert recommend(cm, pair, tolerance=0.0).best.plan.placement == "tp8-repemb"
