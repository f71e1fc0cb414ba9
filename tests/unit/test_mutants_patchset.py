"""Tests written for mutants of patchset.py that `nox -s mutants` found surviving."""

from __future__ import annotations

from tests.unit.test_patchset import _git, _make_patches, fake_vllm  # noqa: F401 (fixture)
from vllm_kimi_ext import patchset


def test_export_removes_the_patch_of_a_commit_dropped_from_the_fork_branch(
        fake_vllm, tmp_path):  # noqa: F811 (the imported fixture)
    pdir = tmp_path / "patches"
    _make_patches(fake_vllm, pdir, [("[A] first", "line_3 = 3", "line_3 = 33"),
                                    ("[B] second", "line_30 = 30", "line_30 = 300")])
    shipped = tmp_path / "series.json"
    patchset.apply_series(fake_vllm, pdir)
    patchset.export_series(fake_vllm, pdir, shipped)
    assert len(list(pdir.glob("*.patch"))) == 2
    _git(fake_vllm, "reset", "-q", "--hard", "HEAD~1")  # drop [B] from the fork branch
    patchset.export_series(fake_vllm, pdir, shipped)
    (left,) = pdir.glob("*.patch")
    assert left.name.startswith("0001-") and "[A] first" in left.read_text()
    assert [e.name for e in patchset.read_series(pdir)] == [left.name]
