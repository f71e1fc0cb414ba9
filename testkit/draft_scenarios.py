"""Draft-side collective counting: tiny drafts on a tiny Kimi-K2.5 target.

Rank functions for ``run_tp`` (spawned ranks import them by module path) and
the expectations they are checked against, derived from the draft configs:

* a sharded EAGLE-3 draft (Llama-style or MLA layer) makes, per draft token,
  one embedding all-reduce, one all-reduce per row-parallel output of each
  decoder layer (attention ``o_proj`` and MLP ``down_proj``) and one logits
  all-gather of ``[rows, padded_draft_vocab / tp]``: ``2L + 2`` (4 for one
  layer);
* a DFlash drafter makes the same ``2L + 2`` per *step* (one pass drafts the
  whole block of ``k + 1`` query rows);
* with a replicated draft embedding the embedding all-reduce disappears;
* a draft run un-sharded (``draft_tensor_parallel_size: 1``) makes none.

Also a tiny DFlash drafter writer (Qwen3-style layers, ``DFlashDraftModel``)
used only to count its forward pass.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from testkit.checkpoints import TinyKimiSpec, _init_tensor, _mlp

#: Module the EAGLE draft-TP-1 vLLM patch (0006) adds; tests needing it skip without it.
UNSHARDED_DRAFT_MODULE = "vllm.v1.worker.gpu.spec_decode.unsharded_draft"
#: Case option (not a vLLM speculative-config key): replicate the draft's input embedding
#: the way the plugin's ``VLLM_KIMI_EXT_REPLICATE_DRAFT_EMBEDDING`` runtime patch does.
REPLICATED_EMBEDDING_OPTION = "replicate_draft_embedding"


def has_vllm_symbol(module: str, symbol: str) -> bool:
    """Whether the running vLLM has ``module.symbol`` (a symbol a patch adds;
    ``symbol`` may be dotted, e.g. ``Class.attribute``)."""
    import importlib

    try:
        obj = importlib.import_module(module)
    except ImportError:
        return False
    for part in symbol.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def has_unsharded_tp_group_patch() -> bool:
    """Patch 0006: the per-rank size-1 tensor-parallel group."""
    return has_vllm_symbol("vllm.distributed.parallel_state", "unsharded_tensor_parallel")


def unhonored_draft_tp_reason(cfg) -> str | None:
    """Why patch 0006 does not honor ``draft_tensor_parallel_size=1`` for ``cfg`` (None: it
    does), from the same decision the warning at configuration prints
    (``unsharded_draft_refusal``); the warning text is checked by the patch's vLLM-tree
    tests."""
    from vllm.v1.worker.gpu.spec_decode.speculator_config import unsharded_draft_refusal

    spec = cfg.speculative_config
    supported = getattr(type(spec.speculator_config), "supports_unsharded_draft", False)
    return unsharded_draft_refusal(spec, supported)


def has_unsharded_draft_patch() -> bool:
    """Patch 0006: EAGLE/EAGLE-3/MTP drafts built un-sharded at draft TP 1."""
    return has_vllm_symbol(UNSHARDED_DRAFT_MODULE, "draft_tp_context")


def draft_tp_context(cfg):
    """The tensor-parallel group the speculator runs ``cfg``'s draft in (it enters it
    around ``propose``; these scenarios call the model directly, so they enter it too)."""
    import contextlib

    if not has_unsharded_draft_patch():
        return contextlib.nullcontext()
    from vllm.v1.worker.gpu.spec_decode import unsharded_draft

    return unsharded_draft.draft_tp_context(unsharded_draft.draft_runs_unsharded(cfg))


def _runs_unsharded(cfg) -> bool:
    if not has_unsharded_draft_patch():
        return False
    from vllm.v1.worker.gpu.spec_decode.unsharded_draft import draft_runs_unsharded

    return draft_runs_unsharded(cfg)


def ensure_unsharded_tp_group() -> None:
    """Create the size-1 groups as ``initialize_model_parallel`` does when
    ``draft_tensor_parallel_size`` is 1 (collective: every rank calls it); the TP test
    harness initializes without a speculative config."""
    if not has_unsharded_tp_group_patch():
        return
    from vllm.distributed import parallel_state as ps

    if ps._UNSHARDED_TP is None:
        ps.initialize_unsharded_tp_group()


def has_replicated_embedding_patch() -> bool:
    """The replicated draft embedding is a runtime patch of the plugin: present
    whenever vLLM is."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------- #
# Tiny DFlash drafter                                                          #
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class TinyDFlashSpec:
    """A tiny block-diffusion drafter of Qwen3-style layers (z-lab layout)."""

    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    head_dim: int = 16
    intermediate_size: int = 96
    block_size: int = 4
    target_layer_ids: tuple[int, ...] = (0, 1)  # DFlash semantics (vLLM adds 1)


def qwen3_layer_tensors(pre: str, hidden: int, heads: int, kv_heads: int, head_dim: int,
                        intermediate: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Names and shapes of one Qwen3 decoder layer (q/k norms, SwiGLU MLP)."""
    yield f"{pre}.input_layernorm.weight", (hidden,)
    yield f"{pre}.post_attention_layernorm.weight", (hidden,)
    yield f"{pre}.self_attn.q_proj.weight", (heads * head_dim, hidden)
    yield f"{pre}.self_attn.k_proj.weight", (kv_heads * head_dim, hidden)
    yield f"{pre}.self_attn.v_proj.weight", (kv_heads * head_dim, hidden)
    yield f"{pre}.self_attn.o_proj.weight", (hidden, heads * head_dim)
    yield f"{pre}.self_attn.q_norm.weight", (head_dim,)
    yield f"{pre}.self_attn.k_norm.weight", (head_dim,)
    yield from _mlp(f"{pre}.mlp", hidden, intermediate)


def write_tiny_dflash(path: str | Path, target: TinyKimiSpec | None = None,
                      spec: TinyDFlashSpec | None = None, *, seed: int = 3,
                      dtype: torch.dtype = torch.bfloat16) -> dict[str, tuple[int, ...]]:
    """Write a tiny ``DFlashDraftModel`` checkpoint for a :class:`TinyKimiSpec`
    target. It carries its own ``embed_tokens``/``lm_head`` so the loader can
    prove every parameter written (z-lab checkpoints share the target's; the
    collectives are the same either way)."""
    from safetensors.torch import save_file

    target = target or TinyKimiSpec()
    spec = spec or TinyDFlashSpec()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    h = target.hidden_size
    n_aux = len(spec.target_layer_ids)
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": h,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_size,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 4096,
        "vocab_size": target.vocab_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "torch_dtype": "bfloat16",
        "block_size": spec.block_size,
        "num_target_layers": target.num_hidden_layers,
        "dflash_config": {"mask_token_id": target.pad_token_id,
                          "target_layer_ids": list(spec.target_layer_ids)},
    }
    (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    nh, nkv, hd = spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim

    def names():
        yield "fc.weight", (h, n_aux * h)
        yield "hidden_norm.weight", (h,)
        yield "norm.weight", (h,)
        yield "embed_tokens.weight", (target.vocab_size, h)
        yield "lm_head.weight", (target.vocab_size, h)
        for i in range(spec.num_hidden_layers):
            yield from qwen3_layer_tensors(f"layers.{i}", h, nh, nkv, hd,
                                           spec.intermediate_size)

    gen = torch.Generator().manual_seed(seed)
    out = {n: _init_tensor(n, s, gen).to(dtype).contiguous() for n, s in names()}
    save_file(out, str(path / "model.safetensors"), metadata={"format": "pt"})
    return {k: tuple(v.shape) for k, v in out.items()}


# --------------------------------------------------------------------------- #
# Expectations                                                                 #
# --------------------------------------------------------------------------- #


def expected_draft_pass(*, num_layers: int, hidden: int, draft_vocab: int, tp: int,
                        rows: int, placement: str = "sharded") -> dict[str, int]:
    """Collectives of one draft forward + compute_logits over ``rows`` rows.

    ``placement``: ``sharded`` (stock), ``replicated_embedding`` (no embedding
    all-reduce) or ``unsharded`` (draft TP 1: nothing).
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        DEFAULT_VOCAB_PADDING_SIZE,
        pad_vocab_size,
    )

    if placement == "unsharded":
        return {"all_reduce": 0, "all_reduce_bytes": 0, "all_gather": 0,
                "all_gather_bytes": 0}
    n_ar = 2 * num_layers + (1 if placement == "sharded" else 0)
    # VocabParallelEmbedding pads the vocabulary to a multiple of 64, then splits
    # it evenly across the ranks
    padded = pad_vocab_size(draft_vocab, DEFAULT_VOCAB_PADDING_SIZE)
    return {
        "all_reduce": n_ar,
        "all_reduce_bytes": n_ar * rows * hidden * 2,
        "all_gather": 1,
        "all_gather_bytes": rows * (padded // tp) * 2,
    }


def summarize(summary: dict, phase: str = "draft") -> dict[str, int]:
    got = {"all_reduce": 0, "all_reduce_bytes": 0, "all_gather": 0, "all_gather_bytes": 0,
           "other": 0}
    for (group, ph, op), (n, nbytes) in summary.items():
        if ph != phase:
            continue
        if group == "tp" and op in ("all_reduce", "all_gather"):
            got[op] += n
            got[f"{op}_bytes"] += nbytes
        else:
            got["other"] += n
    return got


# --------------------------------------------------------------------------- #
# Rank functions                                                               #
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class DraftCase:
    """One draft to load and count: ``method`` eagle3/dflash, ``path`` its
    checkpoint, ``options`` extra speculative-config keys."""

    name: str
    method: str
    path: str
    options: tuple[tuple[str, Any], ...] = ()
    rows: int = 1
    num_speculative_tokens: int = 3


def _aux_input(model, rows: int, seed: int = 7) -> torch.Tensor:
    fc = model.model.fc
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, fc.input_size, generator=gen).to(torch.bfloat16)


def _load_draft(case: DraftCase, cfg, target):
    """The draft the way the speculator loads it. EAGLE-3: vLLM's own
    ``load_eagle_model`` (embedding / LM-head sharing, draft TP) with its
    ``get_model`` call served by our CPU loader (same create → load →
    post-process steps, plus the poison check; vLLM's ``get_model`` empties an
    accelerator cache a CPU-only torch lacks). DFlash: our loader directly."""
    from testkit.vllm_cpu import load_model

    if case.method != "eagle3":
        model, report = load_model(cfg, cfg.speculative_config.draft_model_config)
        return model, report.unwritten

    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.gpu.spec_decode.eagle import utils as eagle_utils

    reports = []

    def cpu_get_model(*, vllm_config, model_config=None, **_):
        model, report = load_model(vllm_config, model_config)
        reports.append(report)
        # the parallel config the draft was built under (patch 0006: the draft's own)
        model._built_under_tp = vllm_config.parallel_config.tensor_parallel_size
        return model

    # the speculator passes its draft_runs_unsharded decision (patch 0006)
    kwargs = {"unsharded": True} if _runs_unsharded(cfg) else {}
    real = eagle_utils.get_model
    eagle_utils.get_model = cpu_get_model
    try:
        with set_current_vllm_config(cfg):
            model = eagle_utils.load_eagle_model(target, cfg, **kwargs)
    finally:
        eagle_utils.get_model = real
    return model, reports[0].unwritten


def _zero_attention(model) -> None:
    """Make the metadata-free attention deterministic: its output buffer is
    otherwise left uncomputed (see ``vllm_cpu``). Zeros keep every collective
    (the ``o_proj`` all-reduce still runs) and make the draft tokens a pure
    function of the embedding, MLP and LM head, so ranks and placements can be
    compared token for token."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    for module in model.modules():
        if isinstance(module, AttentionLayerBase):
            module.register_forward_hook(lambda _m, _i, out: torch.zeros_like(out))


def draft_collectives(rank: int, target_dir: str, cases: list[DraftCase]) -> dict:
    """Per case: the draft's collectives (phase ``draft``) for one forward +
    compute_logits over ``case.rows`` rows, the greedy draft tokens, and the
    draft's parameter shapes. The target is loaded once (it provides the
    embedding / LM head a draft may share)."""
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
    target_cfg = make_vllm_config(target_dir, tensor_parallel_size=tp)
    target, _ = load_model(target_cfg)
    out: dict[str, Any] = {}
    ensure_unsharded_tp_group()
    for case in cases:
        options = dict(case.options)
        replicate = options.pop(REPLICATED_EMBEDDING_OPTION, False)
        spec_cfg = {"method": case.method, "model": case.path,
                    "num_speculative_tokens": case.num_speculative_tokens, **options}
        cfg = make_vllm_config(target_dir, tensor_parallel_size=tp, speculative_config=spec_cfg)
        model, unwritten = _load_draft(case, cfg, target)
        if replicate:
            from vllm_kimi_ext.integration import draft_embedding

            assert draft_embedding.replicate(model, tp)
        _zero_attention(model)
        hf = cfg.speculative_config.draft_model_config.hf_config
        ids = (torch.arange(case.rows) * 7 + 3) % hf.vocab_size
        positions = torch.arange(case.rows) + 5
        with torch.no_grad(), draft_tp_context(cfg):
            kwargs = {}
            if case.method == "eagle3":
                kwargs["hidden_states"] = model.combine_hidden_states(
                    _aux_input(model, case.rows))
            with CollectiveCounter() as cc, cc.phase("draft"):
                hidden = run_forward(model, cfg, ids, positions, **kwargs)
                if isinstance(hidden, tuple):
                    hidden = hidden[0]
                logits = compute_logits(model, cfg, hidden)
        out[case.name] = {
            "summary": cc.summary(),
            "tokens": logits.float().argmax(-1).tolist(),
            "logits_row0": logits[0, :8].float().tolist(),
            "shapes": {n: tuple(p.shape) for n, p in model.named_parameters()},
            "unwritten": unwritten,
            "num_layers": hf.num_hidden_layers,
            "hidden": hf.hidden_size,
            "draft_vocab": getattr(hf, "draft_vocab_size", None) or hf.vocab_size,
            "embed_weight_sum": float(
                model.model.embed_tokens.weight.float()[: hf.vocab_size].sum()),
            "runs_unsharded": _runs_unsharded(cfg),
            "built_under_tp": getattr(model, "_built_under_tp", None),
        }
    return out


def draft_agreement_check(rank: int) -> dict:
    """The opt-in agreement check on identical and on diverging draft tokens."""
    from vllm_kimi_ext.integration.draft_agreement import DraftDisagreement, check_draft_agreement

    same = torch.tensor([[5, 6, 7], [8, 9, 10]])
    check_draft_agreement(same)
    diverging = same.clone()
    if rank == 1:
        diverging[1, 2] = 11
    try:
        check_draft_agreement(diverging)
    except DraftDisagreement as exc:
        return {"raised": True, "message": str(exc)}
    return {"raised": False, "message": ""}


def unsharded_tp_group_check(rank: int) -> dict:
    """Patch 0006's size-1 tensor-parallel group as this rank sees it: sizes
    in and out of ``unsharded_tensor_parallel()``, an all-reduce inside (stays
    on the rank) and outside (sums over the ranks), the restore after an
    exception, and ``destroy_model_parallel`` clearing the group. Destroys the
    model-parallel groups, so it runs last."""
    from vllm.distributed import (
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
        tensor_model_parallel_all_reduce,
    )
    from vllm.distributed import parallel_state as ps

    def state() -> dict:
        return {"world": get_tensor_model_parallel_world_size(),
                "rank": get_tensor_model_parallel_rank(),
                "unsharded": ps.in_unsharded_tensor_parallel()}

    def all_reduce() -> float:
        return float(tensor_model_parallel_all_reduce(torch.tensor([float(rank + 1)]))[0])

    out = {"before": state(), "sum_outside": all_reduce()}
    group = ps.get_unsharded_tp_group()
    out["group_ranks"] = list(group.ranks)
    out["same_group_again"] = ps.get_unsharded_tp_group() is group
    with ps.unsharded_tensor_parallel():
        out["inside"] = state()
        out["sum_inside"] = all_reduce()
    out["after"] = state()
    try:
        with ps.unsharded_tensor_parallel():
            raise RuntimeError("planted")
    except RuntimeError:
        pass
    out["after_exception"] = state()
    ps.destroy_model_parallel()
    out["cleared_by_destroy"] = ps._UNSHARDED_TP is None
    return out


def unsharded_draft_scenarios(rank: int, target_dir: str, cases: list[DraftCase]) -> dict:
    """:func:`draft_collectives` plus the draft-agreement check and (when the
    running vLLM has patch 0006) the size-1 group check, one rank set."""
    out = draft_collectives(rank, target_dir, cases)
    out["_agreement"] = draft_agreement_check(rank)
    if has_unsharded_tp_group_patch():
        out["_tp_group"] = unsharded_tp_group_check(rank)
    return out


def full_shapes(checkpoint: dict[str, tuple[int, ...]], style: str) -> dict[str, tuple]:
    """vLLM parameter name → full (un-sharded) shape, from an EAGLE-3 head's
    checkpoint shapes (fused projections summed as vLLM stacks them)."""
    c = {k.replace("midlayer.", "model.layers.0."): v for k, v in checkpoint.items()}
    lay = "model.layers.0"
    out = {
        f"{lay}.self_attn.o_proj.weight": c[f"{lay}.self_attn.o_proj.weight"],
        f"{lay}.mlp.down_proj.weight": c[f"{lay}.mlp.down_proj.weight"],
        f"{lay}.mlp.gate_up_proj.weight": (
            c[f"{lay}.mlp.gate_proj.weight"][0] + c[f"{lay}.mlp.up_proj.weight"][0],
            c[f"{lay}.mlp.gate_proj.weight"][1]),
        "lm_head.weight": c["lm_head.weight"],
        "model.fc.weight": c["fc.weight"],
    }
    if "embed_tokens.weight" in c:
        out["model.embed_tokens.weight"] = c["embed_tokens.weight"]
    if style == "llama":
        q, k, v = (c[f"{lay}.self_attn.{x}_proj.weight"] for x in "qkv")
        out[f"{lay}.self_attn.qkv_proj.weight"] = (q[0] + k[0] + v[0], q[1])
    else:
        for name in ("q_b_proj", "kv_b_proj"):
            out[f"{lay}.self_attn.{name}.weight"] = c[f"{lay}.self_attn.{name}.weight"]
    return out
