"""Runtime patch R08, configuration side: ``VLLM_KIMI_EXT_REPLICATE_DRAFT_EMBEDDING``
is a compile factor of the speculative config (vLLM's real config path at TP=2), acts
only on EAGLE-family methods (others are refused by name when the draft loads) and is
off unless set. The TP=2 collective counts are in
tests/distributed/test_runtime_replicated_draft_embedding.py."""

from __future__ import annotations

import types

import pytest

from testkit.runtime_patches import installed

pytestmark = pytest.mark.vllm

FLAG = "VLLM_KIMI_EXT_REPLICATE_DRAFT_EMBEDDING"


@pytest.fixture(autouse=True)
def feature():
    with installed("replicated draft embedding"):
        yield


def test_replicated_embedding_is_a_compile_factor(eagle3_tp2_compile_factors, monkeypatch):
    monkeypatch.delenv(FLAG, raising=False)
    a = eagle3_tp2_compile_factors()
    b = eagle3_tp2_compile_factors(draft_tensor_parallel_size=1)
    monkeypatch.setenv(FLAG, "1")
    c = eagle3_tp2_compile_factors()
    assert a != c and b != c


def test_other_methods_are_refused_by_name(tp2_config, draft_tp_heads, monkeypatch):
    from vllm_kimi_ext.integration import draft_embedding

    cfg = tp2_config({"method": "dflash", "model": str(draft_tp_heads / "dflash"),
                      "num_speculative_tokens": 3})
    # the speculator as load_model leaves it: its config and (here, no) draft
    speculator = types.SimpleNamespace(vllm_config=cfg, model=None)
    monkeypatch.setenv(FLAG, "1")
    with pytest.raises(draft_embedding.DraftEmbeddingError,
                       match=f"{FLAG}=1 applies to the methods eagle, eagle3, mtp, "
                             "not 'dflash'"):
        draft_embedding.after_load(speculator)
    monkeypatch.setenv(FLAG, "0")
    draft_embedding.after_load(speculator)  # off: nothing happens


def test_the_patch_wraps_the_speculators_load_model():
    from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator import (
        TargetDependentARSpeculator,
    )

    from vllm_kimi_ext.runtime.target_dependent_ar_speculator import (
        TargetDependentARSpeculatorReplicatedEmbedding as Patched,
    )

    assert TargetDependentARSpeculator.load_model is Patched.__dict__["load_model"]
    assert (Patched.original("load_model").__qualname__ ==
        "TargetDependentARSpeculator.load_model")
