"""The split bf16 escalation of the graph step, on Triton's CPU interpreter.

``testkit.verify_escalation_check`` runs the graph step (Triton backend) on simulated
TP = 2 with 2 candidates per rank on tie-heavy and flat bf16 rows, so the
escalation's histogram walk, its tied tokens kept in id order (across chunk
boundaries: 16-column chunks) and its chunk merge decide most cuts; every rank's
output must equal the full-logits reference and every rank's persistent scratch
must be zeroed again; each escalated row's merged statistics (Gumbel-max, kept-set
log-sum-exp, ``s_x``, nucleus margin) must equal those of the full row's exact
kept set. A wrong walk, tie count, tie order or merge fails (each was planted and
seen to fail); a step that left its histogram dirty is reported. The pins
(``testkit.verify_cases``): four tied tokens past the cut in the chunk the escalation
re-reads (more in later chunks), with the draft elsewhere or among them, each request's
seed making a past-the-cut token win if it were kept (a boundary-chunk tie rank that
ignores earlier chunks' ties fails); cuts 5, 7 and 10 nats below the row maximum (a
histogram band from ``top_p`` instead of ``1 - top_p`` fails from 7 on).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _interpret(module: str) -> dict:
    """The summary ``python -m module`` prints, run by Triton's CPU interpreter."""
    assert importlib.util.find_spec("triton") is not None, (
        "triton is missing: install the test extras (pip install -e .[test])")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    r = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True,
                       timeout=600, cwd=REPO, env=env, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(sys.platform != "linux", reason="Triton ships Linux wheels only")
def test_split_escalation_in_interpreter():
    cases = _interpret("testkit.verify_escalation_check")["cases"]
    assert len(cases) == 10
    assert {c["kind"] for c in cases} >= {"ties_past_cut", "ties_past_cut_draft", "deep_cut"}
    for c in cases:
        assert c["escalated"] > 0, f"{c}: nothing escalated, the split escalation did not run"
        assert c["rows_compared"] >= 2 * c["escalated"], c  # every rank's rows
        assert c["scratch_steps"] == 2, c
        assert c["dirty"] == [], f"{c}: scratch left non-zero"


@pytest.mark.skipif(sys.platform != "linux", reason="Triton ships Linux wheels only")
def test_hist_escalation_in_interpreter():
    """The histogram escalation on the Triton backend (its shard passes in ``_hist_kernels``,
    equal to their torch twins; the Triton merge with int8 flags, shard statistics and
    decision around them; ``testkit.verify_hist_check``):
    the tie and deep-cut pins equal the reference with no whole-row slot (only rows without
    an escalation slot deferred), and edge rows take the whole-row slots."""
    summary = _interpret("testkit.verify_hist_check")
    assert summary["kernels"]["coarse_close"] and summary["kernels"]["boundary_equal"]
    assert summary["kernels"]["boundary_tokens"] > 0
    cases = {c["kind"]: c for c in summary["cases"]}
    assert set(cases) == {"ties_past_cut", "ties_past_cut_draft", "deep_cut_7", "edge"}
    for c in cases.values():
        assert c["escalation"] == "hist" and c["uncertified"] > 0, c
        assert c["first_rows_deferred"] == [0] * len(c["first_rows_deferred"]), c
        if c["whole_row_slots"] == 0:
            assert c["deferred"] == c["uncertified"] - min(c["uncertified"], c["slots"]), c


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="Triton ships Linux wheels only")
def test_folded_escalation_in_interpreter():
    """The folded escalation's kernels (``verify/_folded_kernels.py``, 16-column splits;
    ``testkit.verify_folded_check``): the further-candidate selection equals its torch body
    and leaves empty slots alone; the graph step on the Triton backend equals the reference
    and the torch backend's tokens and deferrals on the pins and tie-heavy rows, with wide
    (64) and narrow (2-3) further candidates, with and without the whole-row slot."""
    cases = _interpret("testkit.verify_folded_check")["cases"]
    further = [c for c in cases if c["kind"] == "further"]
    steps = [c for c in cases if c["kind"] != "further"]
    assert len(further) == 2 and all(len(c["widths"]) == 4 for c in further)
    assert any(w["sentinels"] > 0 for c in further for w in c["widths"])  # padding reached
    assert len(steps) == 6 and all(c["escalation"] == "folded" for c in steps)
    assert all(c["uncertified"] > 0 for c in steps), steps
    assert any(c["deferred"] > 0 for c in steps if c["W2"] <= 3), steps  # narrow: deferrals
