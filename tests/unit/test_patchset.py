"""The fork tooling behind `nox -s apply-patches`, on a small synthetic vLLM repo.

The real tree is exercised by tests/canary/test_series_applies.py; here every
failure mode is provoked on a repo small enough to build in milliseconds.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from vllm_kimi_ext import compat, envs, patchset, vllm_build
from vllm_kimi_ext.patchset import PatchSetError

REPO = Path(__file__).resolve().parents[2]
PATCH_DIR = REPO / "patches" / f"vllm-{patchset.VLLM_VERSION}"
SHIPPED = REPO / "vllm_kimi_ext" / patchset.SHIPPED_SERIES


def _git(repo: Path, *args: str) -> str:
    return patchset.git(repo, *args).stdout.strip()


@pytest.fixture()
def fake_vllm(tmp_path: Path) -> Path:
    """A git repo laid out like a real vLLM checkout, tagged v0.34.0: it has
    vLLM's kind of .gitignore and has been through ``check_user_tree`` (as
    ``--vllm-src`` does), so the series record is *ignored* by git, as in a
    real tree — ``git clean`` does not remove it, only the tooling can."""
    repo = tmp_path / "vllm-src"
    (repo / "vllm").mkdir(parents=True)
    (repo / "vllm" / "__init__.py").write_text("__version__ = '0.34.0'\n")
    (repo / "vllm" / "config.py").write_text(
        "".join(f"line_{i} = {i}\n" for i in range(40)))
    (repo / ".gitignore").write_text("/vllm/_version.py\n__pycache__/\n*.so\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "baseline")
    _git(repo, "tag", patchset.BASELINE_TAG)
    patchset.check_user_tree(repo)
    assert _git(repo, "check-ignore", patchset.RECORD_RELPATH) == patchset.RECORD_RELPATH
    return repo


def _make_patches(repo: Path, patch_dir: Path, edits: list[tuple[str, str, str]]) -> None:
    """Commit each (subject, old line, new line) edit on a branch, format-patch them."""
    _git(repo, "checkout", "-q", "-b", "work", patchset.BASELINE_TAG)
    cfg = repo / "vllm" / "config.py"
    for subject, old, new in edits:
        cfg.write_text(cfg.read_text().replace(old, new))
        _git(repo, "commit", "-q", "-am", subject)
    patch_dir.mkdir(parents=True, exist_ok=True)
    _git(repo, "format-patch", "-q", "--zero-commit", "-o", str(patch_dir),
         f"{patchset.BASELINE_TAG}..work")
    names = sorted(p.name for p in patch_dir.glob("*.patch"))
    (patch_dir / "series").write_text("# test series\n" + "\n".join(names) + "\n")
    _git(repo, "checkout", "-q", "main")
    _git(repo, "branch", "-q", "-D", "work")


def _at_baseline(repo: Path) -> bool:
    return (_git(repo, "rev-parse", "HEAD") == _git(repo, "rev-parse", patchset.BASELINE_TAG)
            and not _git(repo, "status", "--porcelain", "--untracked-files=no")
            and not (repo / patchset.RECORD_RELPATH).exists())


def test_apply_is_idempotent_and_records_the_series(fake_vllm, tmp_path):
    pdir = tmp_path / "patches"
    _make_patches(fake_vllm, pdir, [("[A] first", "line_3 = 3", "line_3 = 33"),
                                    ("[B] second", "line_30 = 30", "line_30 = 300")])
    first = patchset.apply_series(fake_vllm, pdir)
    assert first.changed and len(first.applied) == 2
    assert "line_3 = 33" in (fake_vllm / "vllm/config.py").read_text()
    # authorship and messages survive git am
    assert _git(fake_vllm, "log", "--format=%s", "-2").splitlines() == ["[B] second", "[A] first"]
    record = json.loads((fake_vllm / patchset.RECORD_RELPATH).read_text())
    assert record == patchset.series_record(
        patchset.read_series(pdir), patchset.fingerprint_files(fake_vllm, ["vllm/config.py"]))
    head = _git(fake_vllm, "rev-parse", "HEAD")
    again = patchset.apply_series(fake_vllm, pdir)
    assert not again.changed and _git(fake_vllm, "rev-parse", "HEAD") == head


def test_broken_patch_is_named_and_tree_returns_to_baseline(fake_vllm, tmp_path):
    pdir = tmp_path / "patches"
    _make_patches(fake_vllm, pdir, [("[A] good", "line_3 = 3", "line_3 = 33"),
                                    ("[B] will break", "line_20 = 20", "line_20 = 2000")])
    broken = sorted(pdir.glob("0002-*.patch"))[0]
    # make the second patch's context no longer match the baseline
    broken.write_text(broken.read_text().replace(" line_19 = 19", " line_19 = nineteen"))
    with pytest.raises(PatchSetError) as err:
        patchset.apply_series(fake_vllm, pdir)
    msg = str(err.value)
    assert "patch 2/2" in msg and broken.name in msg
    assert "vllm/config.py" in msg  # the failing file (and hunk line) is named
    assert _at_baseline(fake_vllm)
    # the dry run reports the same failure and never touches the tree
    with pytest.raises(PatchSetError, match=broken.name):
        patchset.check_series(fake_vllm, pdir)
    assert _at_baseline(fake_vllm)


def test_failed_reapply_after_success_also_restores_baseline(fake_vllm, tmp_path):
    pdir = tmp_path / "patches"
    _make_patches(fake_vllm, pdir, [("[A] good", "line_3 = 3", "line_3 = 33")])
    patchset.apply_series(fake_vllm, pdir)
    extra = pdir / "0002-bad.patch"
    extra.write_text("this is not a patch\n")
    (pdir / "series").write_text((pdir / "series").read_text() + "0002-bad.patch\n")
    with pytest.raises(PatchSetError, match="0002-bad.patch"):
        patchset.apply_series(fake_vllm, pdir)
    assert _at_baseline(fake_vllm)


def test_check_passes_without_touching_the_tree(fake_vllm, tmp_path):
    pdir = tmp_path / "patches"
    _make_patches(fake_vllm, pdir, [("[A] good", "line_3 = 3", "line_3 = 33")])
    head = _git(fake_vllm, "rev-parse", "HEAD")
    assert patchset.check_series(fake_vllm, pdir) == [p.name for p in pdir.glob("0001-*")]
    assert _git(fake_vllm, "rev-parse", "HEAD") == head
    assert len(_git(fake_vllm, "worktree", "list").splitlines()) == 1  # scratch removed


def test_export_round_trips_byte_stable_and_follows_edits(fake_vllm, tmp_path):
    pdir = tmp_path / "patches"
    _make_patches(fake_vllm, pdir, [("[A] first", "line_3 = 3", "line_3 = 33")])
    shipped = tmp_path / "series.json"
    patchset.apply_series(fake_vllm, pdir)
    patchset.export_series(fake_vllm, pdir, shipped)  # normalise to the exporter's format
    before = {p.name: p.read_bytes() for p in pdir.iterdir()}
    patchset.export_series(fake_vllm, pdir, shipped)
    assert {p.name: p.read_bytes() for p in pdir.iterdir()} == before  # byte-stable
    # the package's record is the tree's record, plus each patch's slug
    package = json.loads(shipped.read_text())
    assert [e.pop("slug") for e in package["series"]] == ["a-first"]
    assert package == patchset.read_record(fake_vllm)
    assert not patchset.apply_series(fake_vllm, pdir).changed  # tree still matches
    # edit the fork branch: amend the commit, export, re-apply from scratch
    cfg = fake_vllm / "vllm" / "config.py"
    cfg.write_text(cfg.read_text().replace("line_3 = 33", "line_3 = 333"))
    _git(fake_vllm, "commit", "-q", "-a", "--amend", "--no-edit")
    patchset.export_series(fake_vllm, pdir, shipped)
    (patch,) = pdir.glob("0001-*.patch")
    assert "+line_3 = 333" in patch.read_text()
    _git(fake_vllm, "checkout", "-q", "-f", patchset.BASELINE_TAG)
    patchset.apply_series(fake_vllm, pdir)
    assert "line_3 = 333" in cfg.read_text()


def test_user_checkout_of_another_version_is_refused(tmp_path):
    repo = tmp_path / "other"
    (repo / "vllm").mkdir(parents=True)
    (repo / "vllm" / "__init__.py").write_text("")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "x")
    _git(repo, "tag", "v0.33.1")
    with pytest.raises(PatchSetError, match=r"vLLM 0\.34\.0 required .*found v0\.33\.1"):
        patchset.check_user_tree(repo)
    with pytest.raises(PatchSetError, match="not a git checkout"):
        patchset.check_user_tree(tmp_path)


def test_user_checkout_with_local_changes_is_refused(fake_vllm):
    (fake_vllm / "vllm" / "config.py").write_text("dirty\n")
    with pytest.raises(PatchSetError, match="uncommitted changes"):
        patchset.check_user_tree(fake_vllm)


def test_series_errors_are_specific(tmp_path):
    with pytest.raises(PatchSetError, match="no series file"):
        patchset.read_series(tmp_path)
    (tmp_path / "series").write_text("0001-missing.patch\n")
    with pytest.raises(PatchSetError, match=r"series:1: listed patch '0001-missing.patch'"):
        patchset.read_series(tmp_path)


def test_build_env_selection():
    cpu = vllm_build.build_env(cuda_available=False, base={"VLLM_USE_PRECOMPILED": "1"})
    assert cpu["VLLM_TARGET_DEVICE"] == "empty"
    assert "VLLM_USE_PRECOMPILED" not in cpu
    assert cpu["SETUPTOOLS_SCM_PRETEND_VERSION"] == "0.34.0"
    assert cpu["VLLM_SKIP_VERSION_SUFFIX"] == "1"
    gpu = vllm_build.build_env(cuda_available=True,
                             precompiled_wheel="/w/vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl")
    assert gpu["VLLM_TARGET_DEVICE"] == "cuda"
    assert gpu["VLLM_USE_PRECOMPILED"] == "1"
    assert gpu["VLLM_PRECOMPILED_WHEEL_LOCATION"].endswith("x86_64.whl")
    with pytest.raises(PatchSetError, match="needs the vLLM 0.34.0 binary wheel"):
        vllm_build.build_env(cuda_available=True)
    with pytest.raises(PatchSetError, match="expected a vllm-0.34.0"):
        vllm_build.build_env(cuda_available=True, precompiled_wheel="vllm-0.33.0-cp38.whl")


def test_sdist_tree_is_created_atomically(tmp_path):
    """A bad archive leaves no half-made tree behind."""
    bad = tmp_path / "vllm-0.34.0.tar.gz"
    bad.write_bytes(b"not a tarball")
    import tarfile

    with pytest.raises(tarfile.ReadError):
        patchset.create_tree_from_sdist(bad, tmp_path / "tree")
    assert not (tmp_path / "tree").exists()
    assert not list(tmp_path.glob(".vllm-src-*"))


def test_shipped_series_is_well_formed():
    entries = patchset.read_series(PATCH_DIR)
    assert entries, "the series must hold at least one patch"
    for e in entries:
        text = (PATCH_DIR / e.name).read_text()
        assert text.startswith("From 0000000000000000000000000000000000000000"), (
            f"{e.name} is not a `git format-patch --zero-commit` file")
        assert "Signed-off-by:" in text, f"{e.name} lacks a DCO sign-off"



def test_sdist_baseline_tracks_files_vllm_gitignores(tmp_path):
    """Files the sdist ships but vLLM's .gitignore excludes (e.g. vllm/_version.py)
    are part of the baseline, so worktrees and --check trees have them."""
    import io
    import tarfile

    top = f"vllm-{patchset.VLLM_VERSION}"
    files = {f"{top}/.gitignore": b"vllm/_version.py\n",
             f"{top}/vllm/__init__.py": b"",
             f"{top}/vllm/_version.py": b"__version__ = '0.34.0'\n",
             f"{top}/vllm.egg-info/PKG-INFO": b"Version: 0.34.0\n"}
    sdist = tmp_path / patchset.SDIST_NAME
    with tarfile.open(sdist, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    tree = tmp_path / "tree"
    patchset.create_tree_from_sdist(sdist, tree)
    tracked = _git(tree, "ls-files").splitlines()
    assert "vllm/_version.py" in tracked
    assert not any(t.startswith("vllm.egg-info") for t in tracked)
    assert _git(tree, "describe", "--tags") == patchset.BASELINE_TAG


def test_edits_to_patched_files_make_the_tree_stale_but_build_outputs_do_not(fake_vllm,
                                                                             tmp_path):
    pdir = tmp_path / "patches"
    _make_patches(fake_vllm, pdir, [("[A] first", "line_3 = 3", "line_3 = 33")])
    patchset.apply_series(fake_vllm, pdir)
    entries = patchset.read_series(pdir)
    (fake_vllm / "vllm" / "__init__.py").write_text("__version__ = '0.34.0+regenerated'\n")
    assert patchset.tree_is_applied(fake_vllm, entries)  # a build rewrote a generated file
    cfg = fake_vllm / "vllm" / "config.py"
    cfg.write_text(cfg.read_text() + "local_hack = 1\n")
    assert not patchset.tree_is_applied(fake_vllm, entries)
    assert patchset.apply_series(fake_vllm, pdir).changed  # re-applied from the baseline
    assert "local_hack" not in cfg.read_text()


# --------------------------------------------------------------------------- #
# The package's series record and interrupted runs                              #
# --------------------------------------------------------------------------- #


def test_package_series_record_matches_the_patches_folder():
    """vllm_kimi_ext/series.json (what the plugin's pin check reads) is the
    record of exactly the series in patches/: regenerate with --export."""
    shipped = json.loads(SHIPPED.read_text())
    entries = patchset.read_series(PATCH_DIR)
    assert [{"name": e["name"], "sha256": e["sha256"]} for e in shipped["series"]] == [
        {"name": e.name, "sha256": e.sha256} for e in entries], (
        "vllm_kimi_ext/series.json is stale: run `nox -s apply-patches -- --export`")
    assert shipped["digest"] == patchset.series_record(entries, {})["digest"]
    assert shipped["vllm_version"] == patchset.VLLM_VERSION
    touched = set()
    for e in entries:
        for a, b in re.findall(r"^diff --git a/(\S+) b/(\S+)$",
                               (PATCH_DIR / e.name).read_text(), re.M):
            touched |= {a, b}
    assert set(shipped["files"]) == touched
    assert all(re.fullmatch(r"[0-9a-f]{64}", sha) for sha in shipped["files"].values())
    assert compat.expected_record() == shipped  # the installed package data is this file


def test_export_keeps_slugs_by_subject_and_derives_new_ones(fake_vllm, tmp_path):
    """A slug set by hand survives re-export, renumbering (a patch inserted before it) and a
    reworded subject at the same number; a new patch gets one from its subject."""
    pdir, shipped = tmp_path / "patches", tmp_path / "series.json"
    _make_patches(fake_vllm, pdir, [("[A] first", "line_3 = 3", "line_3 = 33"),
                                    ("[B] second", "line_20 = 20", "line_20 = 2000")])
    patchset.apply_series(fake_vllm, pdir)
    patchset.export_series(fake_vllm, pdir, shipped)

    def slugs() -> list[tuple[str, str]]:
        return [(e["name"][:4], e["slug"]) for e in json.loads(shipped.read_text())["series"]]

    assert slugs() == [("0001", "a-first"), ("0002", "b-second")]
    record = json.loads(shipped.read_text())
    record["series"][1]["slug"] = "second-change"  # a maintainer names it
    shipped.write_text(json.dumps(record, indent=2) + "\n")
    patchset.export_series(fake_vllm, pdir, shipped)
    assert slugs() == [("0001", "a-first"), ("0002", "second-change")]
    # insert a patch before both (renumbers them) and reword the last one's subject
    _git(fake_vllm, "checkout", "-q", patchset.BASELINE_TAG)
    _git(fake_vllm, "branch", "-f", "old-fork", patchset.FORK_BRANCH)
    _git(fake_vllm, "checkout", "-q", "-B", patchset.FORK_BRANCH)
    cfg = fake_vllm / "vllm" / "config.py"
    cfg.write_text(cfg.read_text().replace("line_10 = 10", "line_10 = 100"))
    _git(fake_vllm, "commit", "-q", "-am", "[Z] zeroth")
    _git(fake_vllm, "cherry-pick", "old-fork~1", "old-fork")
    patchset.export_series(fake_vllm, pdir, shipped)
    assert slugs() == [("0001", "z-zeroth"), ("0002", "a-first"), ("0003", "second-change")]
    _git(fake_vllm, "commit", "-q", "--amend", "-m", "[B] second, reworded")
    patchset.export_series(fake_vllm, pdir, shipped)
    assert slugs() == [("0001", "z-zeroth"), ("0002", "a-first"), ("0003", "second-change")]
    assert (patchset.derive_slug("0012-Spec-Decode-Load-DeepSeek-typed-MTP-directories-for-.patch")
        == "spec-decode-load-deepseek-typed-mtp-directories-for")


def test_slugs_stay_unique():
    # a new patch whose derived slug is taken gets a suffix; carried slugs never change
    prev = [{"name": "0001-A.patch", "slug": "b"}]
    assert patchset.assign_slugs(["0001-A.patch", "0002-B.patch"], prev) == ["b", "b-2"]
    assert patchset.assign_slugs(["0001-A.patch"], [{"name": 3}, "junk"]) == ["a"]


def test_a_slug_naming_two_patches_is_refused():
    """A hand-edited record giving two patches one slug was silently renamed to
    ``same``/``same-2``, moving every ``{patch:same}`` reference meant for the second
    patch onto the first; export now refuses it."""
    prev = [{"name": "0001-A.patch", "slug": "same"}, {"name": "0002-B.patch", "slug": "same"}]
    with pytest.raises(PatchSetError, match=r"^vllm_kimi_ext/series.json: slug 'same' names "
                                            r"two patches, 0001-A.patch and 0002-B.patch; "):
        patchset.assign_slugs(["0001-A.patch", "0002-B.patch"], prev)


def _series_v1_v2(repo: Path, tmp_path: Path) -> tuple[Path, Path]:
    """Two series for the same tree: v1 (two patches), v2 (v1 + a third)."""
    v2 = tmp_path / "v2"
    _make_patches(repo, v2, [("[A] first", "line_3 = 3", "line_3 = 33"),
                             ("[B] second", "line_20 = 20", "line_20 = 2000"),
                             ("[C] third", "line_30 = 30", "line_30 = 300")])
    v1 = tmp_path / "v1"
    v1.mkdir()
    names = sorted(p.name for p in v2.glob("*.patch"))[:2]
    for name in names:
        (v1 / name).write_bytes((v2 / name).read_bytes())
    (v1 / "series").write_text("\n".join(names) + "\n")
    return v1, v2


def _expected(tree: Path, patch_dir: Path, tmp_path: Path) -> dict:
    """The package record of ``patch_dir`` (what --export would ship)."""
    patchset.apply_series(tree, patch_dir)
    out = tmp_path / f"{patch_dir.name}.json"
    patchset.export_series(tree, patch_dir, out)
    return json.loads(out.read_text())


def _kill_during(tmp_path: Path, tree: Path, patch_dir: Path, git_step: str) -> int:
    """Run apply_series in a child process whose ``git`` SIGKILLs the child
    when called with arguments containing ``git_step``; returns its exit code."""
    import os
    import shutil
    import subprocess
    import sys

    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "git").write_text(
        "#!/bin/sh\n"
        f'case "$*" in *"{git_step}"*) kill -9 $PPID; sleep 5;; esac\n'
        f'exec {shutil.which("git")} "$@"\n')
    (shim / "git").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(Path(patchset.__file__).resolve().parents[1])}
    code = ("import sys; from pathlib import Path; from vllm_kimi_ext import patchset; "
            "patchset.apply_series(Path(sys.argv[1]), Path(sys.argv[2]))")
    return subprocess.run([sys.executable, "-c", code, str(tree), str(patch_dir)], env=env,
                          capture_output=True, timeout=120).returncode


@pytest.mark.parametrize("git_step", ["0002-", "checkout -q -f -B"],
                         ids=["between-patches", "during-rollback-to-baseline"])
def test_interrupted_reapply_leaves_no_record_and_compat_refuses(fake_vllm, tmp_path,
                                                                 monkeypatch, git_step):
    """A re-apply killed (SIGKILL: no cleanup runs) between two `git am` steps,
    or while the tree is being reset to the baseline, leaves no series record:
    the plugin's pin check then refuses the tree for either package version."""
    monkeypatch.delenv(envs.ALLOW_MISMATCH.name, raising=False)
    v1, v2 = _series_v1_v2(fake_vllm, tmp_path)
    expected_v2 = _expected(fake_vllm, v2, tmp_path)
    expected_v1 = _expected(fake_vllm, v1, tmp_path)  # tree now holds v1, recorded
    assert compat.check_compat(version="0.34.0", tree=fake_vllm, expected=expected_v1) == []
    assert _kill_during(tmp_path, fake_vllm, v2, git_step) == -9
    if git_step == "0002-":  # killed mid-series: patch 1 of v2 is in, 2 and 3 are not
        assert "line_3 = 33" in (fake_vllm / "vllm/config.py").read_text()
        assert "line_20 = 2000" not in (fake_vllm / "vllm/config.py").read_text()
    assert not (fake_vllm / patchset.RECORD_RELPATH).exists()
    for expected in (expected_v1, expected_v2):
        with pytest.raises(compat.CompatError, match="no applied-series record"):
            compat.check_compat(version="0.34.0", tree=fake_vllm, expected=expected)
    # the next run recovers
    assert patchset.apply_series(fake_vllm, v2).changed
    assert compat.check_compat(version="0.34.0", tree=fake_vllm, expected=expected_v2) == []


def test_failing_patch_on_reapply_removes_the_ignored_record(fake_vllm, tmp_path):
    v1, v2 = _series_v1_v2(fake_vllm, tmp_path)
    patchset.apply_series(fake_vllm, v1)
    third = sorted(v2.glob("0003-*.patch"))[0]
    third.write_text(third.read_text().replace(" line_29 = 29", " line_29 = twenty-nine"))
    with pytest.raises(PatchSetError, match="patch 3/3"):
        patchset.apply_series(fake_vllm, v2)
    assert _at_baseline(fake_vllm)


def test_record_that_disagrees_with_the_files_is_refused(fake_vllm, tmp_path, monkeypatch):
    """Files rolled back behind the tooling's back (the ignored record survives
    a `git checkout`): the record says applied, the files are stock."""
    monkeypatch.delenv(envs.ALLOW_MISMATCH.name, raising=False)
    v1, _ = _series_v1_v2(fake_vllm, tmp_path)
    expected = _expected(fake_vllm, v1, tmp_path)
    _git(fake_vllm, "checkout", "-q", "-f", patchset.BASELINE_TAG)
    assert patchset.read_record(fake_vllm) is not None  # git left the ignored record
    with pytest.raises(compat.CompatError) as err:
        compat.check_compat(version="0.34.0", tree=fake_vllm, expected=expected)
    assert "disagrees with its files: 1 of 1 patched file(s) differ" in str(err.value)
    assert "vllm/config.py" in str(err.value)
    assert not patchset.tree_is_applied(fake_vllm, patchset.read_series(v1))
    assert patchset.apply_series(fake_vllm, v1).changed
    assert compat.check_compat(version="0.34.0", tree=fake_vllm, expected=expected) == []


def test_relative_patch_dir_is_resolved_before_git_runs_in_the_tree(fake_vllm, tmp_path,
                                                                    monkeypatch):
    pdir = tmp_path / "patches"
    _make_patches(fake_vllm, pdir, [("[A] first", "line_3 = 3", "line_3 = 33")])
    monkeypatch.chdir(tmp_path)
    assert patchset.check_series(fake_vllm, Path("patches"))
    assert patchset.apply_series(fake_vllm, Path("patches")).changed


def test_export_author_signs_every_patch_and_still_applies(fake_vllm, tmp_path):
    pdir = tmp_path / "patches"
    old_sign_off = "\n\nSigned-off-by: Old Name <old@example.org>"
    _make_patches(fake_vllm, pdir, [("[A] first" + old_sign_off, "line_3 = 3", "line_3 = 33"),
                                    ("[B] second", "line_5 = 5", "line_5 = 55")])
    patchset.apply_series(fake_vllm, pdir)
    shipped = tmp_path / "series.json"
    author = patchset.parse_author("  Ada  Lovelace <ada@example.org> ")
    patchset.export_series(fake_vllm, pdir, shipped, author=author)
    patches = sorted(pdir.glob("000*.patch"))
    assert len(patches) == 2
    for patch in patches:
        text = patch.read_text()
        message = text.split("\n---\n", 1)[0]
        assert "From: Ada Lovelace <ada@example.org>\n" in text
        assert [ln for ln in message.splitlines() if ln.startswith("Signed-off-by:")] == [
            "Signed-off-by: Ada Lovelace <ada@example.org>"]
        assert "old@example.org" not in message
    before = {p.name: p.read_bytes() for p in pdir.iterdir()}
    patchset.export_series(fake_vllm, pdir, shipped, author=author)
    assert {p.name: p.read_bytes() for p in pdir.iterdir()} == before  # byte-stable
    _git(fake_vllm, "checkout", "-q", "-f", patchset.BASELINE_TAG)
    patchset.apply_series(fake_vllm, pdir)  # the signed patches still apply
    log = _git(fake_vllm, "log", "-1", "--format=%an <%ae>%n%B", "HEAD~1")
    assert log.startswith("Ada Lovelace <ada@example.org>")
    assert "Signed-off-by: Ada Lovelace <ada@example.org>" in log


def test_a_long_author_survives_format_patch_folding(fake_vllm, tmp_path):
    """format-patch folds a From: header past 78 characters; the folded part
    used to stay behind the replaced header and git am read it into the name."""
    pdir = tmp_path / "patches"
    _make_patches(fake_vllm, pdir, [("[A] first", "line_3 = 3", "line_3 = 33")])
    patchset.apply_series(fake_vllm, pdir)
    author = "Seed 0123abcd maintainers <maintainers@users.noreply.a-seed-0123abcd.example>"
    subprocess.run(["git", "-C", str(fake_vllm), "commit", "-q", "--amend", "--no-edit",
                    "--author", author], check=True)
    patchset.export_series(fake_vllm, pdir, tmp_path / "series.json", author=author)
    message = next(pdir.glob("0001-*.patch")).read_text().split("\n---\n", 1)[0]
    assert re.findall(r"^(?:From: .*|[ \t].*)$", message, re.M) == [f"From: {author}"]
    patchset.apply_series(fake_vllm, pdir)
    applied = subprocess.run(["git", "-C", str(fake_vllm), "log", "-1", "--format=%an <%ae>"],
                             check=True, capture_output=True, text=True).stdout.strip()
    assert applied == author


def test_an_empty_author_is_refused_not_taken_for_none(tmp_path, monkeypatch):
    """``--author ''`` used to fall back silently to git config (``if args.author``)."""
    with pytest.raises(PatchSetError, match=r"^--author '': expected 'Name <email>'$"):
        patchset.export_author("", tmp_path)
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for key, value in (("user.name", "Ada Lovelace"), ("user.email", "ada@example.org")):
        subprocess.run(["git", "-C", str(repo), "config", key, value], check=True)
    assert patchset.export_author(None, repo) == "Ada Lovelace <ada@example.org>"
    assert patchset.export_author("Bo <bo@example.org>", repo) == "Bo <bo@example.org>"


def test_shipped_patches_carry_no_placeholder_identity():
    pdir = Path(__file__).resolve().parents[2] / "patches" / f"vllm-{patchset.VLLM_VERSION}"
    for patch in sorted(pdir.glob("*.patch")):
        message = patch.read_text().split("\n---\n", 1)[0]
        assert patchset.PLACEHOLDER_EMAIL not in message, patch.name
        authors = re.findall(r"^(?:From|Signed-off-by): (.*)$", message, re.M)
        assert len(authors) == 2 and len(set(authors)) == 1, (patch.name, authors)
        patchset.parse_author(authors[0])


@pytest.mark.parametrize("bad", ["Ada", "<ada@example.org>", "Ada <ada>", "Ada <a@b> x",
                                 "Ada <<a@b>>", ""])
def test_bad_author_is_a_one_line_error(bad):
    with pytest.raises(PatchSetError, match=r"^--author .*: expected 'Name <email>'$"):
        patchset.parse_author(bad)


def test_default_author_is_git_config_or_a_clear_error(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    for var in ("HOME", "XDG_CONFIG_HOME"):
        monkeypatch.setenv(var, str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    with pytest.raises(PatchSetError, match="no patch author: pass --author"):
        patchset.default_author(repo)
    subprocess.run(["git", "-C", str(repo), "config", "user.name", "Ada Lovelace"], check=True)
    subprocess.run(["git", "-C", str(repo), "config", "user.email", "ada@example.org"],
                   check=True)
    assert patchset.default_author(repo) == "Ada Lovelace <ada@example.org>"


#: what a vLLM reviewer refuses in a patch: instance attributes swapped at run time and
#: validated configs mutated behind pydantic's back
FORBIDDEN_IN_SERIES = re.compile(r"(?<![\w.])setattr\(|object\.__setattr__\(")


def forbidden_additions(patch_dir: Path) -> list[str]:
    """``file: line`` for every line a patch adds that calls ``setattr`` or
    ``object.__setattr__`` (tests included; pytest's ``monkeypatch.setattr`` is fine).
    The series of the previous release fails it (``bind_unsharded``'s ``setattr`` and
    the Kimi MTP model's ``object.__setattr__``)."""
    out = []
    for patch in sorted(patch_dir.glob("*.patch")):
        for line in patch.read_text().splitlines():
            if (line.startswith("+") and not line.startswith("+++")
                    and FORBIDDEN_IN_SERIES.search(line)):
                out.append(f"{patch.name}: {line[1:].strip()}")
    return out


def test_series_adds_no_setattr_wrapping_or_config_setattr(tmp_path):
    pdir = Path(__file__).resolve().parents[2] / "patches" / f"vllm-{patchset.VLLM_VERSION}"
    assert forbidden_additions(pdir) == []
    planted = tmp_path / "0001-x.patch"
    planted.write_text("+++ b/x.py\n+        setattr(model, name, _unsharded(fn))\n"
                       "+    object.__setattr__(cfg, 'model_config', d)\n ctx\n")
    assert forbidden_additions(tmp_path) == [
        "0001-x.patch: setattr(model, name, _unsharded(fn))",
        "0001-x.patch: object.__setattr__(cfg, 'model_config', d)"]
