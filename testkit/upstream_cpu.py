"""pytest plugin for `nox -s upstream-check` and `nox -s upstream-tests`: let vLLM's tests
build a ``VllmConfig`` on a GPU-less x86 machine without triton-cpu.

vLLM's CPU platform refuses to configure on x86 without triton-cpu ("vLLM on x86 CPUs
requires Triton (triton-cpu)."), so ``VllmConfig(...)`` raises here although nothing the
series' tests run is a Triton kernel; on vLLM's CI (CUDA, or CPU with triton-cpu) the same
tests need no help. This plugin wraps ``CpuPlatform.check_and_update_config`` so that only
that one check sees Triton as present, the way
:func:`testkit.vllm_cpu.cpu_config_without_triton_cpu` does for the plugin's own tests. It
is loaded for the patched and the stock run alike, so it cannot make a test pass on one
and fail on the other.
"""

from __future__ import annotations


def _bridge() -> None:
    import vllm.triton_utils as triton_utils
    from vllm.platforms.cpu import CpuPlatform

    check = CpuPlatform.__dict__["check_and_update_config"].__func__
    if getattr(check, "_upstream_cpu_bridge", False):
        return

    def check_and_update_config(cls, vllm_config) -> None:
        saved = triton_utils.HAS_TRITON
        triton_utils.HAS_TRITON = True
        try:
            check(cls, vllm_config)
        finally:
            triton_utils.HAS_TRITON = saved

    check_and_update_config._upstream_cpu_bridge = True  # type: ignore[attr-defined]
    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[method-assign,assignment]


def pytest_configure(config) -> None:
    _bridge()
