"""Patch identities come from one source: ``vllm_kimi_ext/series.json`` names each patch by a
slug, and everything else renders the number from it (:mod:`vllm_kimi_ext.patch_ids`).

* the package (code, cost-model profiles) holds no literal patch number (``0009``,
  ``patch 7``): it names slugs;
* the generated docs hold none either: they are regenerated in a child process whose series is
  renumbered (0001 -> 0901, ...) after masking every patch number in the hand-written parts,
  so a number still there came from a generator as a literal;
* every slug the code or a profile names exists; README's example status line matches the
  shipped series.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_kimi_ext import patch_ids
from vllm_kimi_ext.costmodel.catalog import KINDS, ProfileError, list_profiles, load_raw
from vllm_kimi_ext.patchset import PatchSetError

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "vllm_kimi_ext"
#: A patch number written down: ``0009`` (not part of a longer number, name or path), or
#: ``patch 7`` / ``patches 5`` / ``patch #7``.
LITERAL = re.compile(r"(?<![\w.])00(?:0[1-9]|[1-9]\d)(?![\w.])|\b[Pp]atch(?:es)? #?\d{1,4}\b")
#: Package files not scanned: the series record itself.
NOT_SCANNED = ("series.json",)
#: Files still writing a patch number, each with the change that removes it; an entry that no
#: longer has one fails the test, so the list only shrinks.
KNOWN_LITERALS: dict[str, str] = {}


def literals(text: str) -> list[str]:
    return [f"{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
            for m in LITERAL.finditer(text)]


def _package_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*") if p.suffix in (".py", ".json")
                  and not p.relative_to(PACKAGE).as_posix().startswith(NOT_SCANNED))


def test_no_literal_patch_number_in_the_package():
    found = {}
    for path in _package_files():
        hits = literals(path.read_text(encoding="utf-8"))
        if hits:
            found[path.relative_to(PACKAGE).as_posix()] = hits
    unexpected = {k: v for k, v in found.items() if k not in KNOWN_LITERALS}
    assert unexpected == {}, ("literal patch numbers (name the slug; patch_ids.ref renders "
                              f"the number): {unexpected}")
    fixed = sorted(set(KNOWN_LITERALS) - set(found))
    assert fixed == [], f"no literal patch number left: remove {fixed} from KNOWN_LITERALS"


@pytest.mark.parametrize("text", [
    "needs patch 0007", "patches 0006/0009", "0011", "(patch 7)", "Patch #12", "patches 5",
    '"project_requires": "patch 0008 loads the draft"',
])
def test_a_planted_literal_is_found(text):
    assert literals(text)


@pytest.mark.parametrize("text", [
    "0.0001", "upstream-notes/R01-x.md", "{patch:replicate-draft-embedding}",
    "sha 9ed4637aa903932ba920d13d3d0f87f25950b9f5a37b154ce428a8937ccf266e", "20011",
    "patch_ids.ref", "run 0 of 0000", "vLLM 0.34.0", "patch NNNN",
])
def test_other_numbers_pass(text):
    assert literals(text) == []


_RENUMBERED_DOCS = r"""
import json, re, shutil, sys
from pathlib import Path
from vllm_kimi_ext import compat
real = compat.expected_record()
fake = json.loads(json.dumps(real))
for e in fake["series"]:
    e["name"] = "09" + e["name"][2:]
compat.expected_record = lambda: fake
from bench.harness.generated_docs import GENERATORS, regenerate
repo, masked, scratch = (Path(a) for a in sys.argv[1:4])
literal = re.compile(sys.argv[4])
for g in GENERATORS:
    for name in g.updates:
        dst = masked / g.directory / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(literal.sub("NNNN", (repo / g.directory / name).read_text()))
print(json.dumps(regenerate(masked, scratch)))
"""


def test_generated_docs_render_patch_numbers_from_the_series(tmp_path):
    masked, scratch = tmp_path / "masked", tmp_path / "scratch"
    proc = subprocess.run([sys.executable, "-c", _RENUMBERED_DOCS, str(REPO), str(masked),
                           str(scratch), LITERAL.pattern], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    docs = json.loads(proc.stdout.strip().splitlines()[-1])
    found = {rel: hits for rel in docs if (hits := [
        h for h in literals((scratch / rel).read_text()) if not re.search(r"\b09\d\d", h)])}
    assert found == {}, ("a generator writes a literal patch number (render it from a slug "
                         f"with vllm_kimi_ext.patch_ids): {found}")
    rendered = "".join((scratch / rel).read_text() for rel in docs)
    assert re.search(r"\bpatch(es)? 09\d\d", rendered), "no rendered number: the check is blind"


def test_every_patch_has_a_unique_slug_and_numbers_follow_the_series():
    series = json.loads((PACKAGE / "series.json").read_text())["series"]
    nums = patch_ids.numbers()
    assert list(nums) == [e["slug"] for e in series]
    assert list(nums.values()) == [e["name"][:4] for e in series]
    first, second = list(nums)[:2]
    assert patch_ids.ref(first) == "patch " + nums[first]
    assert patch_ids.ref(second, first) == f"patches {nums[first]}/{nums[second]}"
    assert patch_ids.render("x {patch:%s} y" % first) == f"x patch {nums[first]} y"
    with pytest.raises(PatchSetError, match="unknown patch slug 'no-such-patch'"):
        patch_ids.ref("no-such-patch")


def _named_slugs() -> set[str]:
    """Every string literal passed to ``ref``/``number`` or listed in a ``DRAFT_*`` tuple of
    ``patch_ids``, and every ``{patch:...}`` placeholder of the profiles."""
    slugs: set[str] = set()
    for path in _package_files():
        if path.suffix == ".json":
            for m in patch_ids.PLACEHOLDER.finditer(path.read_text()):
                slugs.update(m.group(1).split(","))
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(
                    node.func, "attr", None)) in ("ref", "number"):
                slugs.update(a.value for a in node.args if isinstance(a, ast.Constant))
            if path.name == "patch_ids.py" and isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id.startswith("DRAFT_") for t in node.targets):
                slugs.update(c.value for c in ast.walk(node.value)
                             if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return slugs


def test_every_named_slug_is_in_the_series():
    named = _named_slugs()
    assert {"replicate-draft-embedding", "kimi-k25-mtp", "draft-model-arch"} <= named
    assert named - set(patch_ids.numbers()) - set(patch_ids.WITHDRAWN) == set()


def test_withdrawn_patches_render_as_their_runtime_patch():
    """A git patch withdrawn into runtime patches keeps its slug; it renders as the
    runtime patch's note id, which exists, and is no longer in the series."""
    for slug, rid in patch_ids.WITHDRAWN.items():
        assert slug not in patch_ids.numbers()
        assert patch_ids.ref(slug) == f"runtime patch {rid}"
        assert list((REPO / "upstream-notes").glob(f"{rid}-*.md")), rid
    first = next(iter(patch_ids.numbers()))
    assert (patch_ids.ref("replicate-draft-embedding", first) ==
        f"patch {patch_ids.number(first)} and runtime patch R08")


@pytest.mark.parametrize("fault", ["repeated", "withdrawn", "missing"])
def test_a_duplicate_or_bad_slug_in_the_record_is_refused(fault):
    series = json.loads((PACKAGE / "series.json").read_text())["series"]
    assert patch_ids.slug_numbers(series) == patch_ids.numbers()
    bad = [dict(e) for e in series]
    if fault == "repeated":
        bad[1]["slug"] = bad[0]["slug"]
    elif fault == "withdrawn":
        bad[1]["slug"] = "replicate-draft-embedding"
    else:
        del bad[1]["slug"]
    with pytest.raises(PatchSetError, match=rf"^vllm_kimi_ext/series.json: patch "
                                            rf"{re.escape(bad[1]['name'])}: field 'slug': "):
        patch_ids.slug_numbers(bad)


@pytest.mark.parametrize("kind", KINDS)
def test_profiles_load_with_their_patch_references_rendered(kind):
    for name in list_profiles(kind):
        assert "{patch:" not in json.dumps(load_raw(kind, name))


def test_a_profile_naming_an_unknown_slug_is_refused_by_file_and_field(tmp_path):
    bad = tmp_path / "bad.json"
    doc = json.loads((PACKAGE / "costmodel/profiles/drafts/modular-mtp.json").read_text())
    doc["project_requires"] = "this project's {patch:no-such-patch}"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match=r"bad\.json: field 'project_requires': unknown "
                                           r"patch slug 'no-such-patch'"):
        load_raw("drafts", bad)


def test_readme_status_line_example_matches_the_series():
    readme = (REPO / "README.md").read_text()
    m = re.search(r"patch series (\d{4})-(\d{4}) \((\d+) patches", readme)
    assert m, "README's example status line is gone"
    nums = list(patch_ids.numbers().values())
    assert m.groups() == (nums[0], nums[-1], str(len(nums))), (
        f"README status line says {m.group(0)!r}; the series is {nums[0]}-{nums[-1]} "
        f"({len(nums)} patches)")


def test_bench_reports_the_applied_series_as_matching_despite_slugs(monkeypatch):
    """The bench's environment record compares series and file fingerprints, not slugs."""
    from bench.harness import common
    from vllm_kimi_ext import compat

    expected = compat.expected_record()
    tree = json.loads(json.dumps(expected))
    for entry in tree["series"]:
        entry.pop("slug")
    monkeypatch.setattr(compat, "applied_record", lambda: tree)
    assert common.patch_series()["matches_package"] is True
    tree["files"] = {**tree["files"], "vllm/x.py": "0" * 64}
    assert common.patch_series()["matches_package"] is False
