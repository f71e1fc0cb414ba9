"""The shipped patch series applies to the real vLLM 0.34.0 baseline (dry run in a
scratch worktree; the tree is not touched), and the vLLM tree this environment
imports carries exactly that series, as the plugin's pin check sees it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_kimi_ext import compat, patchset

pytestmark = pytest.mark.canary

REPO = Path(__file__).resolve().parents[2]
PATCH_DIR = REPO / "patches" / f"vllm-{patchset.VLLM_VERSION}"


@pytest.fixture(scope="module")
def tree() -> Path:
    """The git tree of the vLLM this environment imports (an editable install
    made by `nox -s apply-patches`, or a checkout first on PYTHONPATH)."""
    found = compat.vllm_tree()
    if found is None or not (found / ".git").exists():
        pytest.skip("the imported vLLM is not a git tree (nox -s apply-patches)")
    return found


def test_series_dry_runs_cleanly_against_baseline(tree):
    names = patchset.check_series(tree, PATCH_DIR)
    assert names == [e.name for e in patchset.read_series(PATCH_DIR)]


def test_imported_tree_carries_the_current_series(tree):
    assert patchset.tree_is_applied(tree, patchset.read_series(PATCH_DIR)), \
        f"{tree} is stale: run `nox -s apply-patches`"
    shipped = json.loads((REPO / "vllm_kimi_ext" / patchset.SHIPPED_SERIES).read_text())
    for entry in shipped["series"]:
        entry.pop("slug")  # the package's names for the patches; the tree records none
    assert patchset.read_record(tree) == shipped
    assert compat.check_compat(tree=tree) == []
