"""The committed list of vLLM tests that cannot run here parses, and every entry
carries a reason (an entry without one is refused)."""

from __future__ import annotations

import pytest

from vllm_kimi_ext.testing.upstream_deselect import LIST, load_entries


def test_committed_list_parses_with_reasons():
    entries = load_entries()
    assert len(entries) > 10
    assert all(reason for _, reason in entries)
    assert all(e.startswith("tests/") for e, _ in entries)


def test_entry_without_reason_is_refused(tmp_path):
    bad = tmp_path / "deselect.txt"
    bad.write_text("tests/v1/foo.py\n")
    with pytest.raises(ValueError, match="has no '# reason'"):
        load_entries(bad)
    assert LIST.name == "deselect.txt"


def test_entries_match_whole_test_names_not_prefixes():
    from vllm_kimi_ext.testing.upstream_deselect import _matches

    assert _matches("tests/a.py::test_stop", "tests/a.py::test_stop")
    assert _matches("tests/a.py::test_stop[x-1]", "tests/a.py::test_stop")
    assert _matches("tests/a.py::TestX::test_y", "tests/a.py::TestX")
    assert not _matches("tests/a.py::test_stop_token_ids", "tests/a.py::test_stop")
    assert _matches("tests/a.py::test_m[DSpark-Cfg]", "tests/a.py::test_m[DSpark")
    assert not _matches("tests/a.py::test_m[Other-Cfg]", "tests/a.py::test_m[DSpark")
