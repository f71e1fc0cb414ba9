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
