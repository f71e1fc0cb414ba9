"""GPU tier: the Triton verification kernels on CUDA (skipped without a GPU or Triton)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed"),
]


def test_triton_kernels_match_fused_torch():
    from testkit.verify_kernel_check import run_checks

    summary = run_checks("cuda", quick=False)
    assert summary["hash_words_checked"] > 0


@pytest.mark.parametrize("tp", [2, 8])
def test_sharded_triton_equals_reference(tp):
    from testkit.verify_equivalence import assert_equivalent
    from testkit.verify_simulate import simulate_sharded_verify
    from vllm_kimi_ext.verify import ReferenceVerifier, VerifyBatch
    from vllm_kimi_ext.verify.shard_stats import shard_local_stats_triton

    V, n, k = 32000, 48, 3
    g = torch.Generator().manual_seed(tp)
    drafts = torch.randint(0, V, (n, k), generator=g)
    temps = torch.where(torch.rand(n, generator=g) < 0.3, 0.0, torch.rand(n, generator=g) + 0.3)
    top_p = torch.where(torch.rand(n, generator=g) < 0.6, 0.95, 1.0)
    b = VerifyBatch.from_draft_tokens(drafts, temps, torch.arange(n), device="cuda", top_p=top_p)
    z = (torch.randn(b.num_rows, V, generator=g) * 2)
    L = b.layout()
    hit = (L.draft.cpu() >= 0) & (torch.rand(b.num_rows, generator=g) < 0.7)
    idx = hit.nonzero().squeeze(1)
    z[idx, L.draft.cpu()[idx]] = 12.0
    z = z.to(torch.bfloat16).cuda()
    S = -(-V // tp)
    shard_local_stats_triton(z[:, :S].contiguous(), L.temperature, None, L.draft, L.seeds,
                             L.positions, 0, V)  # compile before the rank threads start
    out, _, outs = simulate_sharded_verify(z, b, tp, V, backend="triton")
    for o in outs[1:]:
        assert torch.equal(o.sampled, out.sampled)
    ref = ReferenceVerifier(V).verify(z, b)
    assert_equivalent(ref, out, b, logits=z, vocab_size=V, allow_score_ties=True)
