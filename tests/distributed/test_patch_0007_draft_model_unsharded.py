"""Patch 0007: ``draft_tensor_parallel_size: 1`` for standalone draft models
(``draft_model`` and ``kimi_tli``), counted at TP=2 on vLLM's classes (gloo).

A tiny dense Qwen3 draft with a Hugging Face byte-level tokenizer of another
family drafts for the tiny Kimi-K2.5 target through ``kimi_tli``.  Sharded like
the target, one draft step makes 2L+1 all-reduces + 1 logits all-gather; with
``draft_tensor_parallel_size: 1`` the draft is whole on every rank (full
o_proj) and makes none, and proposes the same tokens. Greedy drafting: with
``draft_sample_method: probabilistic`` the patches keep the draft sharded (ranks
share draft tokens, not draft probabilities).
"""

from __future__ import annotations

import pytest

from testkit.draft_scenarios import expected_draft_pass, summarize

pytestmark = [pytest.mark.vllm, pytest.mark.distributed]

ROWS = 4  # TLI_ROWS of tli_placement_tp2_results (tests/distributed/conftest.py)


@pytest.fixture(scope="module")
def setup(tli_target, tli_qwen3_draft):
    return tli_target, tli_qwen3_draft


@pytest.fixture(scope="module")
def tp2(tli_placement_tp2_results):
    """``tli_placement_collectives`` over ROWS rows, from the tier's shared TP=2 rank set."""
    return tli_placement_tp2_results


def test_sharded_dense_draft_costs_2L_plus_2(tp2, setup):
    _, draft = setup
    got = summarize(tp2[0]["sharded"]["summary"])
    assert got.pop("other") == 0
    assert got == expected_draft_pass(num_layers=draft.num_hidden_layers,
                                      hidden=draft.hidden_size,
                                      draft_vocab=draft.vocab_size, tp=2, rows=ROWS)
    assert tp2[0]["sharded"]["o_proj"] == (draft.hidden_size, 32)  # 4 heads x 16 / 2


def test_draft_tp1_makes_no_collective_and_proposes_the_same_tokens(tp2, setup):
    _, draft = setup
    for rank in tp2:
        res = rank["tp1"]
        got = summarize(res["summary"])
        assert got == {"all_reduce": 0, "all_reduce_bytes": 0, "all_gather": 0,
                       "all_gather_bytes": 0, "other": 0}
        assert res["runs_unsharded"]
        assert res["o_proj"] == (draft.hidden_size, 64)  # whole
        assert res["tokens"] == rank["sharded"]["tokens"]
    assert tp2[0]["tp1"]["tokens"] == tp2[1]["tp1"]["tokens"]


def test_probabilistic_drafting_keeps_the_sharded_draft(tp2, setup):
    # refused by name at configuration time (a warning), so nothing changes: the same
    # sharded draft step as without draft TP 1
    for rank in tp2:
        res = rank["tp1-probabilistic"]
        assert not res["runs_unsharded"]
        assert res["o_proj"] == rank["sharded"]["o_proj"]
        assert summarize(res["summary"]) == summarize(rank["sharded"]["summary"])
