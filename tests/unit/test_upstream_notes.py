"""Every patch has its note (front matter + the PR sections) and an index row."""

from __future__ import annotations

import re
from pathlib import Path

from vllm_kimi_ext.patchset import VLLM_VERSION
from vllm_kimi_ext.patchset import read_series as _read_series

REPO_ROOT = Path(__file__).resolve().parents[2]
PATCH_DIR = REPO_ROOT / "patches" / f"vllm-{VLLM_VERSION}"
NOTES = REPO_ROOT / "upstream-notes"


def read_series():
    return _read_series(PATCH_DIR)
SECTIONS = ("## Purpose", "## Why not a plugin", "## Design", "## Test Plan",
            "## Test Result", "## Risks", "## Upgrade risk")
FRONT = ("id", "patch", "targets", "upstream_status", "remove_when")


def _front_matter(text: str) -> dict[str, str]:
    m = re.match(r"^---\n(.*?)\n---\n", text, re.S)
    assert m, "missing front matter"
    return dict(line.split(": ", 1) for line in m.group(1).splitlines() if ": " in line)


def test_each_patch_has_a_complete_note_and_index_row():
    index = (NOTES / "README.md").read_text()
    for entry in read_series():
        num = entry.name.split("-", 1)[0]
        notes = sorted(NOTES.glob(f"{num}-*.md"))
        assert len(notes) == 1, f"{entry.name}: expected one upstream-notes/{num}-*.md"
        text = notes[0].read_text()
        front = _front_matter(text)
        assert set(FRONT) <= set(front), f"{notes[0].name}: front matter lacks " \
            f"{set(FRONT) - set(front)}"
        assert front["id"] == num
        assert front["patch"] == f"patches/{PATCH_DIR.name}/{entry.name}"
        for section in SECTIONS:
            assert section in text, f"{notes[0].name} lacks {section!r}"
        result = text.split("## Test Result", 1)[1].split("\n## ", 1)[0]
        assert re.search(r"\d", result), f"{notes[0].name}: Test Result carries no numbers"
        assert f"| {num} |" in index and notes[0].name in index, f"index lacks {num}"


def test_no_orphan_notes():
    numbers = {e.name.split("-", 1)[0] for e in read_series()}
    for note in NOTES.glob("[0-9][0-9][0-9][0-9]-*.md"):
        assert note.name.split("-", 1)[0] in numbers, f"{note.name} has no patch"
