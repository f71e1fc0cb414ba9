"""CPU microbenchmark: full-vocabulary reference vs one rank's graph verification step.

Run: ``pytest bench/bench_verify_cpu.py`` (pytest-benchmark). The sharded case times
everything one rank's :class:`~vllm_kimi_ext.verify.graph_step.GraphVerifyStep` does in
a step (the product's verifier, torch backend: round 1, merge, escalation, decision)
with a stand-in all-gather that just replicates the local payload ``TP`` times, i.e.
the local compute without any communication; with Kimi's top_p 0.95 the escalation
round runs too. Small dims keep it quick; GPU numbers at Kimi dims (graph against graph)
come from ``bench/kernels/bench_verify_graph.py``.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("pytest_benchmark")

from testkit.verify_simulate import as_verify_output, plan_for_layout  # noqa: E402
from vllm_kimi_ext.verify import (  # noqa: E402
    GraphVerifyStep,
    ReferenceVerifier,
    StepInputs,
    VerifyBatch,
)

V = 16384
TP = 8
NUM_REQS = 4
K = 3


MODES = {"greedy": (0.0, 1.0), "T1": (1.0, 1.0), "T1_top_p": (1.0, 0.95)}


def _inputs(mode: str):
    temperature, top_p = MODES[mode]
    g = torch.Generator().manual_seed(0)
    rows = NUM_REQS * (K + 1)
    logits = (torch.randn(rows, V, generator=g) * 3).to(torch.bfloat16)
    drafts = torch.randint(0, V, (NUM_REQS, K), generator=g)
    batch = VerifyBatch.from_draft_tokens(drafts, [temperature] * NUM_REQS,
                                          list(range(NUM_REQS)), top_p=[top_p] * NUM_REQS)
    return logits, batch


@pytest.mark.parametrize("mode", sorted(MODES))
def test_bench_reference_full_vocab(benchmark, mode):
    logits, batch = _inputs(mode)
    v = ReferenceVerifier(V)
    benchmark.group = f"verify {mode} V={V} rows={NUM_REQS * (K + 1)}"
    out = benchmark(v.verify, logits, batch)
    assert out.sampled.shape == (NUM_REQS, K + 1)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_bench_graph_step_one_rank(benchmark, mode):
    logits, batch = _inputs(mode)
    S = V // TP
    shard = logits[:, 3 * S:4 * S].contiguous()

    def local_only_all_gather(t):
        return t.unsqueeze(0).expand(TP, *t.shape).contiguous()

    step = GraphVerifyStep(V, TP, 3, local_only_all_gather, backend="torch")
    L = batch.layout()
    plan = plan_for_layout(L, tp_size=TP, shard_width=S, vocab_size=V)
    inp = StepInputs.from_layout(L, V)
    benchmark.group = f"verify {mode} V={V} rows={NUM_REQS * (K + 1)}"
    out = as_verify_output(benchmark(step.run, shard, inp, plan))
    assert out.sampled.shape == (NUM_REQS, K + 1)
