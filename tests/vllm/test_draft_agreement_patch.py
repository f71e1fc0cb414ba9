"""The opt-in draft-agreement check is a runtime patch of the speculator's
``agree_on_draft_tokens`` (applied by the plugin only with
VLLM_KIMI_EXT_CHECK_DRAFT_AGREEMENT=1);
its collective behaviour is tested at TP=2 in test_draft_tp_unsharded.py."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.vllm]


def test_patch_wraps_the_agreement_step_and_reverts():
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    from vllm_kimi_ext.runtime.draft_model_speculator import (
        DraftModelSpeculatorAgreementCheck as Check,
    )

    original = DraftModelSpeculator.__dict__.get("agree_on_draft_tokens")
    Check.apply()
    try:
        assert DraftModelSpeculator.agree_on_draft_tokens is not original
    finally:
        Check.revert()
    assert DraftModelSpeculator.__dict__.get("agree_on_draft_tokens") is original


def test_patch_checks_only_unsharded_drafts(monkeypatch):
    """The patched step hands each rank's own tokens to the check exactly when the
    draft runs un-sharded, then returns what vLLM's step returns."""
    from types import SimpleNamespace

    import torch

    from vllm_kimi_ext.integration import draft_agreement as agreement
    from vllm_kimi_ext.runtime.draft_model_speculator import (
        DraftModelSpeculatorAgreementCheck as Check,
    )

    checked = []
    monkeypatch.setattr(agreement, "check_draft_agreement", checked.append)
    tokens = torch.tensor([[4, 5]])
    rank0 = torch.tensor([[4, 6]])
    monkeypatch.setattr(Check, "original", classmethod(
        lambda cls, name: lambda self, draft_tokens: rank0))
    sharded = SimpleNamespace(draft_runs_unsharded=False)
    unsharded = SimpleNamespace(draft_runs_unsharded=True)
    step = Check.__dict__["agree_on_draft_tokens"]
    assert step(sharded, tokens) is rank0 and checked == []
    assert step(unsharded, tokens) is rank0 and checked == [tokens]


def test_single_rank_is_a_no_op():
    import torch

    from vllm_kimi_ext.integration.draft_agreement import check_draft_agreement

    check_draft_agreement(torch.tensor([[1, 2, 3]]))  # TP=1: nothing to compare


def test_enabled_by_env():
    from vllm_kimi_ext import runtime

    ref = "draft_model_speculator:DraftModelSpeculatorAgreementCheck"
    assert ref not in runtime.selected({})
    assert ref in runtime.selected({"VLLM_KIMI_EXT_CHECK_DRAFT_AGREEMENT": "1"})
