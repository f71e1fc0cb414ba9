"""Shared fixtures and tier handling.

Tiers are directories (unit / vllm / distributed / gpu / canary); markers are
registered in pyproject.toml and enforced with --strict-markers. Tests marked
``vllm`` skip when vLLM is not importable, ``gpu`` ones when CUDA is absent, so
the CPU tier is green on any machine.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

_HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


def pytest_collection_modifyitems(config, items):
    ndev = None
    for item in items:
        if "vllm" in item.keywords and not _HAS_VLLM:
            item.add_marker(pytest.mark.skip(reason="vLLM not installed (nox -s apply-patches)"))
        if "gpu" in item.keywords or "multi_gpu" in item.keywords:
            ndev = _cuda_devices() if ndev is None else ndev
            need = 2 if "multi_gpu" in item.keywords else 1
            if ndev < need:
                reason = f"needs {need} CUDA device(s), found {ndev}"
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def tiny_kimi_dir(tmp_path_factory):
    """A tiny Kimi-K2.5 checkpoint (default spec) shared by the session."""
    from testkit.checkpoints import write_tiny_kimi_k25

    path = tmp_path_factory.mktemp("tiny-kimi-k25")
    write_tiny_kimi_k25(path)
    return path
