"""The runner integration's data flow (vllm_kimi_ext.verify.vllm_runner.sharded_sample)
on CPU: vLLM's input-batch layout in, vLLM's ``SamplerOutput`` out, decisions equal to
the full-logits reference.

vLLM's two Triton helpers the GPU path calls (``gather_draft_sampled``,
``get_num_sampled_and_rejected``) cannot run here; they are replaced by plain-torch
equivalents of their documented semantics for this test only (no prefill placeholders,
num_rejected = rows − num_sampled). TP=1: the all-gather is the identity.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.vllm


def test_sharded_sample_matches_reference(monkeypatch):
    import vllm.v1.worker.gpu.input_batch as ib
    import vllm.v1.worker.gpu.spec_decode.rejection_sampler as rs

    from vllm_kimi_ext.verify import ReferenceVerifier, VerifyBatch, VocabShardedVerifier
    from vllm_kimi_ext.verify.vllm_runner import sharded_sample

    def gather_draft_sampled(input_ids, positions, logits_indices, *_):
        return input_ids[logits_indices], positions[logits_indices]

    def get_num_sampled_and_rejected(num_sampled, seq_lens, cu, idx_mapping, prefill_len):
        return num_sampled, (cu[1:] - cu[:-1]).to(num_sampled.dtype) - num_sampled

    monkeypatch.setattr(rs, "gather_draft_sampled", gather_draft_sampled)
    monkeypatch.setattr(ib, "get_num_sampled_and_rejected", get_num_sampled_and_rejected)

    V, k, num_reqs = 50, 3, 3
    rows = num_reqs * (k + 1)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, V, generator=g) * 3
    argmax = logits.argmax(-1).view(num_reqs, k + 1)
    drafts = argmax[:, :k].clone()
    drafts[1, 2] = (drafts[1, 2] + 1) % V  # request 1 rejects its last draft
    # vLLM layout: row j's input token; the draft verified at row j is row j+1's input
    input_ids = torch.zeros(rows, dtype=torch.int64)
    for r in range(num_reqs):
        input_ids[r * (k + 1)] = 7  # the last accepted token
        input_ids[r * (k + 1) + 1:(r + 1) * (k + 1)] = drafts[r]
    positions = torch.arange(rows) + 100
    temps = torch.tensor([0.0, 0.9, 1.5])
    seeds = torch.tensor([5, 6, 7])
    states = SimpleNamespace(**{name: SimpleNamespace(gpu=t) for name, t in {
        "temperature": temps, "seeds": seeds, "top_k": torch.zeros(3, dtype=torch.int32),
        "min_p": torch.zeros(3)}.items()})
    runner = SimpleNamespace(
        sampler=SimpleNamespace(sampling_states=states,
                                req_states=SimpleNamespace(
                                    prefill_len=SimpleNamespace(gpu=torch.zeros(3)))),
        model=SimpleNamespace(compute_logits_local=lambda h: h),
        rejection_sampler=SimpleNamespace(num_speculative_steps=k))
    cu = torch.tensor([0, 4, 8, 12], dtype=torch.int32)
    batch = SimpleNamespace(
        input_ids=input_ids, positions=positions, logits_indices=torch.arange(rows),
        expanded_idx_mapping=torch.repeat_interleave(torch.arange(3), k + 1),
        expanded_local_pos=torch.arange(k + 1).repeat(3), cu_num_logits=cu,
        idx_mapping=torch.arange(3), idx_mapping_np=np.arange(3), seq_lens=None)

    def make_verifier(width):
        return VocabShardedVerifier(V, 1, 0, lambda t: t.unsqueeze(0), shard_width=width)

    out, num_sampled, num_rejected = sharded_sample(runner, logits, batch, make_verifier)
    ref = ReferenceVerifier(V).verify(
        logits, VerifyBatch.from_draft_tokens(drafts, temps, seeds, positions=positions))
    assert out.sampled_token_ids.shape == (num_reqs, k + 1)
    assert out.sampled_token_ids.dtype == torch.int64
    assert torch.equal(out.sampled_token_ids, ref.sampled)
    assert num_sampled.tolist() == ref.num_sampled.tolist()
    assert num_sampled[0] == k + 1  # greedy request 0 drafted the argmax: all accepted
    assert (num_sampled + num_rejected).tolist() == [k + 1] * num_reqs
    assert out.logprobs_tensors is None
