"""Patch 0009: ``replicate_draft_embedding`` for sharded EAGLE/EAGLE-3/MTP
drafts, at TP=2 over gloo with vLLM's real EAGLE-3 classes and its real
``load_eagle_model``: a sharded draft with a full embedding copy on every
rank makes 3 collectives per draft token (not 4) and drafts the same tokens.
The configuration side is in tests/vllm/test_patch_0009_replicate_draft_embedding_config.py.
"""

from __future__ import annotations

import pytest

from testkit.checkpoints import TinyKimiSpec
from testkit.draft_scenarios import (
    expected_draft_pass,
    has_replicated_embedding_patch,
    summarize,
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.distributed,
    pytest.mark.skipif(not has_replicated_embedding_patch(),
                       reason="running vLLM lacks patch 0009 "
                              "(SpeculativeConfig.replicate_draft_embedding)"),
]

TARGET = TinyKimiSpec()
ROWS = 2  # DRAFT_TP_ROWS of draft_tp_results (tests/distributed/conftest.py)


@pytest.mark.parametrize("name", ["llama-repl", "mla-repl", "llama-shared-repl"])
def test_replicated_embedding_is_three_per_token(draft_tp_results, name):
    res = draft_tp_results[0][name]
    got = summarize(res["summary"])
    assert got.pop("other") == 0
    assert got == expected_draft_pass(num_layers=1, hidden=64, draft_vocab=1280, tp=2,
                                      rows=ROWS, placement="replicated_embedding")
    assert got["all_reduce"] + got["all_gather"] == 3
    assert res["shapes"]["model.embed_tokens.weight"] == (TARGET.vocab_size, 64)
    if "shared" not in name:  # same head, sharded embedding: same drafts
        assert res["tokens"] == draft_tp_results[0][name.replace("-repl", "")]["tokens"]
    assert {tuple(r[name]["tokens"]) for r in draft_tp_results} == {tuple(res["tokens"])}
