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

    from vllm_kimi_ext.drafts.agreement import agreement_patch

    original = TargetDependentARSpeculator.__dict__.get("propose")
    patch = agreement_patch()
    assert patch is agreement_patch()  # one class per process
    patch.apply()
    try:
        assert TargetDependentARSpeculator.propose is not original
    finally:
        patch.revert()
    assert TargetDependentARSpeculator.__dict__.get("propose") is original


def test_single_rank_is_a_no_op():
    import torch

    from vllm_kimi_ext.drafts.agreement import check_draft_agreement

    check_draft_agreement(torch.tensor([[1, 2, 3]]))  # TP=1: nothing to compare


def test_enabled_by_env(monkeypatch):
    from vllm_kimi_ext.drafts import agreement

    monkeypatch.delenv(agreement.CHECK_ENV, raising=False)
    assert not agreement.check_enabled()
    monkeypatch.setenv(agreement.CHECK_ENV, "1")
    assert agreement.check_enabled()
