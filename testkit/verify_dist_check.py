"""Multi-process check of the sharded step (``GraphVerifyStep``) over a real
``torch.distributed`` group.

``run(world_size)`` spawns ``world_size`` processes (gloo over TCP on
127.0.0.1 by default). Every rank builds the same scenarios from fixed seeds,
keeps only its vocabulary shard, verifies through real all-gathers and checks

* its output against the full-vocabulary reference (token for token, up to
  certified rounding flips, see :func:`.verify_equivalence.assert_equivalent`);
* that every rank produced the identical output;
* that the collectives it issued match the step's plan in number and bytes (2
  candidates per rank: flat random rows escalate, so every round runs).
"""

from __future__ import annotations

import torch

from testkit.distributed import free_port  # stdlib only
from testkit.verify_equivalence import assert_equivalent
from testkit.verify_simulate import as_verify_output, plan_for_layout, shard_columns
from vllm_kimi_ext.verify.batch import VerifyBatch
from vllm_kimi_ext.verify.graph_step import GraphVerifyStep
from vllm_kimi_ext.verify.ranks import CountingAllGather, torch_distributed_all_gather
from vllm_kimi_ext.verify.reference import ReferenceVerifier
from vllm_kimi_ext.verify.step_io import StepInputs


def scenarios(vocab_size: int = 1001, num_reqs: int = 48, k: int = 3):
    """(name, logits, batch, draft_probs) tuples, identical on every rank."""
    V = vocab_size
    out = []
    g = torch.Generator().manual_seed(4242)
    rows = num_reqs * (k + 1)

    def logits_for(drafts, boost):
        z = torch.randn(rows, V, generator=g) * 3
        d = torch.cat([torch.cat([torch.as_tensor(r), torch.tensor([-1])]) for r in drafts])
        hit = (d >= 0) & (torch.rand(rows, generator=g) < 0.6)
        idx = hit.nonzero().squeeze(1)
        z[idx, d[idx]] = z[idx].max(dim=1).values + boost
        return z

    drafts = torch.randint(0, V, (num_reqs, k), generator=g)
    drafts[0] = torch.tensor([0, V - 1, V // 2])
    seeds = torch.randint(-(2**62), 2**62, (num_reqs,), generator=g)
    temps = torch.where(torch.rand(num_reqs, generator=g) < 0.3, 0.0,
                        torch.rand(num_reqs, generator=g) * 1.5 + 0.2)
    lists = drafts.tolist()
    out.append(("greedy", logits_for(lists, 5.0),
                VerifyBatch.from_draft_tokens(drafts, torch.zeros(num_reqs), seeds), None))
    out.append(("mixed_onehot", logits_for(lists, 2.0),
                VerifyBatch.from_draft_tokens(drafts, temps, seeds), None))
    top_k = torch.where(torch.arange(num_reqs) % 3 == 0, 20, 0)
    min_p = torch.where(torch.arange(num_reqs) % 4 == 1, 0.05, 0.0)
    out.append(("top_k_min_p", logits_for(lists, 2.0),
                VerifyBatch.from_draft_tokens(drafts, temps, seeds, top_k=top_k, min_p=min_p),
                None))
    top_p = torch.where(torch.arange(num_reqs) % 5 == 4, 1.0, 0.95)
    z = logits_for(lists, 1.0).to(torch.bfloat16)  # bf16: ties at the cut
    out.append(("top_p", z, VerifyBatch.from_draft_tokens(
        drafts, temps, seeds, top_k=top_k, min_p=min_p, top_p=top_p), None))
    z = logits_for(lists, 1.0)
    q = torch.softmax(z + torch.randn(z.shape, generator=g), dim=1)
    b = VerifyBatch.from_draft_tokens(drafts, temps, seeds, top_k=top_k)
    x = torch.multinomial(q, 1, generator=g).squeeze(1)
    b = b.replace(draft_token_ids=torch.where(b.layout().is_bonus, -1, x))
    out.append(("probabilistic", z, b, q))
    return out


def worker(rank: int, world_size: int, port: int, backend: str = "gloo",
           vocab_size: int = 1001) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world_size)
    try:
        V = vocab_size
        raw = torch_distributed_all_gather()
        for name, logits, batch, q in scenarios(V):
            ag = CountingAllGather(raw)
            shard = shard_columns(logits, world_size, V, pad_value=1e30)[rank]
            step = GraphVerifyStep(V, world_size, rank, ag, backend="torch")
            L = batch.layout()
            plan = plan_for_layout(L, tp_size=world_size, shard_width=step.shard_width,
                                   vocab_size=V, probabilistic=q is not None,
                                   logits_bytes=logits.element_size(), candidates=2,
                                   escalation_slots=batch.num_rows)
            out = as_verify_output(step.run(shard, StepInputs.from_layout(L, V), plan, q))
            assert ag.num_calls == plan.num_collectives, (name, ag.calls, plan.describe())
            assert ag.bytes_sent == plan.bytes_sent_per_rank, (name, ag.calls, plan.describe())
            ref = ReferenceVerifier(V).verify(logits, batch, q)
            assert_equivalent(ref, out, batch, logits=logits, vocab_size=V, draft_probs=q)
            every = raw(out.sampled.to(torch.float32))
            assert all(torch.equal(every[0], every[r]) for r in range(world_size)), name
    finally:
        dist.destroy_process_group()


def run(world_size: int, backend: str = "gloo", vocab_size: int = 1001) -> None:
    """Spawn the ranks; raises if any rank fails."""
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(world_size, free_port(), backend, vocab_size),
             nprocs=world_size, join=True)


if __name__ == "__main__":
    import sys

    run(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    print("ok")
