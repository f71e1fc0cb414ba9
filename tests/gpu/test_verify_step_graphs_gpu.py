"""StepGraphs with real CUDA graphs in a server's loop: 1,000 steps, batch sizes drawn
from 1-256 requests (k = 3, 0-3 drafts each), sampling modes cycled (greedy, temperature,
top-k, Kimi's top-p, min-p), Triton backend. Graphs are captured once at warm-up for the
default sizes up to 256; every step must equal the step run eagerly on the unpadded batch,
step N's tokens read after step N + 1 must be unchanged, and every step must replay a
captured graph (the count of uncaptured steps, printed, must be 0)."""

from __future__ import annotations

import pytest

from testkit.verify_replay import replay_steps

pytestmark = pytest.mark.gpu


def test_thousand_steps_of_changing_batch_sizes_replay_captured_graphs():
    rep = replay_steps(1000, max_reqs=256, device="cuda", backend="triton", seed=11)
    print(f"steps {rep.steps}, replayed {rep.replayed}, uncaptured {rep.uncaptured}, "
          f"escalated rows {rep.escalated_rows}")
    assert rep.uncaptured == {}, rep.uncaptured
    assert rep.replayed == rep.steps == 1000
    assert rep.consumer_checks == 999
    assert rep.escalated_rows > 0
