"""The opt-in draft-agreement check is a runtime patch of the speculator's
``propose`` (applied by the plugin only with VLLM_KIMI_EXT_CHECK_DRAFT_AGREEMENT=1);
its collective behaviour is tested at TP=2 in test_draft_tp_unsharded.py."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.vllm]


def test_patch_wraps_propose_and_reverts():
    from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator import (
        TargetDependentARSpeculator,
    )

    from vllm_kimi_ext.runtime.target_dependent_ar_speculator import (
        TargetDependentARSpeculatorAgreementCheck as Check,
    )

    original = TargetDependentARSpeculator.__dict__.get("propose")
    Check.apply()
    try:
        assert TargetDependentARSpeculator.propose is not original
    finally:
        Check.revert()
    assert TargetDependentARSpeculator.__dict__.get("propose") is original


def test_patch_checks_only_unsharded_drafts(monkeypatch):
    """The patched propose returns the stock tokens and hands them to the check
    exactly when the draft model runs un-sharded."""
    from types import SimpleNamespace

    import torch

    from vllm_kimi_ext.integration import draft_agreement as agreement
    from vllm_kimi_ext.runtime.target_dependent_ar_speculator import (
        TargetDependentARSpeculatorAgreementCheck as Check,
    )

    checked = []
    monkeypatch.setattr(agreement, "check_draft_agreement", checked.append)
    tokens = torch.tensor([[4, 5]])
    monkeypatch.setattr(Check, "original", classmethod(
        lambda cls, name: lambda self, *a, **k: tokens))
    sharded = SimpleNamespace(model=SimpleNamespace(runs_unsharded=False))
    unsharded = SimpleNamespace(model=SimpleNamespace(runs_unsharded=True))
    assert Check.__dict__["propose"](sharded) is tokens and checked == []
    assert Check.__dict__["propose"](unsharded) is tokens and checked == [tokens]


def test_single_rank_is_a_no_op():
    import torch

    from vllm_kimi_ext.integration.draft_agreement import check_draft_agreement

    check_draft_agreement(torch.tensor([[1, 2, 3]]))  # TP=1: nothing to compare


def test_enabled_by_env():
    from vllm_kimi_ext import runtime

    ref = "target_dependent_ar_speculator:TargetDependentARSpeculatorAgreementCheck"
    assert ref not in runtime.selected({})
    assert ref in runtime.selected({"VLLM_KIMI_EXT_CHECK_DRAFT_AGREEMENT": "1"})
