"""``kimi_tli`` adds no collective to drafting, counted (vLLM's classes, gloo TP=2).

One draft step of the TLI speculator (input projection + the draft's forward +
logits + scatter onto target ids) makes exactly the collectives of the same
draft run plainly as ``draft_model`` does: 2L+1 all-reduces of rows x hidden
bf16 and one logits all-gather of rows x (padded draft vocab / TP) bf16, with L
and the sizes read from the draft's config.  Ranks agree token for token.
"""

from __future__ import annotations

import pytest

from testkit.draft_scenarios import expected_draft_pass, summarize

pytestmark = [pytest.mark.vllm, pytest.mark.distributed]

ROWS = 4  # TLI_ROWS of tli_tp2_results (tests/distributed/conftest.py)


@pytest.fixture(scope="module")
def tp2(tli_tp2_results):
    """``tli_draft_collectives`` over ROWS rows, from the tier's shared TP=2 rank set."""
    return tli_tp2_results


def test_tli_draft_step_adds_no_collective(tp2):
    res = tp2[0]
    tli, plain = summarize(res["tli"]), summarize(res["plain"])
    assert tli.pop("other") == 0 and plain.pop("other") == 0
    expected = expected_draft_pass(num_layers=res["num_layers"], hidden=res["hidden"],
                                   draft_vocab=res["draft_vocab"], tp=2, rows=ROWS)
    assert plain == expected
    assert tli == plain
    assert tli["all_reduce"] + tli["all_gather"] == 2 * res["num_layers"] + 2


def test_ranks_agree_and_match_the_hand_mapped_plain_draft(tp2):
    assert tp2[0]["tokens"] == tp2[1]["tokens"]
    assert tp2[0]["tli"] == tp2[1]["tli"]
    assert tp2[0]["tokens"] == tp2[0]["plain_tokens_mapped"]
