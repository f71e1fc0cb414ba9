"""StepGraphs in a server's loop, on CPU (the capture stand-in replays like a graph: its
outputs are overwritten by the next replay).

* 120 steps of changing batch size (1..24 requests, 0..3 drafts each) and sampling mode
  (greedy, temperature, top-k, Kimi's top-p, min-p) replay graphs captured at warm-up for
  a fixed list of padded sizes; every step equals the step run eagerly on the unpadded
  batch, and step N's tokens read after step N + 1 are unchanged (they are a copy).
* Steps no captured graph fits run eagerly, counted per reason and logged once.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

import vllm_kimi_ext.verify.graph_step as gs
from testkit.verify_replay import replay_steps
from vllm_kimi_ext.verify import GraphVerifyStep, StepGraphs, StepInputs, VerifyBatch
from vllm_kimi_ext.verify.protocol import plan_from_params

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")
SIZES = (1, 2, 4, 8, 16, 24)


def test_many_steps_replay_equal_to_eager_and_outputs_are_copies():
    rep = replay_steps(120, max_reqs=24, capture_sizes=SIZES, seed=3)
    assert rep.steps == rep.replayed == 120  # every step used a captured graph
    assert rep.uncaptured == {}
    assert rep.consumer_checks == 119
    assert rep.escalated_rows > 0, "no row escalated: the escalation graphs were not replayed"


def test_hist_escalation_replays_equal_to_eager(monkeypatch):
    """The histogram escalation inside the captured steps (the stand-in replays it on the
    static buffers): fixed shapes, no host read."""
    import testkit.verify_hist_step as hs

    calls = []
    real = hs.escalate_hist
    monkeypatch.setattr(hs, "escalate_hist", lambda *a, **k: calls.append(1) or real(*a, **k))
    rep = replay_steps(40, max_reqs=8, capture_sizes=(2, 4, 8), seed=11, escalation="hist")
    assert rep.steps == rep.replayed == 40 and rep.uncaptured == {}
    assert rep.escalated_rows > 0 and calls


def test_probabilistic_drafts_replay_equal_to_eager():
    rep = replay_steps(30, max_reqs=8, capture_sizes=(2, 4, 8), seed=5, probabilistic=True)
    assert rep.steps == rep.replayed == 30 and rep.uncaptured == {}


def test_rows_per_request_not_a_power_of_two_replay_equal_to_eager():
    """k = 2 (3 rows per request): a graph's static rows are indexed request x rows per
    request + row; with 4 or 8 rows per request an OR in place of the + gives the same
    index, with 3 it does not."""
    rep = replay_steps(24, max_reqs=8, k=2, capture_sizes=(2, 4, 8), seed=7)
    assert rep.steps == rep.replayed == 24 and rep.uncaptured == {}


def test_default_capture_sizes():
    assert gs.default_capture_sizes(256)[:8] == (1, 2, 4, 8, 16, 24, 32, 40)
    assert gs.default_capture_sizes(256)[-1] == 256
    assert gs.default_capture_sizes(20) == (1, 2, 4, 8, 16, 20)


def _one(graphs, params, V=600, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = len(params)
    b = VerifyBatch.from_draft_tokens(torch.randint(0, V, (n, k), generator=g),
                                      [p["temperature"] for p in params], list(range(n)),
                                      top_k=[p.get("top_k", 0) for p in params])
    z = torch.randn(b.num_rows, V, generator=g).to(torch.bfloat16)
    plan = plan_from_params(params, tp_size=1, vocab_size=V, num_rows=b.num_rows,
                            max_rows_per_req=k + 1, shard_width=V)
    return graphs(z, StepInputs.from_layout(b.layout(), V), plan)


def test_uncaptured_steps_are_counted_and_logged_once(caplog):
    step = GraphVerifyStep(600, 1, 0, lambda t: t[None], backend="torch")
    graphs = StepGraphs(step, max_reqs=4, rows_per_req=4, capture_sizes=(1, 2, 4))
    with caplog.at_level(logging.WARNING, logger="vllm_kimi_ext.verify.graph_step"):
        _one(graphs, [{"temperature": 0.0}])  # before warm-up
        graphs.warm_up(torch.bfloat16, "cpu")
        _one(graphs, [{"temperature": 0.0}] * 3)  # padded to 4: captured
        for _ in range(2):
            _one(graphs, [{"temperature": 1.0, "top_k": 300}])  # 300 candidates: not captured
        _one(graphs, [{"temperature": 0.0}] * 5)  # above the largest size
    assert graphs.uncaptured == {"not_warmed_up": 1, "plan_not_captured": 2,
                                 "batch_above_captured": 1}
    assert graphs.replayed == 1
    logged = [r.getMessage() for r in caplog.records if "without a captured graph" in r.message]
    assert len(logged) == 3 and any("plan_not_captured" in m for m in logged)


def test_a_folded_plan_does_not_replay_a_whole_row_graph():
    """The captured top-p graphs hold the whole-row escalation (``"rows"``); a folded plan
    (``StepPlan.escalation == "folded"``, different launches and all-gather sizes) of the
    same shape runs eagerly, counted as ``plan_not_captured``, and decides as the eager
    step does."""
    V, k, n = 600, 3, 2
    step = GraphVerifyStep(V, 1, 0, lambda t: t[None], backend="torch")
    graphs = StepGraphs(step, max_reqs=2, rows_per_req=k + 1, capture_sizes=(2,))
    graphs.warm_up(torch.bfloat16, "cpu")
    g = torch.Generator().manual_seed(5)
    b = VerifyBatch.from_draft_tokens(torch.randint(0, V, (n, k), generator=g), [1.0] * n,
                                      list(range(n)), top_p=[0.9] * n)
    z = torch.randn(b.num_rows, V, generator=g).to(torch.bfloat16)
    inp = StepInputs.from_layout(b.layout(), V)
    kw = dict(tp_size=1, vocab_size=V, num_rows=b.num_rows, max_rows_per_req=k + 1,
              shard_width=V)
    params = [{"temperature": 1.0, "top_p": 0.9}] * n
    rows = plan_from_params(params, **kw)
    folded = plan_from_params(params, **kw, escalation="folded", row_fallback_slots=0)
    assert (rows.escalation, folded.escalation) == ("rows", "folded")
    graphs(z, inp, rows)
    assert graphs.replayed == 1 and not graphs.uncaptured
    out = graphs(z, inp, folded)
    assert graphs.uncaptured == {"plan_not_captured": 1} and graphs.replayed == 1
    eager = step.run(z, inp, folded)
    assert torch.equal(out.sampled, eager.sampled)
    assert torch.equal(out.num_sampled, eager.num_sampled)


def test_graphs_warmed_up_for_bare_cuda_are_found_by_the_logits_device(monkeypatch):
    """Warm-up with ``"cuda"`` (no index) keys its graphs by the current device, ``cuda:N``,
    as the logits' ``str(device)`` reads while serving: a bare ``"cuda"`` key was never found
    again, so every step on a GPU ran uncaptured (seen on an H200: plan_not_captured)."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert str(gs.canonical_device("cuda")) == "cuda:3"
    assert str(gs.canonical_device(torch.device("cuda", 1))) == "cuda:1"
    assert str(gs.canonical_device("cpu")) == "cpu"
    seen = []
    step = GraphVerifyStep(600, 1, 0, lambda t: t[None], backend="torch")
    graphs = StepGraphs(step, max_reqs=2, rows_per_req=4, capture_sizes=(2,))
    monkeypatch.setattr(graphs, "_capture", lambda q, fl, dtype, dev, qw: seen.append(str(dev)))
    graphs.warm_up(torch.bfloat16, "cuda")
    assert seen and set(seen) == {"cuda:3"}


# ---------------------------------------------------------------------------
# the graph cache's contract with its caller
# ---------------------------------------------------------------------------
def _case(n: int, draft_len: int, V: int = 600, seed: int = 0):
    """``n`` requests of ``draft_len`` drafts each (greedy, temperature, top-k, Kimi's
    top-p cycled) and the step's plan with ``draft_len + 1`` rows per request."""
    g = torch.Generator().manual_seed(seed)
    modes = [{"temperature": 0.0}, {"temperature": 0.8}, {"temperature": 1.0, "top_k": 20},
             {"temperature": 1.0, "top_p": 0.95}]
    params = [modes[i % len(modes)] for i in range(n)]
    b = VerifyBatch.from_draft_tokens(
        torch.randint(0, V, (n, draft_len), generator=g), [p["temperature"] for p in params],
        torch.randint(0, 2**40, (n,), generator=g), top_k=[p.get("top_k", 0) for p in params],
        top_p=[p.get("top_p", 1.0) for p in params])
    z = torch.randn(b.num_rows, V, generator=g) * 0.05  # flat rows: top-p escalates
    d = b.layout().draft
    rows = (d >= 0).nonzero().squeeze(1)
    z[rows, d[rows]] += 5.5  # drafts likely: requests reach their later rows
    plan = plan_from_params(params, tp_size=1, vocab_size=V, num_rows=b.num_rows,
                            max_rows_per_req=draft_len + 1, shard_width=V)
    return z.to(torch.bfloat16), StepInputs.from_layout(b.layout(), V), plan


def _graphs(V=600, max_reqs=4, rows_per_req=4):
    step = GraphVerifyStep(V, 1, 0, lambda t: t[None], backend="torch")
    graphs = StepGraphs(step, max_reqs=max_reqs, rows_per_req=rows_per_req,
                        capture_sizes=(2, 4))
    graphs.warm_up(torch.bfloat16, "cpu")
    return step, graphs


def _eager(step, graphs, z, inp, plan):
    size = next(c for c in graphs.capture_sizes if c >= plan.num_reqs)
    if plan.escalation_slots:  # the padded plan's slots (one per padded request)
        plan = dataclasses.replace(plan, escalation_slots=min(size, plan.num_rows))
    return step.run(z, inp, plan)


@pytest.mark.parametrize("draft_len", [0, 1, 2])
def test_a_step_with_fewer_rows_than_captured_lands_at_the_captured_width(draft_len):
    """Captured with 4 rows per request, a step whose requests have 1-3 rows replays the
    graph: request i's rows sit at i x 4 (the captured width), not at i x the plan's width
    (planted ``dst = req_of_row * plan.max_rows_per_req + row_in_req``: tokens differ)."""
    step, graphs = _graphs()
    for seed in range(3):
        z, inp, plan = _case(4, draft_len, seed=seed)
        got = graphs(z, inp, plan)
        want = _eager(step, graphs, z, inp, plan)
        assert torch.equal(got.num_sampled, want.num_sampled), (draft_len, seed)
        assert torch.equal(got.sampled, want.sampled[:, :plan.max_rows_per_req]), (draft_len,
                                                                                    seed)
    assert graphs.replayed == 3 and graphs.uncaptured == {}


def test_a_step_with_one_row_per_request_too_many_runs_eagerly():
    """Captured with 4 rows per request, a step with 5 never replays a graph (its rows
    would overlap the next request's): it runs eagerly, counted as ``rows_per_request``
    (planted: the check dropped from ``_reason`` -> replayed, tokens differ)."""
    step, graphs = _graphs()
    z, inp, plan = _case(2, 4, seed=1)
    assert plan.max_rows_per_req == 5
    got = graphs(z, inp, plan)
    want = step.run(z, inp, plan)
    assert graphs.replayed == 0 and graphs.uncaptured == {"rows_per_request": 1}
    assert torch.equal(got.sampled, want.sampled) and torch.equal(got.num_sampled,
                                                                  want.num_sampled)
