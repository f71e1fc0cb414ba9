"""The escalation's pins on the torch path (the Triton path runs the same cases in
``test_verify_escalation_interpreter.py``): three or more tied tokens past the top-p cut,
spread over several chunks, with and without the draft among them; cuts 5-10 nats below
the row maximum. 2 candidates per rank, so every cut escalates; each case equals the
full-logits reference token for token on every rank (TP 2 and 4), with either escalation:
whole shard rows (``"rows"``) or the histogram rounds (``"hist"``, no whole-row slot, so
every escalated row is cut by the histograms: only rows without a slot are deferred)."""

from __future__ import annotations

import pytest

from testkit.verify_cases import PIN_V, deep_cut, ties_past_the_cut
from testkit.verify_graph_sim import check_graph_step

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

ESCALATIONS = {"rows": {"escalation": "rows"},
               "hist": {"escalation": "hist", "row_fallback_slots": 0}}


def _check(z, b, tp, escalation):
    out, _, plan, _ = check_graph_step(z, b, PIN_V, tp, candidates=2, **ESCALATIONS[escalation])
    unc = int(out.uncertified.sum())
    assert unc and plan.escalation == escalation
    assert int(out.deferred.sum()) == unc - min(unc, plan.escalation_slots)


@pytest.mark.parametrize("escalation", ["rows", "hist"])
@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("draft_past", [False, True])
def test_ties_past_the_cut(tp, draft_past, escalation):
    b, z = ties_past_the_cut(16, past=4, draft_past=draft_past)
    _check(z, b, tp, escalation)


@pytest.mark.parametrize("escalation", ["rows", "hist"])
@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("depth", [5, 6, 7, 8, 9, 10])
def test_deep_cuts(tp, depth, escalation):
    b, z = deep_cut(depth)
    _check(z, b, tp, escalation)
