"""Many verification steps of changing batch size and sampling mode through
:class:`~vllm_kimi_ext.verify.graph_step.StepGraphs`, each checked against the step run
eagerly on the unpadded batch (CPU: the capture stand-in; CUDA: real graphs).

Every step's tokens must equal the eager step's (same backend, same escalation slots);
the output handed back for step ``N`` is read again after step ``N + 1`` has replayed
(as vLLM's asynchronous output copy may) and must not have changed; the steps that ran
without a captured graph are counted per reason.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from vllm_kimi_ext.verify.batch import VerifyBatch
from vllm_kimi_ext.verify.graph_step import GraphVerifyStep, StepGraphs
from vllm_kimi_ext.verify.protocol import plan_from_params
from vllm_kimi_ext.verify.step_io import StepInputs

#: Sampling modes of a step: per-request parameters (cycled over the batch).
MODES = {
    "greedy": [{"temperature": 0.0}],
    "temperature": [{"temperature": 0.8}, {"temperature": 0.0}],
    "top_k": [{"temperature": 1.0, "top_k": 20}, {"temperature": 0.0}],
    "kimi_top_p": [{"temperature": 1.0, "top_p": 0.95}, {"temperature": 0.6, "top_p": 0.95}],
    "min_p": [{"temperature": 1.0, "min_p": 0.05}],
}


@dataclass
class ReplayReport:
    steps: int = 0
    replayed: int = 0
    uncaptured: dict = field(default_factory=dict)
    escalated_rows: int = 0
    consumer_checks: int = 0


def _step_case(g: torch.Generator, n: int, k: int, V: int, mode: str, device):
    params = [MODES[mode][i % len(MODES[mode])] for i in range(n)]
    drafts = [torch.randint(0, V, (int(torch.randint(0, k + 1, (1,), generator=g)),),
                            generator=g).tolist() for _ in range(n)]
    b = VerifyBatch.from_draft_tokens(
        drafts, [p["temperature"] for p in params],
        torch.randint(0, 2**40, (n,), generator=g),
        top_k=[p.get("top_k", 0) for p in params], min_p=[p.get("min_p", 0.0) for p in params],
        top_p=[p.get("top_p", 1.0) for p in params], device=device)
    flat = torch.rand(b.num_rows, 1, generator=g) < 0.9  # flat rows escalate under top-p
    z = torch.randn(b.num_rows, V, generator=g) * torch.where(flat, 0.05, 3.0)
    # each row's draft likely (p ~ 0.3 on flat rows): requests reach later rows, where
    # escalation slots and deferrals decide the tokens
    d = b.layout().draft.cpu()
    rows = (d >= 0).nonzero().squeeze(1)
    z[rows, d[rows]] += 5.5
    return params, b, z.to(torch.bfloat16).to(device)


def replay_steps(num_steps: int, *, max_reqs: int, k: int = 3, V: int = 600,
                 device: str = "cpu", backend: str = "torch", seed: int = 0,
                 capture_sizes: tuple[int, ...] | None = None,
                 sizes: tuple[int, int] | None = None,
                 probabilistic: bool = False,
                 escalation: str | None = None) -> ReplayReport:
    """``num_steps`` steps, batch sizes drawn from ``sizes`` (default 1..max_reqs) and
    modes cycled; TP = 1 (the whole vocabulary is the shard: 128 candidates of ``V``, so
    flat top-p rows escalate). ``escalation="hist"``: the one-hot plans take the test kit's
    histogram escalation (default: the package's whole-row one)."""
    g = torch.Generator().manual_seed(seed)
    step_cls, graphs_cls, as_plan = GraphVerifyStep, StepGraphs, (lambda p: p)
    if escalation == "hist":
        from testkit.verify_hist_step import HistStepGraphs, HistVerifyStep, hist_plan

        step_cls, graphs_cls = HistVerifyStep, HistStepGraphs
        as_plan = hist_plan
    step = step_cls(V, 1, 0, lambda t: t[None], backend=backend)
    graphs = graphs_cls(step, max_reqs=max_reqs, rows_per_req=k + 1,
                        capture_sizes=capture_sizes)
    graphs.warm_up(torch.bfloat16, device, probabilistic=probabilistic, q_width=V)
    lo, hi = sizes or (1, max_reqs)
    rep = ReplayReport()
    pending = None  # (step N's handed-out output, its expected tokens)
    modes = sorted(MODES)
    for i in range(num_steps):
        n = int(torch.randint(lo, hi + 1, (1,), generator=g))
        params, b, z = _step_case(g, n, k, V, modes[i % len(modes)], device)
        L = b.layout()
        inp = StepInputs.from_layout(L, V)
        plan = plan_from_params(params, tp_size=1, vocab_size=V, num_rows=b.num_rows,
                                max_rows_per_req=k + 1, shard_width=V,
                                probabilistic=probabilistic)
        plan = plan if probabilistic else as_plan(plan)
        q = None
        if probabilistic:
            q = torch.softmax(z.float() + torch.randn(z.shape, generator=g).to(device), dim=1)
        out = graphs(z, inp, plan, q)
        size = next((c for c in graphs.capture_sizes if c >= n), n)
        eager_plan = plan if not plan.escalation_slots else dataclasses.replace(
            plan, escalation_slots=min(size, plan.num_rows))
        want = step.run(z, inp, eager_plan, q)
        got = (out.sampled.cpu(), out.num_sampled.cpu())
        exp = (want.sampled[:, :k + 1].cpu(), want.num_sampled.cpu())
        assert torch.equal(got[1], exp[1]), f"step {i}: num_sampled {got[1]} vs {exp[1]}"
        assert torch.equal(got[0], exp[0]), f"step {i}: sampled differ"
        if pending is not None:  # step N - 1's tokens, read after step N replayed
            old, (es, en) = pending
            assert torch.equal(old.sampled.cpu(), es) and torch.equal(old.num_sampled.cpu(), en), (
                f"step {i - 1}'s tokens changed when step {i} ran")
            rep.consumer_checks += 1
        pending = (out, exp)
        rep.steps += 1
        rep.escalated_rows += int(out.uncertified.sum())
    rep.replayed = graphs.replayed
    rep.uncaptured = dict(graphs.uncaptured)
    return rep
