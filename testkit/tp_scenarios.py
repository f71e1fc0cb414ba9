"""Functions run on each tensor-parallel rank by the distributed tests.

They live in the test kit (not in test files) because spawned ranks import them
by module path. Each returns plain data so results pickle back to the parent.
"""

from __future__ import annotations

import contextlib
from typing import Any


def expected_target_pass(hf_text_config: Any, tp: int, rows: int) -> dict[str, int]:
    """Collectives one target forward + logits must make, derived from the config.

    Per decoder layer: the attention output projection (row-parallel o_proj)
    all-reduces, and so does the MLP (dense MLP down_proj, or the MoE block's
    single reduction of routed + shared experts). The vocab-parallel embedding
    all-reduces once. ``compute_logits`` all-gathers the vocab shards of
    ``[rows, padded_vocab / tp]`` (bf16).
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        DEFAULT_VOCAB_PADDING_SIZE,
        pad_vocab_size,
    )

    # padded to a multiple of 64, then split evenly across the ranks
    padded = pad_vocab_size(hf_text_config.vocab_size, DEFAULT_VOCAB_PADDING_SIZE)
    return {
        "all_reduce": 2 * hf_text_config.num_hidden_layers + 1,
        "all_reduce_bytes": (2 * hf_text_config.num_hidden_layers + 1)
        * rows * hf_text_config.hidden_size * 2,
        "all_gather": 1,
        "all_gather_bytes": rows * (padded // tp) * 2,
    }


def count_discrepancies(summary: dict, expected: dict[str, int]) -> list[str]:
    """Compare a counter summary for one pass with :func:`expected_target_pass`."""
    got = {"all_reduce": 0, "all_reduce_bytes": 0, "all_gather": 0, "all_gather_bytes": 0}
    others = []
    for (group, _phase, op), (n, nbytes) in summary.items():
        if group == "tp" and op in ("all_reduce", "all_gather"):
            got[op] += n
            got[f"{op}_bytes"] += nbytes
        else:
            others.append(f"unexpected {group}/{op} x{n}")
    return [f"{k}: expected {expected[k]}, counted {got[k]}"
            for k in expected if expected[k] != got[k]] + others


def target_pass_collectives(rank: int, model_dir: str, rows: int) -> dict:
    """Load the tiny target at TP=world and run one forward + logits under the
    counter twice: as shipped (``clean``) and with a planted extra all-reduce
    (``planted``), so a test can show the count check catches an added collective."""
    import torch
    from vllm.distributed import get_tensor_model_parallel_world_size

    import vllm_kimi_ext.runtime  # noqa: F401 - registers the patch CollectiveCounter installs
    from testkit.vllm_cpu import (
        compute_logits,
        load_model,
        make_vllm_config,
        run_forward,
    )
    from vllm_kimi_ext.comm import CollectiveCounter

    tp = get_tensor_model_parallel_world_size()
    cfg = make_vllm_config(model_dir, tensor_parallel_size=tp)
    model, report = load_model(cfg)
    ids = torch.arange(rows) % cfg.model_config.get_vocab_size()

    def one_pass() -> tuple[dict, list[float]]:
        with CollectiveCounter() as cc:
            hidden = run_forward(model, cfg, ids, torch.arange(rows))
            with cc.phase("logits"):
                logits = compute_logits(model, cfg, hidden)
        return cc.summary(), logits[0, :16].float().tolist()

    clean, logits_row0 = one_pass()
    local = _local_logits_check(model, cfg, ids, rows)
    verify = sharded_verify_on_model(model, cfg)
    planted_patch = _plant_extra_all_reduce()
    try:
        planted, _ = one_pass()
    finally:
        planted_patch.revert()
    return {
        "clean": clean,
        "planted": planted,
        "expected": expected_target_pass(cfg.model_config.hf_text_config, tp, rows),
        "unwritten": report.unwritten,
        "logits_row0": logits_row0,
        "local": local,
        "verify": verify,
    }


def _local_logits_check(model, cfg, ids, rows) -> dict:
    """Patch 0002: ``compute_logits_local`` returns this rank's vocab shard of
    the gathered logits, with no collective."""
    import torch
    from vllm.distributed import get_tensor_model_parallel_rank

    import vllm_kimi_ext.runtime  # noqa: F401 - registers the patch CollectiveCounter installs
    from testkit.vllm_cpu import compute_logits, run_forward
    from vllm_kimi_ext.comm import CollectiveCounter

    if not hasattr(model, "compute_logits_local"):
        return {"available": False}
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.gpu.sample.batch_shard import batch_sharded_sampling_enabled

    hidden = run_forward(model, cfg, ids, torch.arange(rows))
    full = compute_logits(model, cfg, hidden)
    with CollectiveCounter() as cc, set_current_vllm_config(cfg), torch.no_grad():
        local = model.compute_logits_local(hidden)
    rank = get_tensor_model_parallel_rank()
    width = local.shape[-1]
    cfg.parallel_config.enable_batch_sharded_sampling = True
    return {
        "available": True,
        "collectives": len(cc.calls),
        "shape": tuple(local.shape),
        "matches_slice": bool(torch.equal(local, full[:, rank * width:(rank + 1) * width])),
        "batch_sharded_enabled": batch_sharded_sampling_enabled(cfg, model),
    }


def _plant_extra_all_reduce():
    """A deliberately wrong model: one more all-reduce per dense MLP call."""
    from vllm.distributed import tensor_model_parallel_all_reduce
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2MLP

    from vllm_kimi_ext.patching import Patch

    class ExtraAllReduceInMLP(Patch[DeepseekV2MLP]):
        def forward(self, x):
            out = ExtraAllReduceInMLP.original("forward")(self, x)
            tensor_model_parallel_all_reduce(out.new_zeros(1))
            return out

    ExtraAllReduceInMLP.apply()
    return ExtraAllReduceInMLP


def sharded_verify_on_model(model, cfg, seed: int = 7) -> dict:
    """Verification of a speculative step on the real tiny Kimi-K2.5 at TP=world.

    Long because: one scenario read top to bottom (build the batch, run both verifiers,
    count the collectives, compare), which a test asserts on as a whole.

    Target hidden states for 3 requests × (3 drafts + bonus) rows; drafts are a
    mix of the target's argmax (accepted under greedy) and other tokens. The
    vocab-sharded step (``GraphVerifyStep``) works from ``compute_logits_local`` and exchanges
    statistics through vLLM's TP group (``GroupCoordinator.all_gather``, so the
    collective counter sees it, in phase "verify"); the reference verifier runs
    on the gathered full logits. Also runs a top-p step (Kimi's own settings,
    temperature 1.0 / 0.6 with top_p 0.95) through the sharded cut; planned
    with ``top_p_sharded=False`` it is a counted fallback.
    """
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import get_tensor_model_parallel_rank, get_tp_group

    import vllm_kimi_ext.runtime  # noqa: F401 - registers the patch CollectiveCounter installs
    from testkit.verify_hist_step import HistVerifyStep, hist_plan
    from testkit.verify_simulate import as_verify_output
    from testkit.vllm_cpu import compute_logits, run_forward
    from vllm_kimi_ext.comm import CollectiveCounter
    from vllm_kimi_ext.verify import (
        FallbackCounter,
        GraphVerifyStep,
        ReferenceVerifier,
        StepInputs,
        VerifyBatch,
        group_coordinator_all_gather,
        plan_from_params,
    )

    vocab = cfg.model_config.get_vocab_size()
    num_reqs, k = 3, 3
    rows = num_reqs * (k + 1)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows,), generator=gen)
    hidden = run_forward(model, cfg, ids, torch.arange(rows))
    full = compute_logits(model, cfg, hidden)[:, :vocab]
    with set_current_vllm_config(cfg), torch.no_grad():
        local = model.compute_logits_local(hidden)
    argmax = full.float().argmax(dim=-1).view(num_reqs, k + 1)
    drafts = argmax[:, :k].clone()
    drafts[1, 1] = (drafts[1, 1] + 1) % vocab  # a rejection in the middle of request 1
    drafts[2, 0] = (drafts[2, 0] + 7) % vocab  # and at the first draft of request 2
    temperature = [0.0, 0.7, 1.3]
    seeds = [11, 22, 33]
    params = [{"temperature": t} for t in temperature]
    tp = get_tp_group().world_size
    fallbacks = FallbackCounter()
    shape = dict(tp_size=tp, vocab_size=vocab, num_rows=rows, max_rows_per_req=k + 1,
                 shard_width=local.shape[-1], logits_bytes=local.element_size())
    plan = plan_from_params(params, counter=fallbacks, **shape)
    batch = VerifyBatch.from_draft_tokens(drafts, temperature, seeds)
    step = GraphVerifyStep(vocab, tp, get_tensor_model_parallel_rank(),
                           group_coordinator_all_gather(get_tp_group()),
                           shard_width=local.shape[-1])
    with CollectiveCounter() as cc, cc.phase("verify"):
        out = as_verify_output(step.run(local, StepInputs.from_layout(batch.layout(), vocab),
                                        plan))
    ref = ReferenceVerifier(vocab).verify(full, batch)
    top_p_plan = plan_from_params([{"temperature": 1.0, "top_p": 0.9}], counter=fallbacks,
                                  top_p_sharded=False, **{**shape, "num_rows": k + 1})
    kimi = [{"temperature": t, "top_p": 0.95} for t in (1.0, 0.6, 1.0)]
    # one escalation slot per row: no deferral, so the tokens equal the reference's
    kimi_plan = plan_from_params(kimi, escalation_slots=rows, **shape)
    top_p_batch = VerifyBatch.from_draft_tokens(drafts, [1.0, 0.6, 1.0], seeds,
                                                top_p=[0.95] * num_reqs)
    with CollectiveCounter() as cc_p, cc_p.phase("verify"):
        out_p = step.run(local, StepInputs.from_layout(top_p_batch.layout(), vocab), kimi_plan)
    ref_p = ReferenceVerifier(vocab).verify(full, top_p_batch)
    top_p_escalations = {}
    hist_step = HistVerifyStep(vocab, tp, get_tensor_model_parallel_rank(),
                               group_coordinator_all_gather(get_tp_group()),
                               shard_width=local.shape[-1])
    for esc, esc_step in (("rows", step), ("hist", hist_step)):  # each escalation, counted
        esc_plan = plan_from_params(kimi, escalation_slots=rows, **shape)
        esc_plan = hist_plan(esc_plan) if esc == "hist" else esc_plan
        with CollectiveCounter() as cc_e, cc_e.phase("verify"):
            out_e = esc_step.run(local, StepInputs.from_layout(top_p_batch.layout(), vocab),
                                 esc_plan)
        top_p_escalations[esc] = {
            "sent": [(c.name, c.rows, c.width, c.element_bytes) for c in esc_plan.rounds],
            "counted": cc_e.summary(),
            "sharded_tokens": out_e.tokens(),
            "escalated_rows": int(out_e.uncertified.sum()),
            "deferred_rows": int(out_e.deferred.sum()),
            "bytes_per_escalated_row": esc_plan.bytes_per_escalated_row_per_rank,
            "logits_dtype": str(local.dtype),
        }
    runner_path = _runner_path_step(model, cfg, hidden, full, drafts)
    return {
        "runner": runner_path,
        "plan_collectives": plan.num_collectives,
        "counted": cc.summary(),
        "rows": rows,
        "sharded_tokens": out.tokens(),
        "reference_tokens": ref.tokens(),
        "num_sampled": out.num_sampled.tolist(),
        "reference_num_sampled": ref.num_sampled.tolist(),
        "stock_gather_bytes_per_rank": rows * local.shape[-1] * local.element_size(),
        "top_p_fallback": getattr(top_p_plan, "reason", None),
        "fallbacks": fallbacks.as_dict(),
        "top_p": {
            "plan_collectives": kimi_plan.num_collectives,
            "sent": [(c.name, c.rows, c.width, c.element_bytes) for c in kimi_plan.rounds],
            "counted": cc_p.summary(),
            "sharded_tokens": out_p.tokens(),
            "reference_tokens": ref_p.tokens(),
            "escalated_rows": int(out_p.uncertified.sum()),
            "escalations": top_p_escalations,
        },
    }


def _runner_path_step(model, cfg, hidden, full, drafts) -> dict:
    """The same step through the runner integration (``ShardedSampler.sample``, the
    body of the ``GPUModelRunner.sample`` patch) with Kimi's sampling (T 1.0 / 0.6,
    top_p 0.95) on stand-ins of vLLM's runner objects, the real model's
    ``compute_logits_local`` and vLLM's real TP group; vLLM's two Triton helpers
    replaced by their torch equivalents."""
    import importlib
    from unittest import mock

    import torch
    from vllm.config import set_current_vllm_config

    import vllm_kimi_ext.runtime  # noqa: F401 - registers the patch CollectiveCounter installs
    from testkit.runner_stand_ins import (
        TORCH_HELPERS,
        stand_in_runner,
        vllm_layout_batch,
    )
    from vllm_kimi_ext.comm import CollectiveCounter
    from vllm_kimi_ext.integration.sharded_verify.sampler import ShardedSampler
    from vllm_kimi_ext.verify import ReferenceVerifier, VerifyBatch

    vocab = cfg.model_config.get_vocab_size()
    temps = [1.0, 0.6, 1.0]
    params = [{"temperature": t, "top_p": 0.95} for t in temps]
    runner = stand_in_runner(params, vocab=vocab, num_steps=drafts.shape[1])
    runner.model = model
    batch = vllm_layout_batch(drafts)
    sampler = ShardedSampler.of(runner)
    before = sampler.telemetry.fallbacks.as_dict()

    def stock(*_a):
        raise AssertionError("an eligible step ran the stock sample")

    with contextlib.ExitStack() as stack:
        for (module, name), fn in TORCH_HELPERS.items():
            stack.enter_context(mock.patch.object(importlib.import_module(module), name, fn))
        stack.enter_context(set_current_vllm_config(cfg))
        stack.enter_context(torch.no_grad())
        cc = stack.enter_context(CollectiveCounter())
        out, num_sampled, _ = sampler.sample(stock, hidden, batch, None)
    verifier = next(iter(sampler.verifiers.values()))
    states = runner.sampler.sampling_states
    ref = ReferenceVerifier(vocab).verify(full, VerifyBatch.from_draft_tokens(
        drafts, temps, states.seeds.gpu, positions=batch.positions, top_p=[0.95] * 3))
    return {
        "tokens": [r[:n] for r, n in zip(out.sampled_token_ids.tolist(),
                                         num_sampled.tolist())],
        "reference_tokens": ref.tokens(),
        "counted": cc.summary(),
        "sent": [(c.name, c.rows, c.width) for c in verifier.last_plan.rounds],
        "plan_bytes": verifier.last_plan.bytes_sent_per_rank,
        "new_fallbacks": {k: v - before.get(k, 0)
                          for k, v in sampler.telemetry.fallbacks.as_dict().items()
                          if v != before.get(k, 0)},
    }
