"""The shipped patch series applies to the real vLLM 0.34.0 baseline (dry run in a
scratch worktree; the prepared tree is not touched)."""

from __future__ import annotations

import pytest

from vllm_kimi_ext import patchset

pytestmark = pytest.mark.canary


def _prepared_tree():
    pointer = patchset.REPO_ROOT / "build" / "vllm-src"
    tree = patchset.REPO_ROOT / "build" / f"vllm-{patchset.VLLM_VERSION}"
    if pointer.exists():
        from pathlib import Path

        tree = Path(pointer.read_text().strip())
    return tree


def test_series_dry_runs_cleanly_against_baseline():
    tree = _prepared_tree()
    if not (tree / ".git").exists():
        pytest.skip("no prepared vLLM tree (nox -s apply-patches)")
    names = patchset.check_series(tree)
    assert names == [e.name for e in patchset.read_series()]


def test_prepared_tree_carries_the_current_series():
    tree = _prepared_tree()
    if not (tree / ".git").exists():
        pytest.skip("no prepared vLLM tree (nox -s apply-patches)")
    assert patchset.tree_is_applied(tree, patchset.read_series()), \
        "the prepared tree is stale: run `nox -s apply-patches`"
