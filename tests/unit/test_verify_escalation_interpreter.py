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

Tiers: one case takes minutes on a loaded 2-core machine (the interpreter runs every
kernel program in Python), so the CPU tier runs the pins that caught planted bugs
(``ESC_QUICK``, ``HIST_QUICK``) and the slow tier the rest; a subprocess over its cap is
reported as a timeout, never as a failed assertion.
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
#: The subprocess cap. A timeout is reported as one (``pytest.fail``, "timed out after N
#: s"), never as a failed assertion: a slow machine is not a wrong result.
TIMEOUT_S = 600
#: The CPU tier's cases, sized to finish well inside TIMEOUT_S on a loaded 2-core machine
#: (measured at load 16-30: one escalation case ~300 s, the three HIST_QUICK items 269 s;
#: two escalation cases passed 600 s); the slow tier runs the rest.
ESC_QUICK = ("ties_past_cut",)
ESC_REST = ("ties", "flat", "tie_at_chunk_end", "tie_inside_chunk", "ties_past_cut_draft",
            "deep_cut_5", "deep_cut_7", "deep_cut_10")
HIST_QUICK = ("kernels", "ties_past_cut", "min_p_on_cut")
HIST_REST = ("ties_past_cut_draft", "deep_cut_7", "edge")
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="Triton ships Linux wheels only")


def _interpret(module: str, *cases: str, timeout: float = TIMEOUT_S) -> dict:
    """The summary ``python -m module CASES`` prints, run by Triton's CPU interpreter."""
    assert importlib.util.find_spec("triton") is not None, (
        "triton is missing: install the test extras (pip install -e .[test])")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    what = " ".join(["python -m", module, *cases])
    try:
        r = subprocess.run([sys.executable, "-m", module, *cases], capture_output=True,
                           text=True, timeout=timeout, cwd=REPO, env=env, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what}: timed out after {timeout:g} s (the Triton interpreter did not "
                    "finish: a slow or loaded machine, not a wrong result)", pytrace=False)
    assert r.returncode == 0, f"{what} exited {r.returncode}:\n{r.stderr[-3000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def _check_split(cases: list, names) -> None:
    assert sorted(c["case"] for c in cases) == sorted(_expand(names))
    for c in cases:
        assert c["escalated"] > 0, f"{c}: nothing escalated, the split escalation did not run"
        assert c["rows_compared"] >= 2 * c["escalated"], c  # every rank's rows
        assert c["scratch_steps"] == 2, c
        assert c["dirty"] == [], f"{c}: scratch left non-zero"


def _expand(names) -> list[str]:
    """Case labels of kinds that run several cases (``ties``: both mixes)."""
    many = {"ties": ["ties_top_p", "ties_top_p_min_p"], "flat": ["flat_top_p_min_p"],
            "ties_past_cut": ["ties_past_cut_top_p"],
            "ties_past_cut_draft": ["ties_past_cut_draft_top_p"],
            "tie_at_chunk_end": ["tie_at_chunk_end_top_p"],
            "tie_inside_chunk": ["tie_inside_chunk_top_p"]}
    return [label for n in names for label in many.get(n, [n])]


def _check_hist(summary: dict, names) -> None:
    if "kernels" in names:
        assert summary["kernels"]["coarse_close"] and summary["kernels"]["boundary_equal"]
        assert summary["kernels"]["boundary_tokens"] > 0
    cases = {c["kind"]: c for c in summary["cases"]}
    assert set(cases) == set(names) - {"kernels"}
    for c in cases.values():
        assert c["escalation"] == "hist" and c["uncertified"] > 0, c
        assert c["first_rows_deferred"] == [0] * len(c["first_rows_deferred"]), c
        if c["whole_row_slots"] == 0:
            assert c["deferred"] == c["uncertified"] - min(c["uncertified"], c["slots"]), c


@linux_only
def test_split_escalation_in_interpreter():
    """The pin that caught the tie-rank bug: ties past the cut in the re-read chunk (the
    deep cuts, 1 - top_p band, run in the slow tier)."""
    _check_split(_interpret("testkit.verify_escalation_check", *ESC_QUICK)["cases"], ESC_QUICK)


@linux_only
@pytest.mark.slow
def test_split_escalation_in_interpreter_rest():
    _check_split(_interpret("testkit.verify_escalation_check", *ESC_REST)["cases"], ESC_REST)


@linux_only
def test_hist_escalation_in_interpreter():
    """The histogram escalation on the Triton backend (its shard passes in ``_hist_kernels``,
    equal to their torch twins; the Triton merge with int8 flags, shard statistics and
    decision around them; ``testkit.verify_hist_check``): ties past the cut and the min-p
    cut exactly on tied tokens equal the reference with no whole-row slot (only rows
    without an escalation slot deferred)."""
    _check_hist(_interpret("testkit.verify_hist_check", *HIST_QUICK), HIST_QUICK)


@linux_only
@pytest.mark.slow
def test_hist_escalation_in_interpreter_rest():
    """The draft past the cut, a deep cut, and edge rows taking the whole-row slots."""
    _check_hist(_interpret("testkit.verify_hist_check", *HIST_REST), HIST_REST)


def test_the_tiers_split_every_case_once():
    from testkit import verify_escalation_check as esc
    from testkit import verify_hist_check as hist

    labels = [f"{k}_{seed}" if k == "deep_cut" else f"{k}_{mix}"
              for k, mix, seed in esc.CASES + (("tie_at_chunk_end", "top_p", 0),
                                               ("tie_inside_chunk", "top_p", 1))
              + esc.PIN_CASES]
    assert sorted(_expand(ESC_QUICK + ESC_REST)) == sorted(labels)
    assert sorted(HIST_QUICK + HIST_REST) == sorted([*hist.CASES, "kernels"])


def test_a_subprocess_over_its_cap_is_reported_as_a_timeout():
    """Not an assertion: the message says timed out and after how long."""
    with pytest.raises(pytest.fail.Exception, match=r"python -m testkit.verify_hist_check "
                       r"kernels: timed out after 0.01 s \(the Triton interpreter"):
        _interpret("testkit.verify_hist_check", "kernels", timeout=0.01)


@pytest.mark.slow
@linux_only
def test_folded_escalation_in_interpreter():
    """The folded escalation's kernels (``verify/_kernels/escalate_folded.py``, 16-column splits;
    ``testkit.verify_folded_check``): the send buffer equals the torch bodies and leaves empty
    slots unwritten (two seeds); the graph step on the Triton backend equals the reference
    and the torch backend's tokens and deferrals on the pins and tie-heavy rows, with wide
    (64) and narrow (2-3) further candidates, with and without the whole-row slot. Took
    42 min on the loaded 2-core box (the first folded design's kernels)."""
    cases = _interpret("testkit.verify_folded_check", timeout=3600)["cases"]
    send = [c for c in cases if c["kind"] == "send"]
    steps = [c for c in cases if c["kind"] != "send"]
    assert len(send) == 2 and all(len(c["widths"]) == 4 for c in send)
    assert any(w["sentinels"] > 0 for c in send for w in c["widths"])  # padding reached
    assert len(steps) == 6 and all(c["escalation"] == "folded" for c in steps)
    assert all(c["uncertified"] > 0 for c in steps), steps
    assert any(c["deferred"] > 0 for c in steps if c["W2"] <= 3), steps  # narrow: deferrals
