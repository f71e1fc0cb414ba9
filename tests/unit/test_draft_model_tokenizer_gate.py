"""The plugin's config-time gate for ``method: draft_model`` refuses a draft whose
Kimi-format tokenizer changes what the target's ids mean (vLLM only compares
vocab sizes), and lets compatible ones through."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from testkit.tokenizers import write_kimi_tokenizer, write_variant
from vllm_kimi_ext.drafts.hook import _check_draft_tokenizer
from vllm_kimi_ext.tokenizers import TokenizerMismatchError


def _cfg(path):
    return SimpleNamespace(model=str(path), tokenizer=str(path))


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return write_kimi_tokenizer(tmp_path_factory.mktemp("target"), n_ranks=512)


def test_identical_tokenizer_passes(target, tmp_path):
    draft = write_variant(tmp_path / "draft", "identical", n_ranks=512)
    _check_draft_tokenizer(_cfg(target), _cfg(draft))


@pytest.mark.parametrize("variant,keyword", [("shifted_ranks", "rank"),
                                             ("special_move", "</think>")])
def test_incompatible_tokenizer_is_refused_with_reasons(target, tmp_path, variant, keyword):
    draft = write_variant(tmp_path / "draft", variant, n_ranks=512)
    with pytest.raises(TokenizerMismatchError) as err:
        _check_draft_tokenizer(_cfg(target), _cfg(draft))
    # the reasons are listed (their exact wording is tested in test_tokenizer_check.py)
    assert keyword in str(err.value).lower()


def test_non_kimi_tokenizers_are_skipped_not_refused(tmp_path, target, caplog):
    (tmp_path / "hf-draft").mkdir()
    _check_draft_tokenizer(_cfg(target), _cfg(tmp_path / "hf-draft"))
    import logging

    with caplog.at_level(logging.INFO, logger="vllm_kimi_ext"):
        _check_draft_tokenizer(_cfg(target), _cfg(tmp_path / "hf-draft"))
    assert "tokenizer check skipped" in caplog.text
