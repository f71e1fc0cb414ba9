"""One forward of the tiny Kimi-K2.5 target at TP=2 makes exactly the collectives
its config implies (counted by instrumenting vLLM's GroupCoordinator), and the
check fails when a collective is added."""

from __future__ import annotations

import pytest

from testkit.tp_scenarios import count_discrepancies

pytestmark = [pytest.mark.vllm, pytest.mark.distributed]


@pytest.fixture()
def tp2_results(tp2_target_results):
    return tp2_target_results


def test_target_pass_counts_match_config(tp2_results):
    for rank, res in enumerate(tp2_results):
        assert res["unwritten"] == []
        assert count_discrepancies(res["clean"], res["expected"]) == [], f"rank {rank}"
    # SPMD: both ranks made the same calls and computed the same logits
    r0, r1 = tp2_results
    assert r0["clean"] == r1["clean"]
    assert r0["logits_row0"] == r1["logits_row0"]
    # the logits gather is labelled as such, the all-reduces are the target pass
    phases = {(p, op) for (_, p, op) in r0["clean"]}
    assert phases == {("target", "all_reduce"), ("logits", "all_gather")}


def test_an_added_collective_is_caught(tp2_results):
    res = tp2_results[0]
    problems = count_discrepancies(res["planted"], res["expected"])
    assert problems and problems[0].startswith("all_reduce: expected")
