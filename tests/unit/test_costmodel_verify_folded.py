"""The folded escalation priced (``costmodel/verify_folded_cost.py``): bytes from the plan's
own rounds, each all-gather on the PCIe model, compute from its measured report; the goal
check names every cell that misses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from vllm_kimi_ext.costmodel import verify_cost as vc
from vllm_kimi_ext.costmodel import verify_folded_cost as vf
from vllm_kimi_ext.costmodel.model import CostModel
from vllm_kimi_ext.costmodel.verify_measured import VerifyReportError
from vllm_kimi_ext.verify.protocol import plan_from_params

V = 163840


@pytest.fixture(scope="module")
def cm():
    return CostModel.build("rtx-pro-6000-pcie-x8")


def test_bytes_are_the_plans(cm):
    """The cost model's folded round equals the plan's own round at Kimi's V over 8 ranks:
    40,960 B for the first escalated request's whole row, 1,536 B for each further one; at
    batch 1 the folded plan is the whole-row plan."""
    for B in (1, 2, 9, 16, 64):
        plan = plan_from_params([{"temperature": 1.0, "top_p": 0.95}] * B, tp_size=cm.tp,
                                vocab_size=V, num_rows=4 * B, max_rows_per_req=4,
                                escalation="folded")
        name = "escalation-folded" if B > 1 else "escalation"
        assert [r.name for r in plan.rounds] == ["stats+candidates", name]
        assert plan.rounds[0].bytes_per_rank == 4 * B * vf.ROUND1_BYTES["top_p_T1"]
        assert plan.rounds[1].bytes_per_rank == vf.folded_round_bytes(cm, B) == \
            (B - 1) * 1536 + 40960


def _report(tmp_path: Path, ours: float, rows_us: float, vllm: float, bs: float) -> Path:
    cases = []
    for k in (3,):
        for mode, t in (("top_p_T1", 1.0), ("top_p_T0.6", 0.6)):
            for r in (4, 16, 64, 256):
                cases.append(dict(rows=r, k=k, mode=mode, temperature=t, top_p=0.95,
                                  ours_graph_us=ours, ours_rows_us=rows_us,
                                  vllm_graph_us=vllm, batch_sharded_us=bs,
                                  payload_bytes_per_row_per_rank=100.0, rounds=2))
    p = tmp_path / "folded.json"
    p.write_text(json.dumps(dict(hardware="FIXTURE", versions="FIXTURE", date="FIXTURE",
                                 cases=cases)))
    return p


def test_prices_equal_an_independent_computation(cm, tmp_path):
    fm = vf.load_folded(_report(tmp_path, 50.0, 60.0, 200.0, 90.0))
    B, k, mode = 8, 3, "top_p_T1"
    ag = vc._allgather_us
    p = vf.price_folded(cm, fm, B, k, mode)
    r1 = 32 * (5 + 256) * 4
    fold = 7 * 384 * 4 + 20480 * 2
    assert p.compute_us == 50.0 and p.collectives == 2
    assert math.isclose(p.comm_us, ag(cm, r1 * 8) + ag(cm, fold * 8))
    assert p.sent_bytes_per_rank == r1 + fold
    q = vf.price_rows(cm, fm, B, k, mode)
    assert q.compute_us == 60.0
    assert math.isclose(q.comm_us, ag(cm, r1 * 8) + ag(cm, 8 * 40960 * 8))
    g = vf.price_folded(cm, fm, B, k, "greedy")  # no greedy case measured: not priced
    assert not g.priced and g.note == vc.NOT_PRICED
    assert vf.load_folded(tmp_path / "missing.json") is None


def test_goal_names_the_cells_that_miss(cm, tmp_path):
    fast = vf.load_folded(_report(tmp_path, 20.0, 30.0, 200.0, 300.0))
    assert vf.goal(cm, fast)["reached"]
    slow = vf.load_folded(_report(tmp_path, 150.0, 160.0, 200.0, 90.0))
    g = vf.goal(cm, slow)
    assert not g["reached"] and len(g["below_2x_vllm"]) == 8
    assert "k=3 top_p_T1 batch 1:" in g["behind_batch_sharded"][0]
    md = "\n".join(vf.goal_markdown(cm, slow))
    assert "Goal not reached: 8 measured cell(s) below 2x" in md
    # the faster of the two sharded steps is the one priced against batch-sharded sampling
    mixed = vf.load_folded(_report(tmp_path, 500.0, 20.0, 200.0, 300.0))
    assert vf.best_sharded(cm, mixed, 1, 3, "top_p_T1").verifier == "sharded_rows"


def test_bad_rows_time_is_one_line(tmp_path):
    p = _report(tmp_path, 20.0, 30.0, 200.0, 300.0)
    doc = json.loads(p.read_text())
    doc["cases"][2]["ours_rows_us"] = -1
    p.write_text(json.dumps(doc))
    with pytest.raises(VerifyReportError, match=r"cases\[2\]: field 'ours_rows_us' must"):
        vf.load_folded(p)


REPO = Path(__file__).resolve().parents[2]


def test_docs_block_is_the_generated_one(cm):
    """docs/sharded-verification.md holds ``goal_markdown``'s lines for the package's copy of
    the folded report (the "not priced" line while none is measured); when it exists the
    copy equals the bench report."""
    fm = vf.load_folded()
    text = (REPO / "docs" / "sharded-verification.md").read_text()
    assert vf.docs_text(text, cm, fm) == text
    if fm is not None:
        assert json.loads(vf.DEFAULT_FOLDED_REPORT.read_text()) == json.loads(
            (REPO / vf.FOLDED_REPORT_NAME).read_text())
