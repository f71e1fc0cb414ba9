"""The shipped patch series applies to the real vLLM 0.34.0 baseline (dry run in a
scratch worktree; the tree is not touched), and the vLLM tree this environment
imports carries exactly that series, as the plugin's pin check sees it."""

from __future__ import annotations

import json
import re
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
    assert patchset.tree_is_applied(tree, patchset.read_series(PATCH_DIR)), (
        f"{tree} is stale: run `nox -s apply-patches`")
    shipped = json.loads((REPO / "vllm_kimi_ext" / patchset.SHIPPED_SERIES).read_text())
    for entry in shipped["series"]:
        entry.pop("slug")  # the package's names for the patches; the tree records none
    assert patchset.read_record(tree) == shipped
    assert compat.check_compat(tree=tree) == []


def _declared_dependencies(note: Path) -> str | None:
    m = re.search(r"^depends_on: (.+)$", note.read_text(), re.M)
    return m.group(1).strip() if m else None


def test_patches_declared_independent_apply_alone(tree, tmp_path):
    """A patch whose note says ``depends_on: none`` (its PR body: "applies on its own to
    v0.34.0") applies with ``git apply --check`` to a clean baseline without any other
    patch of the series; one that does not is named with git's reason."""
    worktree = tmp_path / "baseline"
    patchset.git(tree, "worktree", "add", "-q", "--detach", str(worktree),
                 patchset.BASELINE_TAG)
    try:
        independent, failures = [], []
        for entry in patchset.read_series(PATCH_DIR):
            note = REPO / "upstream-notes" / (entry.name.removesuffix(".patch") + ".md")
            if _declared_dependencies(note) != "none":
                continue
            independent.append(entry.name)
            proc = patchset.git(worktree, "apply", "--check", str(PATCH_DIR / entry.name),
                                check=False)
            if proc.returncode:
                failures.append(f"{entry.name}: {proc.stderr.strip().splitlines()[0]}")
        assert independent, "no patch declares depends_on: none"
        assert failures == []
    finally:
        patchset.git(tree, "worktree", "remove", "--force", str(worktree), check=False)
        patchset.git(tree, "worktree", "prune", check=False)
