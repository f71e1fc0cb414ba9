"""CPU microbenchmark: full-vocabulary reference vs one rank's sharded work.

Run: ``pytest bench/bench_verify_cpu.py`` (pytest-benchmark). The sharded case
times everything one rank does in a step (shard statistics, merge, decisions)
with a stand-in all-gather that just replicates the local payload ``TP`` times,
i.e. the local compute without any communication. Small dims keep it quick;
GPU numbers at Kimi dims come from ``bench/kernels/bench_sharded_verify.py``.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("pytest_benchmark")

from vllm_kimi_ext.verify import ReferenceVerifier, VerifyBatch, VocabShardedVerifier

V = 16384
TP = 8
NUM_REQS = 4
K = 3


def _inputs(temperature: float):
    g = torch.Generator().manual_seed(0)
    rows = NUM_REQS * (K + 1)
    logits = (torch.randn(rows, V, generator=g) * 3).to(torch.bfloat16)
    drafts = torch.randint(0, V, (NUM_REQS, K), generator=g)
    batch = VerifyBatch.from_draft_tokens(drafts, [temperature] * NUM_REQS,
                                          list(range(NUM_REQS)))
    return logits, batch


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_bench_reference_full_vocab(benchmark, temperature):
    logits, batch = _inputs(temperature)
    v = ReferenceVerifier(V)
    benchmark.group = f"verify T={temperature} V={V} rows={NUM_REQS * (K + 1)}"
    out = benchmark(v.verify, logits, batch)
    assert out.sampled.shape == (NUM_REQS, K + 1)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_bench_sharded_one_rank(benchmark, temperature):
    logits, batch = _inputs(temperature)
    S = V // TP
    shard = logits[:, 3 * S:4 * S].contiguous()

    def local_only_all_gather(t):
        return t.unsqueeze(0).expand(TP, *t.shape).contiguous()

    v = VocabShardedVerifier(V, TP, 3, local_only_all_gather, backend="torch")
    benchmark.group = f"verify T={temperature} V={V} rows={NUM_REQS * (K + 1)}"
    out = benchmark(v.verify, shard, batch)
    assert out.sampled.shape == (NUM_REQS, K + 1)
