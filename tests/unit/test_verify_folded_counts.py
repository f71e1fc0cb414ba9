"""What the folded escalation costs when no row escalates, counted (no GPU here): the launches
of the step a CUDA graph would hold (Triton launches recorded, not run; torch operators that
launch a kernel), its all-gathers and their bytes per rank (``testkit.launch_count``), against
the whole-row step, at Kimi's shapes (V = 163840, TP = 8, bf16, k = 3, top_p 0.95).

The step reads no device value on the host, so these sequences are what every step replays,
whether or not a row escalates; what an empty slot does inside a launch (return at once, read
and write nothing) is checked by Triton's interpreter on the send kernel
(``testkit.verify_folded_check send``).

Measured before this design (commit 86ccbab of the first folded escalation, same counter):
14 launches against the whole-row step's 8 at every batch, and 42,496 B against 40,960 B in
the escalation's all-gather at batch 1; that step timed 52.9 us against 44.2 us at 4 rows on
one H100 with no row escalating (``bench/reports/verify_folded_h100.json`` of that commit).
"""

from __future__ import annotations

import sys

import pytest
import torch

from testkit.launch_count import count_step
from tests.unit.test_verify_escalation_interpreter import _interpret
from vllm_kimi_ext.verify import VerifyBatch
from vllm_kimi_ext.verify.protocol import plan_from_params
from vllm_kimi_ext.verify.step_io import StepInputs

V, TP, K = 163840, 8, 3
S = V // TP
#: The whole-row step's escalation: pick the slots, copy their shard rows, cut them.
ROWS_ESCALATION = ["_pick_kernel", "index_select", "_esc_hist_kernel", "_esc_stats_kernel"]


def _counts(batch: int, escalation: str):
    b = VerifyBatch.from_draft_tokens(torch.zeros(batch, K, dtype=torch.long), [1.0] * batch,
                                      torch.arange(batch), top_p=[0.95] * batch)
    inp = StepInputs.from_layout(b.layout(), V)
    plan = plan_from_params([{"temperature": 1.0, "top_p": 0.95}] * batch, tp_size=TP,
                            vocab_size=V, num_rows=b.num_rows, max_rows_per_req=K + 1,
                            escalation=escalation)
    return count_step(torch.zeros(b.num_rows, S, dtype=torch.bfloat16), inp, plan, V, TP)


@pytest.fixture(scope="module")
def counted():
    return {(B, e): _counts(B, e) for B in (1, 2, 16, 64) for e in ("rows", "folded")}


def test_batch_one_is_the_whole_row_step(counted):
    """One request, one slot, one whole-row slot: the folded plan is the whole-row plan, so
    the step is the same launches and the same 40,960 B per rank in the same 2 all-gathers."""
    rows, folded = counted[(1, "rows")], counted[(1, "folded")]
    assert folded.plan == rows.plan and folded.plan.escalation == "rows"
    assert folded.launches == rows.launches and folded.gathers == rows.gathers
    assert rows.gathers[1] == S * 2 == 40960
    assert rows.names[3:7] == ROWS_ESCALATION


@pytest.mark.parametrize("batch", [2, 16, 64])
def test_more_requests_same_collectives_fewer_bytes_three_more_launches(counted, batch):
    """``E = batch`` slots: the same 2 all-gathers; the escalation's bytes per rank are
    ``(E - 1) x 1,536 + 40,960`` against ``E x 40,960``; the send buffer is written by one
    launch in place of the whole-row step's ``index_select`` (which copies every slot's
    row, escalated or not), and the second merge adds exactly three launches (build, merge,
    apply), each returning at once for a slot without an uncertified row."""
    rows, folded = counted[(batch, "rows")], counted[(batch, "folded")]
    assert folded.plan.escalation == "folded"
    assert len(folded.gathers) == len(rows.gathers) == 2
    assert folded.gathers[0] == rows.gathers[0]
    assert folded.gathers[1] == (batch - 1) * 384 * 4 + S * 2 < rows.gathers[1] == batch * S * 2
    want = rows.names[:4] + ["_fold_send_kernel", "_fold_build_kernel", "_merge_kernel",
                             "_fold_apply_kernel"] + rows.names[5:]
    assert folded.names == want
    assert "index_select" not in folded.names and "cat" not in folded.names
    grids = {x[1]: x[2] for x in folded.launches if x[0] == "triton"}
    assert grids["_fold_send_kernel"] == (batch, S // 2048)
    assert grids["_fold_build_kernel"] == grids["_fold_apply_kernel"] == (batch - 1,)


@pytest.mark.skipif(sys.platform != "linux", reason="Triton ships Linux wheels only")
def test_send_kernel_in_interpreter():
    """The send kernel (Triton's interpreter, 16-column splits): key slots equal their torch
    body, whole-row slots their shard row, an empty slot's bytes are never written and the
    per-slot counters are zero again."""
    cases = _interpret("testkit.verify_folded_check", "send")["cases"]
    assert [c["kind"] for c in cases] == ["send"]
    assert len(cases[0]["widths"]) == 8
    assert {w["select"] for w in cases[0]["widths"]} == {False, True}  # both last stages
    assert any(w["sentinels"] > 0 for w in cases[0]["widths"])  # the padded tail reached
