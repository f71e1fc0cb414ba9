"""The graph verification step on a CUDA device (Triton kernels, graph capture).

* Triton round-1 payload == torch payload (candidates bit-exact, log-sum-exp to
  float rounding) and Triton merge == torch merge, at Kimi's V = 163840, TP = 8,
  on the first and the last (padded) rank.
* The whole step on simulated TP = 8 (Triton) equals the full-logits reference.
* A captured CUDA graph replays to the same output as the eager step.
* With 4 candidates per rank on flat rows (every cut uncertified), the escalation
  round runs inside the captured graph and the output still equals the reference.
"""

from __future__ import annotations

import pytest
import torch

from testkit.verify_graph_sim import check_graph_step
from testkit.verify_simulate import plan_for_layout
from vllm_kimi_ext.verify import GraphVerifyStep, StepInputs, VerifyBatch
from vllm_kimi_ext.verify.merge import merge_round1_torch, merge_round1_triton
from vllm_kimi_ext.verify.stats import round1_payload_torch, round1_payload_triton

pytestmark = pytest.mark.gpu
V, TP = 163840, 8


def _case(n, temp, top_p, seed, flat=False, dev="cuda"):
    g = torch.Generator().manual_seed(seed)
    drafts = torch.randint(0, V, (n, 3), generator=g)
    b = VerifyBatch.from_draft_tokens(drafts, [temp] * n, torch.arange(n) + seed,
                                      top_p=[top_p] * n, device=dev)
    scale = 0.05 if flat else 2.0
    z = (torch.randn(b.num_rows, V, generator=g) * scale).to(torch.bfloat16)
    L = b.layout()
    d = L.draft.cpu()
    rows = ((d >= 0) & (torch.rand(b.num_rows, generator=g) < 0.6)).nonzero().squeeze(1)
    z[rows, d[rows]] = (z[rows].float().max(dim=1).values + 1).to(torch.bfloat16)
    return b, z.to(dev)


@pytest.mark.parametrize("rank", [0, TP - 1])
@pytest.mark.parametrize("temp", [1.0, 0.6])
def test_triton_round1_and_merge_equal_torch(rank, temp):
    b, z = _case(16, temp, 0.95, 3)
    S = V // TP
    step = GraphVerifyStep(V, TP, rank, lambda t: t[None], backend="triton")
    L = b.layout()
    plan = plan_for_layout(L, tp_size=step.tp_size, shard_width=step.shard_width,
                           vocab_size=V)
    inp = StepInputs.from_layout(L, V)
    shard = z[:, rank * S:(rank + 1) * S].contiguous()
    a = round1_payload_triton(shard, inp, plan, rank * S, V, None)
    t = round1_payload_torch(shard, inp, plan, rank * S, V, None)
    W = plan.candidates
    assert torch.equal(a[:, 5:], t[:, 5:]), "candidates differ"
    assert torch.equal(a[:, :2], t[:, :2]) or torch.allclose(a[:, 0], t[:, 0], atol=1e-4)
    assert torch.allclose(a[:, 2], t[:, 2], rtol=1e-6)
    assert W > 0
    g = torch.stack([t] * TP)  # a synthetic gathered tensor: every rank sent this row
    rv = step.rank_valid(z.device)
    mt = merge_round1_torch(g, inp, plan, V, rv, None)
    mk = merge_round1_triton(g, inp, plan, V, rv, None)
    assert torch.equal(mt.uncertified.bool(), mk.uncertified.bool())
    assert torch.equal(mt.gidx, mk.gidx)
    assert torch.allclose(mt.lse, mk.lse, rtol=1e-5)


@pytest.mark.parametrize("temp", [1.0, 0.6])
def test_graph_step_triton_equals_reference(temp):
    b, z = _case(32, temp, 0.95, 5)
    check_graph_step(z, b, V, TP, backend="triton")


def _capture_and_compare(b, z, **plan_kw):
    from testkit.verify_graph_sim import simulate_graph_step

    outs, group, plan = simulate_graph_step(z, b, TP, V, backend="triton", **plan_kw)
    # rank 0 again, with the all-gathers replayed from what rank 0 received
    received = [c for c in group.received[0]] if hasattr(group, "received") else None
    if received is None:
        pytest.skip("group records no received tensors")
    it = {"i": 0}
    bufs = [r.clone() for r in received]

    def replay(t):
        j = it["i"] % len(bufs)
        it["i"] += 1
        return bufs[j]

    step = GraphVerifyStep(V, TP, 0, replay, backend="triton")
    L = b.layout()
    inp = StepInputs.from_layout(L, V)
    shard = z[:, :V // TP].contiguous()
    eager = step.run(shard, inp, plan)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        it["i"] = 0
        step.run(shard, inp, plan)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    it["i"] = 0
    with torch.cuda.graph(graph):
        out = step.run(shard, inp, plan)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.sampled, eager.sampled)
    assert torch.equal(out.num_sampled, eager.num_sampled)
    assert torch.equal(out.sampled, outs[0].sampled)
    return out


def test_graph_replay_equals_eager():
    b, z = _case(16, 1.0, 0.95, 7)
    _capture_and_compare(b, z)


def test_uncertified_cut_inside_a_captured_graph():
    b, z = _case(16, 1.0, 0.95, 9, flat=True)
    check_graph_step(z, b, V, TP, backend="triton", candidates=4)
    out = _capture_and_compare(b, z, candidates=4)
    assert bool(out.uncertified.any())


def _tied_case(n, seed, top_p, min_p):
    """Logits on a 0.25 grid: thousands of tokens share each value, so nucleus cuts land
    inside long ties (kept in id order) and chunks of the split escalation hold several
    tie runs; a draft is often placed at the cut's value."""
    g = torch.Generator().manual_seed(seed)
    drafts = torch.randint(0, V, (n, 3), generator=g)
    b = VerifyBatch.from_draft_tokens(drafts, [1.0] * n, torch.arange(n) * 31 + seed,
                                      top_p=[top_p] * n, min_p=[min_p] * n, device="cuda")
    z = (torch.randint(-24, 4, (b.num_rows, V), generator=g) * 0.25).to(torch.bfloat16)
    z[:, :4] = 2.0  # a few tokens on top
    return b, z.cuda()


@pytest.mark.parametrize("top_p,min_p", [(0.9, 0.0), (0.95, 0.05), (1.0, 0.02), (0.5, 0.0)])
def test_split_escalation_cuts_inside_ties_and_leaves_scratch_zeroed(top_p, min_p):
    """The split bf16 escalation (histogram walk + tied tokens in id order) equals the
    reference with every cut uncertified (4 candidates per rank), inside and outside a
    captured graph, and every rank's persistent histogram, highest key and counters are
    zero again after the step (the next step relies on it)."""
    from testkit.verify_graph_sim import dirty_scratch, recording_step, simulate_graph_step

    b, z = _tied_case(12, 21, top_p, min_p)
    out, _, _, _ = check_graph_step(z, b, V, TP, backend="triton", candidates=4,
                                    escalation="rows")
    assert bool(out.uncertified.any())
    steps: list = []
    simulate_graph_step(z, b, TP, V, backend="triton", candidates=4, escalation="rows",
                        step_cls=recording_step(steps))
    assert len(steps) == TP and all(str(z.device) in s._escalation_scratch for s in steps)
    assert dirty_scratch(steps, str(z.device)) == [], "scratch not left zeroed"
    _capture_and_compare(b, z, candidates=4)
