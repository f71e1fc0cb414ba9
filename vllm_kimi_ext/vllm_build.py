"""Installing the prepared vLLM tree editable (stdlib only, used by ``nox -s
apply-patches``): the build-time requirements and the build environment for a
GPU-less (Python-only) or CUDA (precompiled kernels) machine."""

from __future__ import annotations

from pathlib import Path

from vllm_kimi_ext.patchset import VLLM_VERSION, PatchSetError

#: Build-time requirements for a --no-build-isolation install of vLLM's setup.py.
BUILD_REQUIREMENTS = (
    "setuptools>=77,<81",
    "setuptools-scm>=8",
    "setuptools-rust>=1.9",
    "wheel",
    "packaging",
    "jinja2",
)


def build_env(*, cuda_available: bool, precompiled_wheel: str | None = None,
              base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for ``pip install -e <tree>``.

    * No CUDA: a Python-only build (``VLLM_TARGET_DEVICE=empty``): no compiled
      extensions, no CUDA wheels; vLLM's CPU platform is then selected at run
      time with ``VLLM_TARGET_DEVICE=cpu``.
    * CUDA: vLLM's own precompiled path — its setup.py takes the kernels from a
      vLLM 0.34.0 binary wheel (``VLLM_PRECOMPILED_WHEEL_LOCATION``, a local
      file or URL) instead of compiling them.
    The version is pinned through setuptools-scm (the tree's git history has
    only our baseline) and the local-version suffix is suppressed, so pip sees
    plain ``0.34.0``.
    """
    env = dict(base or {})
    env["SETUPTOOLS_SCM_PRETEND_VERSION"] = VLLM_VERSION
    env["VLLM_SKIP_VERSION_SUFFIX"] = "1"
    env["VLLM_SKIP_PRECOMPILED_VERSION_SUFFIX"] = "1"
    if cuda_available:
        if not precompiled_wheel:
            raise PatchSetError(
                "a CUDA build needs the vLLM 0.34.0 binary wheel for its kernels: pass "
                "--precompiled-wheel PATH (e.g. from `pip download --no-deps vllm==0.34.0`)")
        name = Path(precompiled_wheel).name
        if not name.startswith(f"vllm-{VLLM_VERSION}-"):
            raise PatchSetError(
                f"--precompiled-wheel {name}: expected a vllm-{VLLM_VERSION}-*.whl")
        env["VLLM_TARGET_DEVICE"] = "cuda"
        env["VLLM_USE_PRECOMPILED"] = "1"
        env["VLLM_PRECOMPILED_WHEEL_LOCATION"] = str(precompiled_wheel)
    else:
        env["VLLM_TARGET_DEVICE"] = "empty"
        env.pop("VLLM_USE_PRECOMPILED", None)
        env.pop("VLLM_PRECOMPILED_WHEEL_LOCATION", None)
    return env
