"""The plugin's configuration-time draft check (`drafts.hook`) inside vLLM.

Runs on stock and patched vLLM alike: the check is a runtime patch of
`VllmConfig._limit_max_model_len_to_draft` (`runtime/vllm_config.py`), applied and
reverted here.
"""

from __future__ import annotations

import logging

import pytest

from testkit.checkpoints import TinyEagle3Spec, TinyKimiSpec, write_tiny_eagle3

pytestmark = pytest.mark.vllm


@pytest.fixture
def hook():
    from vllm_kimi_ext import runtime
    from vllm_kimi_ext.drafts import hook as hook_mod
    from vllm_kimi_ext.runtime.vllm_config import VllmConfigDraftCheck

    assert runtime.install(VllmConfigDraftCheck) == ["VllmConfigDraftCheck"]
    try:
        yield hook_mod
    finally:
        VllmConfigDraftCheck.revert()


def test_hook_refuses_reduced_vocab_head_without_d2t_at_config_time(hook, tiny_kimi_dir,
                                                                    tmp_path):
    from testkit.vllm_cpu import make_vllm_config

    draft = tmp_path / "no-d2t"
    write_tiny_eagle3(draft, TinyKimiSpec(),
                      TinyEagle3Spec(draft_vocab_size=300, with_d2t=False))
    with pytest.raises(Exception) as err:
        make_vllm_config(tiny_kimi_dir, speculative_config={
            "method": "eagle3", "model": str(draft), "num_speculative_tokens": 2})
    msg = str(err.value)
    assert "E-D2T-MISSING" in msg and "draft_vocab_size=300" in msg


def test_hook_warns_about_context_cap_and_names_requested_length(hook, tiny_kimi_dir,
                                                                  tmp_path, caplog):
    from testkit.vllm_cpu import make_vllm_config

    draft = tmp_path / "short"
    write_tiny_eagle3(draft, TinyKimiSpec(), TinyEagle3Spec(max_position_embeddings=8192))
    with caplog.at_level(logging.WARNING, logger="vllm_kimi_ext"):
        cfg = make_vllm_config(tiny_kimi_dir, max_model_len=16384, speculative_config={
            "method": "eagle3", "model": str(draft), "num_speculative_tokens": 2})
    assert cfg.model_config.max_model_len == 8192  # vLLM lowered it, as warned
    text = caplog.text
    assert "W-CONTEXT-CAP" in text and "from 16384 to 8192" in text


def test_check_speculative_config_ignores_runs_without_drafts(tiny_kimi_dir):
    from testkit.vllm_cpu import make_vllm_config
    from vllm_kimi_ext.drafts.hook import check_speculative_config

    check_speculative_config(make_vllm_config(tiny_kimi_dir))  # no speculative config


def test_skip_flag_is_read_at_call_time(hook, tiny_kimi_dir, tmp_path, monkeypatch):
    from testkit.vllm_cpu import make_vllm_config

    draft = tmp_path / "no-d2t"
    write_tiny_eagle3(draft, TinyKimiSpec(),
                      TinyEagle3Spec(draft_vocab_size=300, with_d2t=False))
    monkeypatch.setenv("VLLM_KIMI_EXT_SKIP_DRAFT_CHECK", "yes")
    make_vllm_config(tiny_kimi_dir, speculative_config={  # skipped: vLLM accepts it
        "method": "eagle3", "model": str(draft), "num_speculative_tokens": 2})
