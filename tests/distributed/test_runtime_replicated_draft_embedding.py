"""Runtime patch R08 (``VLLM_KIMI_EXT_REPLICATE_DRAFT_EMBEDDING``, formerly a git
patch): a sharded EAGLE-3 draft loaded by vLLM's real ``load_eagle_model`` at TP=2 over
gloo, then given a whole embedding copy by the plugin's product code, makes 3
collectives per draft token (not 4) and drafts the same tokens. The patch wiring and
the configuration side are in tests/vllm/test_runtime_replicated_draft_embedding_config.py.
"""

from __future__ import annotations

import pytest

from testkit.checkpoints import TinyKimiSpec
from testkit.draft_scenarios import expected_draft_pass, summarize

pytestmark = [pytest.mark.vllm, pytest.mark.distributed]

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
