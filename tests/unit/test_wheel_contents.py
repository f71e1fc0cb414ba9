"""The wheel holds the product only: every module and data file of ``vllm_kimi_ext``, its
entry points, and no test kit, benchmark harness or tests.

The wheel is built (``pip wheel --no-deps --no-build-isolation``, offline, with the
environment's setuptools) from a copy of the files git tracks, which is what a fresh clone
has; building in place would write setuptools' ``build/`` into the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "vllm_kimi_ext"
#: what setuptools' package-data in pyproject.toml ships besides the modules
DATA_SUFFIXES = (".json", ".toml", ".txt")
#: never in the wheel (the last one is the test kit's old home inside the package)
FORBIDDEN_PREFIXES = ("testkit/", "bench/", "tests/", f"{PACKAGE}/testing/")
#: not copied when git is unavailable (build outputs, environments, caches)
UNTRACKED = {".git", ".venv", ".nox", "build", "dist", "__pycache__", "out"}


def _tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                             check=True, timeout=60).stdout
        return [f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.SubprocessError):  # no git, or not a checkout
        return [p.relative_to(REPO).as_posix() for p in REPO.rglob("*")
                if p.is_file() and not UNTRACKED & set(p.relative_to(REPO).parts)]


def source_package_files(files: list[str]) -> set[str]:
    """The files of the package the wheel must hold: modules and package data."""
    return {f for f in files if f.startswith(f"{PACKAGE}/")
            and (f.endswith(".py") or f.endswith(DATA_SUFFIXES))}


def misplaced(names: list[str]) -> list[str]:
    """Wheel entries that are not the product or its metadata."""
    return sorted(n for n in names if n.startswith(FORBIDDEN_PREFIXES)
                  or not (n.startswith(f"{PACKAGE}/") or n.split("/")[0].endswith(".dist-info")))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("setuptools", reason="the build backend (pyproject build-system)")
    files = _tracked_files()
    src = tmp_path_factory.mktemp("clone")
    for rel in files:
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    dist = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(dist), str(src)],
        capture_output=True, text=True, timeout=600, env=env, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = dist.glob("vllm_kimi_ext-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = next(zf.read(n).decode() for n in names
                            if n.endswith(".dist-info/entry_points.txt"))
    return files, names, entry_points


def test_wheel_has_no_test_kit_benchmarks_or_tests(built):
    files, names, _ = built
    assert any(f.startswith("testkit/") for f in files)  # the copy had them to leak
    assert any(f.startswith("bench/") for f in files)
    assert misplaced(names) == []


def test_wheel_has_every_module_and_data_file_of_the_package(built):
    files, names, _ = built
    expected = source_package_files(files)
    shipped = {n for n in names if n.startswith(f"{PACKAGE}/")}
    assert expected - shipped == set(), "missing from the wheel"
    assert shipped - expected == set(), "in the wheel but not tracked in the package"
    for must in (f"{PACKAGE}/plugin.py", f"{PACKAGE}/series.json",
                 f"{PACKAGE}/tokenizers/tokenization_kimi.py",
                 f"{PACKAGE}/costmodel/profiles/models/kimi-k2.5.json",
                 f"{PACKAGE}/verify/protocol.py", f"{PACKAGE}/integration/handover.json",
                 f"{PACKAGE}/integration/sharded_verify/sampler.py"):
        assert must in shipped
    # what serving cannot run stays out: the histogram escalation (measured slower, no
    # setting selects it), its kernels and its measured report live in the test kit
    for gone in (f"{PACKAGE}/verify/step_hist.py", f"{PACKAGE}/verify/_hist_kernels.py",
                 f"{PACKAGE}/costmodel/profiles/verify/verify_hist_h200.json"):
        assert gone not in shipped


def test_wheel_declares_the_plugin_and_the_command(built):
    _, _, entry_points = built
    assert "[vllm.general_plugins]" in entry_points
    assert "kimi_ext = vllm_kimi_ext.plugin:register" in entry_points
    assert "vllm-kimi-ext = vllm_kimi_ext.cli:main" in entry_points


def test_the_checks_see_a_planted_leak():
    names = ["vllm_kimi_ext/cli.py", "testkit/checkpoints.py", "bench/run_all.py",
             "vllm_kimi_ext/testing/vllm_cpu.py", "conftest.py",
             "vllm_kimi_ext-0.1.0.dist-info/RECORD"]
    assert misplaced(names) == ["bench/run_all.py", "conftest.py", "testkit/checkpoints.py",
                                "vllm_kimi_ext/testing/vllm_cpu.py"]
    assert source_package_files(["vllm_kimi_ext/a.py", "vllm_kimi_ext/p/x.json",
                                 "vllm_kimi_ext/README.md", "testkit/t.py"]) == {
        "vllm_kimi_ext/a.py", "vllm_kimi_ext/p/x.json"}
