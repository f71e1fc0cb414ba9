"""Every git patch has its note and its own test file; notes, index and links agree.

For each patch ``patches/vllm-0.34.0/NNNN-<stem>.patch`` in ``series``:

* its note is ``upstream-notes/NNNN-<stem>.md`` (the same stem), written as the body of
  its vLLM pull request in vLLM's template (``.github/PULL_REQUEST_TEMPLATE.md``: Overview,
  Claims, Validation, Details, the checklist), with front matter (``id`` = NNNN, ``patch``
  = the patch path, ``targets``, ``upstream_status``, ``remove_when``, ``depends_on``:
  ``none`` or earlier patch numbers), a ``Depends on:`` line naming the same patches by
  their PR titles (no patch numbers: upstream has none), and numbers in its Validation;
* the PR body (everything above the :data:`RECORD_MARK` line) holds no project-internal
  material (this project's commands, package, flags, test files or plugin) and has the
  template's AI-assistance box ticked; this project's record of the patch (its own tests,
  why it is not a plugin) follows the mark;
* at least one ``tests/<tier>/test_patch_NNNN_*.py`` exists, and the note's Validation
  names every such file;
* ``upstream-notes/README.md`` has its row, linking the note and those test files, and
  lists it once under "Order to open", after every patch it depends on.

No numbered note or ``test_patch_NNNN_*`` file exists without a patch, and every link to
a note from ``README.md`` or ``docs/`` resolves. The checker returns its findings, so the
planted-violation tests below show each rule catching what it is for.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from vllm_kimi_ext.patchset import VLLM_VERSION, read_series

REPO_ROOT = Path(__file__).resolve().parents[2]
PATCHES = Path("patches") / f"vllm-{VLLM_VERSION}"
NOTES = Path("upstream-notes")
TIERS = ("unit", "vllm", "distributed", "gpu", "canary")
SECTIONS = ("## Overview", "## Claims", "## Validation", "## Details",
            "<summary> Pull Request Checklist </summary>")
FRONT = ("id", "patch", "targets", "upstream_status", "remove_when", "depends_on")
ORDER_HEADING = "## Order to open"
NUMBERED = re.compile(r"^(\d{4})-")
NOTE_LINK = re.compile(r"upstream-notes/([^)\s#`]+\.md)")
#: the line that ends the PR body of a note; this project's record of the patch follows
RECORD_MARK = ("<!-- Everything below this line is this project's record of the patch; "
               "it is not part of the PR description. -->")
#: project-internal material a vLLM reviewer cannot use, case-insensitive
INTERNAL = re.compile(r"nox -s|this project|vllm[_-]kimi[_-]ext|VLLM_KIMI_EXT|\bplugin|"
                      r"test_patch_|upstream-check|tests/(unit|vllm|canary)/|test_draft_collectives",
                      re.I)
AI_BOX = "- [x] AI assistance was used during the creation of this PR"


def _front_matter(text: str) -> dict[str, str] | None:
    m = re.match(r"^---\n(.*?)\n---\n", text, re.S)
    if not m:
        return None
    return dict(line.split(": ", 1) for line in m.group(1).splitlines() if ": " in line)


def _section(text: str, title: str) -> str:
    return text.split(f"## {title}", 1)[1].split("\n## ", 1)[0] if f"## {title}" in text else ""


def patch_test_files(root: Path, num: str) -> list[Path]:
    """``tests/<tier>/test_patch_NNNN_*.py`` for one patch number."""
    return sorted(p.relative_to(root) for tier in TIERS
                  for p in (root / "tests" / tier).glob(f"test_patch_{num}_*.py"))


def _note_findings(root: Path, name: str) -> list[str]:
    """Findings for the note of one patch file ``name``."""
    num, stem = name.split("-", 1)[0], name.removesuffix(".patch")
    note = NOTES / f"{stem}.md"
    if not (root / note).is_file():
        return [f"{name}: no note {note} (a note has the patch file's stem)"]
    text = (root / note).read_text()
    front = _front_matter(text)
    if front is None:
        return [f"{note}: no front matter"]
    out = [f"{note}: front matter lacks {key!r}" for key in FRONT if key not in front]
    if front.get("id") != num:
        out.append(f"{note}: id {front.get('id')!r}, expected {num!r}")
    if front.get("patch") != f"{PATCHES}/{name}":
        out.append(f"{note}: patch {front.get('patch')!r}, expected '{PATCHES}/{name}'")
    body, mark, record = text.partition(RECORD_MARK)
    out += [f"{note}: lacks {s!r}" for s in SECTIONS if s not in body]
    if not mark:
        out.append(f"{note}: no line {RECORD_MARK!r} ending the PR body")
    for line in body.splitlines():
        if INTERNAL.search(line):
            out.append(f"{note}: PR body holds project-internal material: {line.strip()!r}")
    if AI_BOX not in body:
        out.append(f"{note}: PR body lacks the ticked AI-assistance box {AI_BOX!r}")
    if not re.search(r"\d", _section(body, "Validation")):
        out.append(f"{note}: Validation carries no numbers")
    out += _depends_findings(root, note, num, front.get("depends_on", ""), text)
    tests = patch_test_files(root, num)
    if not tests:
        out.append(f"{name}: no test file tests/<tier>/test_patch_{num}_*.py")
    out += [f"{note}: its project record does not name {t}" for t in tests
            if str(t) not in record]
    index = (root / NOTES / "README.md").read_text()
    row = re.search(rf"^\| {num} \|.*\]\({re.escape(note.name)}\).*$", index, re.M)
    if not row:
        out.append(f"{NOTES}/README.md: no row '| {num} |' linking {note.name}")
    else:
        out += [f"{NOTES}/README.md: row {num} does not link ../{t}" for t in tests
                if f"](../{t})" not in row.group(0)]
    return out


def _depends(field: str) -> list[str]:
    return [] if field.strip() == "none" else [d.strip() for d in field.split(",")]


def _pr_title(root: Path, num: str) -> str | None:
    notes = list((root / NOTES).glob(f"{num}-*.md"))
    m = re.search(r"^# (.+)$", notes[0].read_text(), re.M) if len(notes) == 1 else None
    return m.group(1).strip() if m else None


def _depends_findings(root: Path, note: Path, num: str, field: str, text: str) -> list[str]:
    deps = _depends(field)
    out = [f"{note}: depends_on {d!r} is not an earlier patch number" for d in deps
           if not (re.fullmatch(r"\d{4}", d) and d < num)]
    line = re.search(r"^Depends on: (.*)$", text, re.M)
    if not line:
        return [*out, f"{note}: no 'Depends on:' line"]
    if re.search(r"\b\d{4}\b", line.group(1)):
        out.append(f"{note}: 'Depends on:' names a patch number; name the PR by its title")
    named = re.findall(r'the PR "([^"]+)"', line.group(1))
    titles = [_pr_title(root, d) for d in deps]
    if named != titles or (not deps and not line.group(1).startswith("none")):
        out.append(f"{note}: 'Depends on:' names {named}, front matter {deps} ({titles})")
    return out


def _order_findings(root: Path, names: list[str]) -> list[str]:
    """README's "Order to open" lists every patch once, each after its dependencies."""
    index = (root / NOTES / "README.md").read_text()
    if ORDER_HEADING not in index:
        return [f"{NOTES}/README.md: no {ORDER_HEADING!r} section"]
    block = index.split(ORDER_HEADING, 1)[1].split("\n## ", 1)[0]
    order = re.findall(r"^\d+\. (\d{4})\b", block, re.M)
    numbers = [n.split("-", 1)[0] for n in names]
    if sorted(order) != sorted(numbers):
        return [f"{NOTES}/README.md: {ORDER_HEADING!r} lists {order}, expected each of "
                f"{numbers} once"]
    out = []
    for name in names:
        num = name.split("-", 1)[0]
        front = _front_matter((root / NOTES / (name.removesuffix(".patch") + ".md"))
                              .read_text()) or {}
        out += [f"{NOTES}/README.md: {num} is listed before {dep}, which it depends on"
                for dep in _depends(front.get("depends_on", "none"))
                if dep in order and order.index(dep) > order.index(num)]
    return out


def check_series_notes(root: Path) -> list[str]:
    """Every rule of the module docstring, as a list of findings (empty: clean)."""
    names = [e.name for e in read_series(root / PATCHES)]
    findings = [f for name in names for f in _note_findings(root, name)]
    if not findings:
        findings += _order_findings(root, names)
    expected_notes = {name.removesuffix(".patch") + ".md" for name in names}
    numbers = {name.split("-", 1)[0] for name in names}
    for note in sorted((root / NOTES).glob("*.md")):
        if NUMBERED.match(note.name) and note.name not in expected_notes:
            findings.append(f"{NOTES}/{note.name}: no patch with this stem")
    for tier in TIERS:
        for test in sorted((root / "tests" / tier).glob("test_patch_*.py")):
            m = re.match(r"test_patch_(\d{4})_", test.name)
            if not m or m.group(1) not in numbers:
                findings.append(f"{test.relative_to(root)}: no patch with this number")
    for doc in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        for link in NOTE_LINK.findall(doc.read_text()):
            if not (root / NOTES / link).is_file():
                findings.append(f"{doc.relative_to(root)}: link to missing note {link}")
    return findings


def test_series_notes_tests_and_links_agree():
    assert check_series_notes(REPO_ROOT) == []


# --------------------------------------------------------------------------- #
# Planted violations, on a copy of the parts of the repository the rules read   #
# --------------------------------------------------------------------------- #


@pytest.fixture()
def mirror(tmp_path) -> Path:
    for part in (PATCHES, NOTES, Path("docs")):
        shutil.copytree(REPO_ROOT / part, tmp_path / part)
    shutil.copy(REPO_ROOT / "README.md", tmp_path / "README.md")
    for tier in TIERS:
        (tmp_path / "tests" / tier).mkdir(parents=True)
        for test in (REPO_ROOT / "tests" / tier).glob("test_patch_*.py"):
            (tmp_path / "tests" / tier / test.name).write_text("")
    assert check_series_notes(tmp_path) == []
    return tmp_path


def _first(root: Path) -> tuple[str, str, Path]:
    """Number, patch file name and note path of the first patch."""
    name = read_series(root / PATCHES)[0].name
    return name.split("-", 1)[0], name, root / NOTES / (name.removesuffix(".patch") + ".md")


def test_note_with_another_stem_is_found(mirror):
    num, name, note = _first(mirror)
    note.rename(note.with_name(f"{num}-short-name.md"))
    found = check_series_notes(mirror)
    assert (f"{name}: no note {NOTES}/{name.removesuffix('.patch')}.md (a note has the "
           "patch file's stem)" in found)
    assert f"{NOTES}/{num}-short-name.md: no patch with this stem" in found


def test_front_matter_pointing_elsewhere_is_found(mirror):
    num, name, note = _first(mirror)
    note.write_text(note.read_text().replace(f"patch: {PATCHES}/{name}",
                                             f"patch: {PATCHES}/{num}-other.patch", 1))
    assert any("expected" in f and name in f for f in check_series_notes(mirror))


def test_missing_per_patch_test_file_is_found(mirror):
    num, name, _ = _first(mirror)
    for test in patch_test_files(mirror, num):
        (mirror / test).unlink()
    assert check_series_notes(mirror) == [
        f"{name}: no test file tests/<tier>/test_patch_{num}_*.py"]


def test_test_file_not_named_in_the_record_or_index_is_found(mirror):
    num, _, note = _first(mirror)
    extra = Path("tests") / "unit" / f"test_patch_{num}_extra.py"
    (mirror / extra).write_text("")
    assert check_series_notes(mirror) == [
        f"{note.relative_to(mirror)}: its project record does not name {extra}",
        f"{NOTES}/README.md: row {num} does not link ../{extra}"]


def test_orphan_test_file_index_row_and_dangling_link_are_found(mirror):
    _, _, note = _first(mirror)
    (mirror / "tests" / "vllm" / "test_patch_9999_gone.py").write_text("")
    index = mirror / NOTES / "README.md"
    index.write_text(index.read_text().replace(f"]({note.name})", "](elsewhere.md)"))
    readme = mirror / "README.md"
    readme.write_text(readme.read_text() + "\n[note](upstream-notes/0001-renamed.md)\n")
    found = check_series_notes(mirror)
    assert "tests/vllm/test_patch_9999_gone.py: no patch with this number" in found
    assert any(f.startswith(f"{NOTES}/README.md: no row") for f in found)
    assert "README.md: link to missing note 0001-renamed.md" in found


# ---- runtime patches (vllm_kimi_ext/runtime/): notes R01, R02, ... ----------------
RUNTIME_SECTIONS = ("## Purpose", "## Why not upstream yet", "## Design", "## Test Plan",
                    "## Test Result", "## Risks", "## Upgrade risk")
RUNTIME_FRONT = ("id", "patch", "targets", "upstream_status", "remove_when", "upstream_pr")


def _runtime_notes() -> dict[str, tuple[str, dict[str, str], str]]:
    """``{patch field: (note file name, front matter, text)}`` of every R note."""
    out = {}
    for note in sorted((REPO_ROOT / NOTES).glob("R[0-9][0-9]-*.md")):
        text = note.read_text()
        front = _front_matter(text) or {}
        assert front.get("patch") not in out, f"{note.name}: a second note for {front['patch']}"
        out[front.get("patch")] = (note.name, front, text)
    return out


def test_each_runtime_patch_has_a_complete_note_and_index_row():
    from vllm_kimi_ext import runtime

    index = (REPO_ROOT / NOTES / "README.md").read_text()
    notes = _runtime_notes()
    for d in runtime.declared_patches():
        key = f"vllm_kimi_ext/runtime/{d.module}.py:{d.name}"
        assert key in notes, f"{d.ref}: no upstream-notes/R<NN>-*.md with `patch: {key}`"
        name, front, text = notes[key]
        assert set(RUNTIME_FRONT) <= set(front), (
            f"{name}: front matter lacks {set(RUNTIME_FRONT) - set(front)}")
        assert name.startswith(front["id"] + "-"), f"{name}: id {front['id']} != file name"
        for attr in d.attributes:
            assert f"{d.target}.{attr}" in front["targets"], f"{name}: targets lacks {attr}"
        assert front["upstream_pr"].split()[0].rstrip(":,;—") in ("yes", "no"), (
            f"{name}: upstream_pr must start with yes or no")
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


def _note_of(root: Path, num: str) -> Path:
    (note,) = (root / NOTES).glob(f"{num}-*.md")
    return note


def test_depends_on_line_disagreeing_with_front_matter_is_found(mirror):
    note = _note_of(mirror, "0007")
    text = note.read_text()
    line = re.search(r"^Depends on: .*$", text, re.M).group(0)
    note.write_text(text.replace(line, 'Depends on: the PR "[X] something"'))
    assert any("'Depends on:' names ['[X] something']" in f
               for f in check_series_notes(mirror))
    note.write_text(text.replace(line, "Depends on: 0006 (internal number)"))
    assert any("names a patch number" in f for f in check_series_notes(mirror))


@pytest.mark.parametrize("plant", ["nox -s test -- tests/vllm/x.py", "this project's verifier",
                                   "VLLM_KIMI_EXT_SHARDED_VERIFY=1", "the plugin does it"])
def test_project_internal_material_in_a_pr_body_is_found(mirror, plant):
    note = _note_of(mirror, "0002")
    note.write_text(note.read_text().replace("## Details", f"{plant}\n\n## Details", 1))
    assert any("PR body holds project-internal material" in f and plant in f
               for f in check_series_notes(mirror))


def test_unticked_ai_disclosure_or_missing_record_mark_is_found(mirror):
    note = _note_of(mirror, "0002")
    text = note.read_text()
    note.write_text(text.replace(AI_BOX, "- [ ] AI assistance was used during the creation "
                                         "of this PR").replace(RECORD_MARK, ""))
    found = check_series_notes(mirror)
    assert any("lacks the ticked AI-assistance box" in f for f in found)
    assert any("ending the PR body" in f for f in found)


def test_pr_opened_before_its_dependency_is_found(mirror):
    index = mirror / NOTES / "README.md"
    text = index.read_text()
    six = re.search(r"^(\d+)\. (0006 .*)$", text, re.M)
    seven = re.search(r"^(\d+)\. (0007 .*)$", text, re.M)
    text = text.replace(six.group(0), f"{six.group(1)}. {seven.group(2)}")
    text = text.replace(seven.group(0), f"{seven.group(1)}. {six.group(2)}")
    index.write_text(text)
    found = check_series_notes(mirror)
    assert "upstream-notes/README.md: 0007 is listed before 0006, which it depends on" in found


def test_note_without_the_pr_template_sections_is_found(mirror):
    note = _note_of(mirror, "0002")
    note.write_text(note.read_text().replace("## Claims", "## Results"))
    assert f"{NOTES}/{note.name}: lacks '## Claims'" in check_series_notes(mirror)
