"""Canary: the doctor's picture of which draft classes vLLM 0.34.0 can build
(vllm_kimi_ext.drafts.doctor.draft_kinds) matches the installed registry and EAGLEConfig's
renaming. When it fails after an upgrade, update EAGLE3_ARCHITECTURES /
DFLASH_ARCHITECTURES / resolved_architecture there."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.canary]


def test_draft_architecture_sets_match_the_registry():
    from vllm.model_executor.models.registry import _SPECULATIVE_DECODING_MODELS

    from vllm_kimi_ext.drafts.doctor.draft_kinds import DFLASH_ARCHITECTURES, EAGLE3_ARCHITECTURES

    names = set(_SPECULATIVE_DECODING_MODELS)
    eagle3 = {n for n in names if n.startswith("Eagle3") or n.endswith("Eagle3")}
    dflash = {n for n in names if n.startswith("DFlash") or n.endswith("DFlash")}
    assert eagle3 == EAGLE3_ARCHITECTURES
    assert dflash | {"LiLiCorrDraftModel"} == DFLASH_ARCHITECTURES


def test_eagle_config_renames_architectures_as_mirrored():
    """EAGLEConfig keeps Eagle3*/...Eagle3 and DFlash*/...DFlash names and prefixes
    any other, as draft_kinds.resolved_architecture assumes."""
    import inspect

    from vllm.transformers_utils.configs.eagle import EAGLEConfig

    src = inspect.getsource(EAGLEConfig.__init__)
    assert 'arch.startswith("Eagle3") or arch.endswith("Eagle3")' in src
    assert 'f"Eagle3{arch}"' in src and 'f"DFlash{arch}"' in src
    assert 'arch == "LiLiCorrDraftModel"' in src
