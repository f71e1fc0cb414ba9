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


#: The files whose tests use the session's gloo TP=2 rank set (``tp2_rank_set`` in
#: ``tests/distributed/conftest.py``). Under pytest-xdist ``--dist loadfile`` (``nox -s
#: test``) they form one work unit, so one worker starts the rank set once, instead of each
#: worker that runs one of them starting its own. Checked at collection in every process
#: (:func:`_check_tp2_rank_set_files`): a file that uses the rank set and is missing here,
#: or is listed and does not use it, stops the run.
TP2_RANK_SET_FILES = frozenset(f"tests/distributed/{name}.py" for name in (
    "test_draft_collectives", "test_patch_0002_logits_local",
    "test_patch_0006_eagle_draft_tp1", "test_patch_0006_unsharded_tp_group",
    "test_patch_0007_draft_model_unsharded", "test_runtime_replicated_draft_embedding",
    "test_sharded_verify_vllm", "test_target_collectives", "test_tli_collectives"))
TP2_GROUP = "tp2_rank_set"


def _check_tp2_rank_set_files(config, items) -> None:
    by_file: dict[str, bool] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        by_file[path] = by_file.get(path, False) or TP2_GROUP in getattr(item, "fixturenames", ())
    missing = sorted(f for f, uses in by_file.items() if uses and f not in TP2_RANK_SET_FILES)
    stale = sorted(f for f, uses in by_file.items() if not uses and f in TP2_RANK_SET_FILES)
    if missing or stale:
        raise pytest.UsageError(
            "tests/conftest.py TP2_RANK_SET_FILES is out of date: "
            + "; ".join(filter(None, [missing and f"uses tp2_rank_set, not listed: {missing}",
                                      stale and f"listed, does not use it: {stale}"])))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with :data:`TP2_RANK_SET_FILES` as one work unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class _FileOrGroupScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return TP2_GROUP if path in TP2_RANK_SET_FILES else path

    return _FileOrGroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    _check_tp2_rank_set_files(config, items)
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
