"""The runner integration's data flow
(vllm_kimi_ext.integration.sharded_verify.sampler.ShardedSampler.sharded_sample)
on CPU: vLLM's input-batch layout and ``SamplingStates`` in, vLLM's ``SamplerOutput``
out, decisions equal to the full-logits reference token for token — at TP=1 and at
TP=2 (one thread per rank, each computing only its vocabulary shard), with Kimi's
recommended sampling (top_p 0.95 at T=1.0 and T=0.6) and with probabilistic drafts
read from a vLLM-layout draft-logits cache ``[request slot, draft step, V]``.

vLLM's two Triton helpers the GPU path calls (``gather_draft_sampled``,
``get_num_sampled_and_rejected``) cannot run here; they are replaced by plain-torch
equivalents of their documented semantics for this test only (no prefill placeholders,
num_rejected = rows − num_sampled).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.vllm

V, K = 300, 3


@pytest.fixture
def torch_helpers(monkeypatch):
    import importlib

    from testkit.runner_stand_ins import TORCH_HELPERS

    for (module, name), fn in TORCH_HELPERS.items():
        monkeypatch.setattr(importlib.import_module(module), name, fn)


def _case(temps, top_p, probabilistic, seed=0):
    """Logits, drafts and vLLM-layout inputs for ``len(temps)`` requests of K drafts.

    Request slots are not batch positions (``idx_mapping`` = slots 5, 2, 7, ...), as
    in vLLM; the draft cache is indexed by slot and draft step."""
    n = len(temps)
    rows = n * (K + 1)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, V, generator=g) * 2.5
    slots = torch.tensor([5, 2, 7, 0, 3, 6][:n])
    num_slots = 8
    temp_by_slot = torch.ones(num_slots)
    temp_by_slot[slots] = torch.tensor(temps)
    top_p_by_slot = torch.ones(num_slots)
    top_p_by_slot[slots] = top_p
    cache = q_full = None
    argmax = logits.argmax(-1).view(n, K + 1)
    drafts = argmax[:, :K].clone()
    drafts[1, 2] = (drafts[1, 2] + 1) % V  # request 1 rejects its last draft (if greedy)
    if probabilistic:
        # a draft that roughly knows the target: its logits plus noise (pre-temperature)
        cache = torch.randn(num_slots, K, V, generator=g) * 2
        for i, s in enumerate(slots.tolist()):
            cache[s] = logits[i * (K + 1):i * (K + 1) + K] + torch.randn(K, V, generator=g)
        cache = cache.to(torch.bfloat16)
        q_full = torch.zeros(rows, V)
        for i, s in enumerate(slots.tolist()):
            t = temps[i] if temps[i] > 0 else 1.0
            for j in range(K + 1):
                q_full[i * (K + 1) + j] = torch.softmax(cache[s, min(j, K - 1)].float() / t, -1)
            sampling = torch.multinomial(q_full[i * (K + 1):i * (K + 1) + K], 1, generator=g)
            if temps[i] > 0:
                drafts[i] = sampling.squeeze(1)
    input_ids = torch.zeros(rows, dtype=torch.int64)
    for r in range(n):
        input_ids[r * (K + 1)] = 7  # the last accepted token
        input_ids[r * (K + 1) + 1:(r + 1) * (K + 1)] = drafts[r]
    positions = torch.arange(rows) + 100
    seeds = torch.arange(num_slots) * 7 + 3
    states = SimpleNamespace(**{name: SimpleNamespace(gpu=t) for name, t in {
        "temperature": temp_by_slot, "seeds": seeds,
        "top_k": torch.full((num_slots,), V, dtype=torch.int32),  # vLLM's "off"
        "min_p": torch.zeros(num_slots), "top_p": top_p_by_slot}.items()})
    cu = torch.arange(n + 1, dtype=torch.int32) * (K + 1)
    batch = SimpleNamespace(
        input_ids=input_ids, positions=positions, logits_indices=torch.arange(rows),
        expanded_idx_mapping=torch.repeat_interleave(slots, K + 1),
        expanded_local_pos=torch.arange(K + 1).repeat(n), cu_num_logits=cu,
        idx_mapping=slots, idx_mapping_np=slots.numpy(), seq_lens=None)
    params = {s: {"temperature": t, "top_p": top_p} for s, t in zip(slots.tolist(), temps)}
    return SimpleNamespace(logits=logits, drafts=drafts, states=states, batch=batch,
                           params=params,
                           cache=cache, q_full=q_full, temps=temps, top_p=top_p,
                           seeds=seeds[slots], positions=positions)


def _run(case, tp):
    from testkit.verify_simulate import run_ranks, shard_columns
    from vllm_kimi_ext.integration.sharded_verify.gate import PARAMS_ATTR
    from vllm_kimi_ext.integration.sharded_verify.sampler import EagerStep, ShardedSampler
    from vllm_kimi_ext.verify.graph_step import GraphVerifyStep

    shards = shard_columns(case.logits, tp, V)
    cache = None if case.cache is None else SimpleNamespace(values=case.cache, row_mapping=None)

    def rank_fn(rank, all_gather):
        sampler = SimpleNamespace(
            sampling_states=case.states,
            req_states=SimpleNamespace(prefill_len=SimpleNamespace(gpu=torch.zeros(8))))
        setattr(sampler, PARAMS_ATTR, case.params)
        runner = SimpleNamespace(
            sampler=sampler,
            model=SimpleNamespace(compute_logits_local=lambda h: shards[rank][:h.shape[0]]),
            rejection_sampler=SimpleNamespace(num_speculative_steps=K),
            speculator=SimpleNamespace(draft_logits=cache))
        width = shards[rank].shape[1]
        s = ShardedSampler(runner)  # this rank's step over run_ranks' all-gather, eager
        s.verifiers[width] = EagerStep(GraphVerifyStep(V, tp, rank, all_gather,
                                                       shard_width=width))
        out = s.sharded_sample(case.logits, case.batch)
        return out, s.verifiers[width].last_plan

    return run_ranks(tp, rank_fn)


def _reference(case):
    from vllm_kimi_ext.verify import ReferenceVerifier, VerifyBatch

    batch = VerifyBatch.from_draft_tokens(
        case.drafts, case.temps, case.seeds, positions=case.positions,
        top_p=[case.top_p] * len(case.temps))
    return ReferenceVerifier(V).verify(case.logits, batch, case.q_full)


CASES = {
    "greedy_and_temperature": ([0.0, 0.9, 1.5], 1.0, False),
    "kimi_t1.0_top_p0.95": ([1.0, 1.0, 0.0, 1.0], 0.95, False),
    "kimi_t0.6_top_p0.95": ([0.6, 0.6, 0.6, 0.0], 0.95, False),
    "probabilistic_kimi_top_p": ([1.0, 0.6, 0.0, 1.0, 0.6], 0.95, True),
    "probabilistic_no_top_p": ([1.0, 0.7, 0.0], 1.0, True),
}


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("name", sorted(CASES))
def test_sharded_sample_matches_reference(torch_helpers, name, tp):
    temps, top_p, probabilistic = CASES[name]
    case = _case(temps, top_p, probabilistic)
    results, group = _run(case, tp)
    ref = _reference(case)
    n = len(temps)
    for rank, ((out, num_sampled, num_rejected), plan) in enumerate(results):
        assert out.sampled_token_ids.shape == (n, K + 1)
        assert out.sampled_token_ids.dtype == torch.int64
        assert torch.equal(out.sampled_token_ids, ref.sampled), f"rank {rank}"
        assert num_sampled.tolist() == ref.num_sampled.tolist()
        assert (num_sampled + num_rejected).tolist() == [K + 1] * n
        assert out.logprobs_tensors is None
        names = [c.name for c in plan.rounds]
        assert names[0] == ("stats" if plan.stats_only else "stats+candidates")
        assert ("escalation" in names) == (top_p < 1)
        # the residual round: probabilistic drafts on sampling rows without a cut
        assert ("residual" in names) == (probabilistic and top_p == 1)
        # what was sent is what was planned
        assert [s for s, _ in group.calls[rank]] == [(c.rows, c.width) for c in plan.rounds]
    if name == "greedy_and_temperature":
        assert ref.num_sampled[0] == K + 1  # greedy request drafted the argmax
    if probabilistic:  # both outcomes occur: accepted sampled drafts and rejections
        sampling = [i for i, t in enumerate(temps) if t > 0]
        assert int(ref.num_sampled[sampling].max()) > 1
        assert int(ref.num_sampled[sampling].min()) <= K


def test_the_reference_sees_the_draft_distribution(torch_helpers):
    """The probabilistic case is not one-hot in disguise: verified against a one-hot q
    the same drafts give other tokens."""
    case = _case(*CASES["probabilistic_kimi_top_p"])
    (out, _, _), _ = _run(case, 2)[0][0]
    one_hot = SimpleNamespace(**{**vars(case), "cache": None, "q_full": None})
    (out_1, _, _), _ = _run(one_hot, 2)[0][0]
    assert not torch.equal(out.sampled_token_ids, out_1.sampled_token_ids)
    assert np.array_equal(case.batch.idx_mapping_np, [5, 2, 7, 0, 3])
