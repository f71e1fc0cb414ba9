"""The histogram escalation's prices (``testkit/verify_hist_prices.py``; the escalation
itself is the test kit's, measured slower than the whole-row escalation the package ships):
its rounds are the plan's, its step is priced from its measured report, and the table
``docs/sharded-verification.md`` shows is the priced one."""

from __future__ import annotations

import math

import pytest

from testkit import verify_hist_prices as hp
from testkit.verify_hist_step import hist_plan
from tests.unit.test_costmodel_verify_cost import FIXTURE, REPO, V, _write
from vllm_kimi_ext.costmodel import verify_cost as vc
from vllm_kimi_ext.costmodel import verify_measured as vm
from vllm_kimi_ext.costmodel.model import CostModel
from vllm_kimi_ext.verify.protocol import plan_from_params


@pytest.fixture(scope="module")
def cm():
    return CostModel.build()


def test_escalation_bytes_match_the_product_plan(cm):
    """The cost model's escalation rounds are the product plan's rounds (bytes per rank,
    names), at Kimi's vocabulary over 8 ranks: before 40,960 B per escalated row per rank,
    after 3,088 B + the one whole-row slot shared by the step's escalated rows."""
    for B in (1, 9, 10, 16, 64):
        for esc in hp.ESCALATIONS:
            plan = plan_from_params([{"temperature": 1.0, "top_p": 0.95}] * B, tp_size=cm.tp,
                                    vocab_size=V, num_rows=4 * B, max_rows_per_req=4)
            plan = hist_plan(plan) if esc == "hist" else plan
            priced = hp.price_escalation(cm, B, esc)
            assert [(r.name, r.bytes_per_rank) for r in plan.rounds[1:]] == list(priced.rounds)
            assert (plan.bytes_per_escalated_row_per_rank ==
                priced.bytes_per_escalated_row_per_rank)
    assert hp.price_escalation(cm, 64, "rows").bytes_per_escalated_row_per_rank == 40_960
    assert (hp.price_escalation(cm, 64, "hist").bytes_per_escalated_row_per_rank ==
        2048 + 1024 + 16 + 40_960 / 64)
    # on this PCIe profile the three small all-gathers price below one whole-row all-gather
    # from 10 escalated rows on (communication only; the measured compute decides the default)
    faster = [B for B in range(1, 65) if hp.price_escalation(cm, B, "hist").comm_us
              < hp.price_escalation(cm, B, "rows").comm_us]
    assert faster == list(range(10, 65))


def test_hist_escalation_price_says_it_is_modelled(cm):
    meas = vm.load_report(FIXTURE)
    k, mode = 3, "top_p_T1"
    rows_p = hp.price_sharded_escalation(cm, meas, 16, k, mode, "rows")
    hist_p = hp.price_sharded_escalation(cm, meas, 16, k, mode, "hist")
    assert rows_p.compute_us == hist_p.compute_us == meas.at(k, mode, 64, "ours_graph_us")
    assert (rows_p.collectives, hist_p.collectives) == (2, 4)
    assert "modelled, not measured" in hist_p.note and "modelled" not in rows_p.note
    assert hist_p.sent_bytes_per_rank < rows_p.sent_bytes_per_rank
    r1 = 64 * (5 + 2 * 128) * 4
    assert math.isclose(hist_p.comm_us, vc._allgather_us(cm, r1 * cm.tp)
                        + hp.price_escalation(cm, 16, "hist").comm_us)
    md = "\n".join(hp.escalation_markdown(cm, meas))
    assert "modelled, not measured" in md and "| 64 | 40,960 | 3,728 |" in md
    assert hp.price_sharded_escalation(cm, None, 16, k, mode, "hist").note == vc.NOT_PRICED


def test_hist_step_is_priced_from_its_measured_report(cm, tmp_path):
    """With a histogram-escalation report at these rows, the hist step's compute is that
    report's (not the whole-row step's) and the note says measured; rows the hist report
    lacks stay modelled and say so."""
    meas = vm.load_report(FIXTURE)
    k, mode = 3, "top_p_T1"
    base = meas.at(k, mode, 64, "ours_graph_us")
    cases = [dict(rows=64, k=3, mode=mode, temperature=1.0, top_p=0.95,
                  ours_graph_us=base * 7 + 1, vllm_graph_us=100.0,
                  payload_bytes_per_row_per_rank=64, rounds=4)]
    hist = vm.load_report(_write(tmp_path, dict(hardware="FIXTURE", versions="FIXTURE",
                                                date="FIXTURE", cases=cases)))
    p = hp.price_sharded_escalation(cm, meas, 16, k, mode, "hist", hist)
    assert p.compute_us == pytest.approx(base * 7 + 1)
    assert hp.ESCALATION_MEASURED_NOTE in p.note and hp.ESCALATION_TIME_NOTE not in p.note
    other = hp.price_sharded_escalation(cm, meas, 4, k, mode, "hist", hist)  # 16 rows
    assert other.compute_us == meas.at(k, mode, 16, "ours_graph_us")
    assert hp.ESCALATION_TIME_NOTE in other.note
    # the shipped report: the hist step is measured slower than the whole-row step
    shipped = hp.hist_measurements()
    for rows in (4, 16, 64, 256):
        assert (shipped.at(k, mode, rows, "ours_graph_us") >
            vc.measurements().at(k, mode, rows, "ours_graph_us"))


def test_docs_escalation_table_is_the_priced_one(cm):
    """docs/sharded-verification.md's escalation table: each of its rows is
    ``escalation_markdown``'s row at that batch, from the measured report."""
    text = (REPO / "docs" / "sharded-verification.md").read_text()
    md = hp.escalation_markdown(cm, batches=tuple(range(1, 65)))
    header = md[0]
    assert header in text
    table = text[text.index(header):].split("\n\n")[0].splitlines()[2:]
    assert len(table) >= 4 and all(row in md for row in table), table
