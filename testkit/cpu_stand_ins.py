"""Test-only, plain-torch stand-ins for compiled vLLM CPU ops.

A GPU-less, Python-only vLLM build (``VLLM_TARGET_DEVICE=empty``) has no
``vllm._C`` extension, yet vLLM's CPU MoE path calls two of its ops:

* ``_C::prepack_moe_weight(weight, output, isa)`` — re-lays expert weights for
  the AMX/vec kernel. The stand-in keeps the layout (a plain copy).
* ``_C::cpu_fused_moe(out, input, w13, w2, w13_bias, w2_bias, topk_weights,
  topk_ids, skip_weighted, act, isa)`` — routed-expert MLP. The stand-in is a
  per-expert loop: ``out = Σ_k w_k · down_e(act(gate_e(x)) · up_e(x))``.

They are registered into the ``_C`` op namespace only when the real op is
absent, are used by this project's tests only, and are themselves checked
against a dense reference (``tests/vllm/test_cpu_stand_ins.py``).
They are slow by design: clarity over speed, tiny models only.
"""

from __future__ import annotations

import torch

_LIB: torch.library.Library | None = None
#: calls per stand-in in this process (the engine tests read them back from workers)
CALLS: dict[str, int] = {"prepack_moe_weight": 0, "cpu_fused_moe": 0}
_ACTIVATIONS = {
    "silu": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu,
}


def stand_in_prepack_moe_weight(weight: torch.Tensor, output: torch.Tensor, isa: str) -> None:
    CALLS["prepack_moe_weight"] += 1
    output.copy_(weight)


def stand_in_cpu_fused_moe(
    out: torch.Tensor,
    input: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_bias: torch.Tensor | None,
    w2_bias: torch.Tensor | None,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    skip_weighted: bool,
    act: str,
    isa: str,
) -> None:
    """Reference semantics of vLLM's fused CPU MoE (gate/up stacked in w13)."""
    CALLS["cpu_fused_moe"] += 1
    act_name = act.lower().removesuffix("_and_mul")
    if act_name not in _ACTIVATIONS:
        raise NotImplementedError(f"stand-in cpu_fused_moe: activation {act!r}")
    fn = _ACTIVATIONS[act_name]
    x = input.float()
    inter = w13.shape[1] // 2
    acc = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32)
    for e in topk_ids.unique().tolist():
        rows, slots = (topk_ids == e).nonzero(as_tuple=True)
        h = x[rows] @ w13[e].float().t()
        if w13_bias is not None:
            h = h + w13_bias[e].float()
        y = (fn(h[:, :inter]) * h[:, inter:]) @ w2[e].float().t()
        if w2_bias is not None:
            y = y + w2_bias[e].float()
        if not skip_weighted:
            y = y * topk_weights[rows, slots].float().unsqueeze(1)
        acc.index_add_(0, rows, y)
    out.copy_(acc.to(out.dtype))


def has_c_op(name: str) -> bool:
    """Whether ``torch.ops._C`` has ``name`` (compiled, or a stand-in already registered)."""
    try:
        getattr(torch.ops._C, name)
        return True
    except (AttributeError, RuntimeError):
        return False


def install() -> list[str]:
    """Register missing stand-ins; returns the names registered (idempotent)."""
    global _LIB
    registered: list[str] = []
    missing_prepack = not has_c_op("prepack_moe_weight")
    missing_moe = not has_c_op("cpu_fused_moe")
    if not (missing_prepack or missing_moe):
        return registered
    if _LIB is None:
        _LIB = torch.library.Library("_C", "FRAGMENT")
    if missing_prepack:
        _LIB.define("prepack_moe_weight(Tensor weight, Tensor(a!) output, str isa) -> ()")
        _LIB.impl("prepack_moe_weight", stand_in_prepack_moe_weight, "CPU")
        registered.append("prepack_moe_weight")
    if missing_moe:
        _LIB.define(
            "cpu_fused_moe(Tensor(a!) out, Tensor input, Tensor w13, Tensor w2, "
            "Tensor? w13_bias, Tensor? w2_bias, Tensor topk_weights, Tensor topk_ids, "
            "bool skip_weighted, str act, str isa) -> ()"
        )
        _LIB.impl("cpu_fused_moe", stand_in_cpu_fused_moe, "CPU")
        registered.append("cpu_fused_moe")
    return registered
