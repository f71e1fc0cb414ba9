"""The one backend switch of the verify step: Triton or torch.

Every round (:mod:`.stats`, :mod:`.merge`, :mod:`.escalate`, :mod:`.decide`,
:mod:`.residual`) has a torch body and a Triton launcher side by side; the step asks
:func:`use_triton` once per call and hands the answer to every round
(:meth:`.graph_step.GraphVerifyStep.run`). The Triton kernels sit behind one
availability guard, :func:`require_triton`, run when :mod:`._kernels` is imported.
"""

from __future__ import annotations

import functools

import torch

BACKENDS = ("auto", "torch", "triton")


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    try:
        import triton
        import triton.language
    except ImportError:
        return False
    return hasattr(triton, "jit")


def require_triton() -> None:
    """The Triton kernels' availability guard: raises a one-line ``ImportError`` when
    Triton does not import."""
    if not triton_available():
        raise ImportError("vllm_kimi_ext.verify: the Triton kernels need an importable "
                          "triton package; use backend='torch' without it")


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def use_triton(backend: str, t: torch.Tensor) -> bool:
    """The one backend rule: ``"triton"`` always (the CPU interpreter runs it off the GPU),
    ``"torch"`` never, ``"auto"`` for CUDA tensors when Triton imports."""
    check_backend(backend)
    return backend == "triton" or (backend == "auto" and t.is_cuda and triton_available())
