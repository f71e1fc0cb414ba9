"""Functions run on each tensor-parallel rank by the distributed tests.

They live in the package (not in test files) because spawned ranks import them
by module path. Each returns plain data so results pickle back to the parent.
"""

from __future__ import annotations

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

    padded = pad_vocab_size(hf_text_config.vocab_size, DEFAULT_VOCAB_PADDING_SIZE * tp)
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

    from vllm_kimi_ext.comm import CollectiveCounter
    from vllm_kimi_ext.testing.vllm_cpu import (
        compute_logits,
        load_model,
        make_vllm_config,
        run_forward,
    )

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
    }


def _local_logits_check(model, cfg, ids, rows) -> dict:
    """Patch 0002: ``compute_logits_local`` returns this rank's vocab shard of
    the gathered logits, with no collective."""
    import torch
    from vllm.distributed import get_tensor_model_parallel_rank

    from vllm_kimi_ext.comm import CollectiveCounter
    from vllm_kimi_ext.testing.vllm_cpu import compute_logits, run_forward

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
