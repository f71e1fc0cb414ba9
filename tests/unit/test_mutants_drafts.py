"""Tests written for mutants of drafts/ that `nox -s mutants` found surviving."""

from __future__ import annotations

import pytest

from testkit.tli_scenarios import write_hf_bytelevel_tokenizer
from testkit.tokenizers import write_kimi_tokenizer
from vllm_kimi_ext.drafts.tli.maps import TLIConfigError, build_tli_maps


def test_min_shared_tokens_is_inclusive_down_to_a_single_shared_token(tmp_path):
    """A draft sharing exactly one token with the target passes the default
    ``min_shared_tokens`` (1); the bound is ``>=`` at every value."""
    target = write_kimi_tokenizer(tmp_path / "target", n_ranks=512)
    draft = tmp_path / "draft"
    draft.mkdir()
    write_hf_bytelevel_tokenizer(draft, [b"\xff\xfe\xfd#", b"a"])  # only b"a" is shared
    maps = build_tli_maps(target, draft)
    assert maps.intersection.size == 1
    assert build_tli_maps(target, draft, min_shared_tokens=1).intersection.size == 1
    with pytest.raises(TLIConfigError, match=r"share 1 tokens \(< 2 required\)"):
        build_tli_maps(target, draft, min_shared_tokens=2)
