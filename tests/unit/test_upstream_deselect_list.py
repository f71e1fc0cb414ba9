"""The committed list of vLLM tests that cannot run here parses, and every entry
carries a reason (an entry without one is refused); the plugin reads the list it is
given and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.upstream_deselect import OPTION, _matches, load_entries

REPO = Path(__file__).resolve().parents[2]
LIST = REPO / "tests" / "upstream" / "deselect.txt"


def test_committed_list_parses_with_reasons():
    entries = load_entries(LIST)
    assert len(entries) > 10
    assert all(reason for _, reason in entries)
    assert all(e.startswith("tests/") for e, _ in entries)


def test_entry_without_reason_is_refused(tmp_path):
    bad = tmp_path / "deselect.txt"
    bad.write_text("tests/v1/foo.py\n")
    with pytest.raises(ValueError, match="has no '# reason'"):
        load_entries(bad)


def test_entries_match_whole_test_names_not_prefixes():
    assert _matches("tests/a.py::test_stop", "tests/a.py::test_stop")
    assert _matches("tests/a.py::test_stop[x-1]", "tests/a.py::test_stop")
    assert _matches("tests/a.py::TestX::test_y", "tests/a.py::TestX")
    assert not _matches("tests/a.py::test_stop_token_ids", "tests/a.py::test_stop")
    assert _matches("tests/a.py::test_m[DSpark-Cfg]", "tests/a.py::test_m[DSpark")
    assert not _matches("tests/a.py::test_m[Other-Cfg]", "tests/a.py::test_m[DSpark")


def _pytest_with_plugin(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / "tests" / "test_x.py").write_text(
        "def test_keep():\n    pass\n\n\ndef test_drop():\n    raise AssertionError\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "testkit.upstream_deselect",
         "-p", "no:cacheprovider", "-q", "tests", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_plugin_deselects_from_the_list_it_is_given(tmp_path):
    lst = tmp_path / "list.txt"
    lst.write_text("tests/test_x.py::test_drop  # fails on purpose\n"
                   "tests/test_gone.py::test_y  # matches nothing\n")
    r = _pytest_with_plugin(tmp_path, OPTION, str(lst))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed, 1 deselected" in r.stdout
    assert "2 entries (list.txt); unused: ['tests/test_gone.py::test_y']" in r.stdout


def test_plugin_without_a_list_is_a_usage_error(tmp_path):
    r = _pytest_with_plugin(tmp_path)
    assert r.returncode == 4, r.stdout + r.stderr  # pytest's usage-error exit status
    assert f"{OPTION} PATH is required" in r.stderr
    missing = _pytest_with_plugin(tmp_path, OPTION, str(tmp_path / "nope.txt"))
    assert missing.returncode == 4 and "cannot read the deselect list" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_upstream_tests_load_the_cpu_plugin_so_nothing_is_deselected_for_triton_cpu():
    """`nox -s upstream-tests` loads testkit.upstream_cpu (vLLM's CPU platform then builds a
    VllmConfig without triton-cpu), so no entry may be deselected for that reason: such
    entries pass on both trees once the plugin is loaded (13 did, 2026-12-07)."""
    noxfile = (REPO / "noxfile.py").read_text()
    session = noxfile.split("def upstream_tests(", 1)[1].split("\n@nox.session", 1)[0]
    assert '"-p", "testkit.upstream_cpu"' in session
    stale = [e for e, reason in load_entries(LIST) if "requires triton-cpu" in reason]
    assert stale == []
