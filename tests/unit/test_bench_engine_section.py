"""run_all's ``engine`` section: the numbers it derives from what the engine reports (the
engine run itself: ``nox -s bench -- --only engine``; its probes are tested by the engine
tier)."""

from __future__ import annotations

import pytest

from bench.harness import sections as S
from bench.harness.sections.engine import _markdown, engine_row


def _summary(rank: int, steps: int = 10) -> dict:
    return {"rank": rank, "steps": steps,
            "calls": {("tp", "target", "all_reduce"): 70, ("tp", "draft", "all_reduce"): 30,
                      ("tp", "target", "all_gather"): 10, ("pp", "target", "all_reduce"): 99}}


def test_engine_row_from_engine_counters():
    metrics = {"num_drafts": 8, "num_draft_tokens": 24, "num_accepted_tokens": 6,
               "accepted_per_pos": [4, 2, 0]}
    row = engine_row("ngram", [[1] * 12, [2] * 8], metrics, [_summary(0), _summary(1)], 4.0)
    assert row["output_tokens"] == 20 and row["steps"] == 10
    assert row["tokens_per_step"] == 2.0
    assert row["acceptance_length"] == pytest.approx(1 + 6 / 8)
    assert row["per_position"] == [0.5, 0.25, 0.0]
    # tp group only (the pp call is not a TP collective), per output token, per phase
    assert row["collectives_per_token"] == {"draft": 1.5, "target": 4.0}
    assert row["cpu_tokens_per_s"] == 5.0
    md = _markdown([row], "some CPU, 2 cores", 2)
    assert "this machine's CPU" in md and "not a forecast" in md
    assert "| ngram | 20 | 10 | 2.00 | 1.75 | 0.50, 0.25, 0.00 | 1.50 | 4.00 | 5.00 |" in md


def test_engine_row_without_speculation_and_rank_disagreement():
    row = engine_row("none", [[1] * 5], {"num_drafts": 0}, [_summary(0, 5)], 1.0)
    assert row["acceptance_length"] is None and row["per_position"] == []
    other = dict(_summary(1), calls={("tp", "target", "all_reduce"): 71})
    with pytest.raises(AssertionError, match="ranks counted different collectives"):
        engine_row("none", [[1] * 5], {}, [_summary(0), other], 1.0)


def test_engine_section_is_planned_where_vllm_imports(tmp_path):
    caps = {"vllm_importable": True, "cuda": {"device_count": 0}}
    why = {s.name: w for s, w in S.plan(caps, S.Context(out=tmp_path, caps=caps))}
    assert why["engine"] is None
    caps["vllm_importable"] = False
    why = {s.name: w for s, w in S.plan(caps, S.Context(out=tmp_path, caps=caps))}
    assert why["engine"] == "vLLM not importable (nox -s apply-patches)"
