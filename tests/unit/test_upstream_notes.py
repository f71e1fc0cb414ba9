"""Every patch has its note (front matter + the PR sections) and an index row."""

from __future__ import annotations

import re

from vllm_kimi_ext.patchset import PATCH_DIR, REPO_ROOT, read_series

NOTES = REPO_ROOT / "upstream-notes"
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


# ---- runtime patches (vllm_kimi_ext/runtime/): notes R01, R02, ... ----------------
RUNTIME_SECTIONS = ("## Purpose", "## Why not upstream yet", "## Design", "## Test Plan",
                    "## Test Result", "## Risks", "## Upgrade risk")
RUNTIME_FRONT = FRONT + ("upstream_pr",)


def _runtime_notes() -> dict[str, tuple[str, dict[str, str], str]]:
    """``{patch field: (note file name, front matter, text)}`` of every R note."""
    out = {}
    for note in sorted(NOTES.glob("R[0-9][0-9]-*.md")):
        text = note.read_text()
        front = _front_matter(text)
        assert front.get("patch") not in out, f"{note.name}: a second note for {front['patch']}"
        out[front.get("patch")] = (note.name, front, text)
    return out


def test_each_runtime_patch_has_a_complete_note_and_index_row():
    from vllm_kimi_ext import runtime

    index = (NOTES / "README.md").read_text()
    notes = _runtime_notes()
    for d in runtime.declared_patches():
        key = f"vllm_kimi_ext/runtime/{d.module}.py:{d.name}"
        assert key in notes, f"{d.ref}: no upstream-notes/R<NN>-*.md with `patch: {key}`"
        name, front, text = notes[key]
        assert set(RUNTIME_FRONT) <= set(front), \
            f"{name}: front matter lacks {set(RUNTIME_FRONT) - set(front)}"
        assert name.startswith(front["id"] + "-"), f"{name}: id {front['id']} != file name"
        for attr in d.attributes:
            assert f"{d.target}.{attr}" in front["targets"], f"{name}: targets lacks {attr}"
        assert front["upstream_pr"].split()[0].rstrip(":,;—") in ("yes", "no"), \
            f"{name}: upstream_pr must start with yes or no"
        for section in RUNTIME_SECTIONS:
            assert section in text, f"{name} lacks {section!r}"
        result = text.split("## Test Result", 1)[1].split("\n## ", 1)[0]
        assert re.search(r"\d", result), f"{name}: Test Result carries no numbers"
        assert f"| {front['id']} |" in index and name in index, f"index lacks {front['id']}"


def test_no_orphan_runtime_notes():
    from vllm_kimi_ext import runtime

    declared = {f"vllm_kimi_ext/runtime/{d.module}.py:{d.name}"
                for d in runtime.declared_patches()}
    for key, (name, _, _) in _runtime_notes().items():
        assert key in declared, f"{name} names {key}, which is no runtime patch"
