"""Every bad input a user can pass is refused with a named reason, never a traceback.

The cases are a table (``testkit.bad_input_cases``, one list per tool):
each builds its inputs, runs the command in-process through ``vllm_kimi_ext.cli.main``
and must exit with the contract's code (0 clean, 1 findings, 2 usage / unreadable
input), print the listed words, report the listed doctor codes, leave no partial
output, and print no traceback unless it asked for one with ``--debug``.

The doctor's finding codes are checked both ways: every code in its table has a case
that triggers it, every code the source can report is in the table, and the man page
(docs/doctor.md) carries the table as generated.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import vllm_kimi_ext
from testkit.bad_input import Bases, Workspace, run_case
from testkit.bad_input_cases import ALL_CASES, CASES_BY_TOOL
from vllm_kimi_ext.drafts.doctor import codes as doctor_codes

REPO = Path(vllm_kimi_ext.__file__).parent.parent


@pytest.fixture(scope="session")
def bases(tmp_path_factory) -> Bases:
    return Bases(tmp_path_factory.mktemp("bad-input-bases"))


@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id for c in ALL_CASES])
def test_bad_input(case, bases, tmp_path, monkeypatch):
    ws = Workspace(tmp_path, bases, monkeypatch)
    result = run_case(case, ws)
    shown = f"argv {result.argv}\n--- stdout\n{result.out}\n--- stderr\n{result.err}"
    assert result.code == case.code, shown
    for word in case.words:
        assert word in result.text, f"{word!r} missing\n{shown}"
    if "--debug" not in result.argv:
        assert "Traceback" not in result.text, shown
    if case.code == 2:  # no verdict: the reason is one "<prog>: error: ..." line on stderr
        assert any(": error: " in line or ": internal error: " in line
                   for line in result.err.splitlines()), f"no error line on stderr\n{shown}"
    if case.codes:
        report = json.loads(result.out)
        got = {f["code"] for f in report["findings"]}
        assert set(case.codes) <= got, f"codes {sorted(got)}\n{shown}"
    for name in case.absent:
        assert not Path(result.paths[name]).exists(), f"{name} was written\n{shown}"
    leftovers = [p for p in tmp_path.rglob("*") if ".shrink-vocab-" in p.name]
    assert leftovers == [], leftovers


def test_the_table_has_at_least_100_cases_with_unique_ids():
    ids = [c.id for c in ALL_CASES]
    assert len(ids) >= 100, len(ids)
    assert len(set(ids)) == len(ids), sorted(i for i in ids if ids.count(i) > 1)
    for tool, cases in CASES_BY_TOOL.items():
        assert all(c.tool == tool for c in cases), tool
    for tool in ("cli", "doctor", "tokenizer-check", "tli-check", "shrink-vocab"):
        assert len(CASES_BY_TOOL[tool]) >= 10, tool


def test_every_doctor_code_has_a_triggering_case():
    triggered = {code for c in CASES_BY_TOOL["doctor"] for code in c.codes}
    table = {c.code for c in doctor_codes.FINDING_CODES}
    assert table - triggered == set(), "codes without a case in bad_input_cases"
    assert triggered - table == set(), "cases expecting codes the table lacks"


def _codes_in_source() -> set[str]:
    """Every string literal passed as the first argument of ``finding(...)`` or
    ``Finding(...)``, or used as a value of a code map, in vllm_kimi_ext/drafts/ and
    vllm_kimi_ext/checkpoints/."""
    found: set[str] = set()
    for path in [*(REPO / "vllm_kimi_ext" / "drafts").rglob("*.py"),
                 *(REPO / "vllm_kimi_ext" / "checkpoints").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
                    "finding", "Finding") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.add(arg.value)
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and node.value[:2] in ("E-", "W-") and node.value.isupper()):
                found.add(node.value)
    return found


def test_every_code_in_the_source_is_in_the_table():
    source = _codes_in_source()
    table = {c.code for c in doctor_codes.FINDING_CODES}
    assert source, "found no codes: the scan is broken"
    assert source - table == set()
    assert len(table) == len(doctor_codes.FINDING_CODES)  # no code listed twice
    assert all(c.severity in ("error", "warning") for c in doctor_codes.FINDING_CODES)


def test_doctor_man_page_lists_every_code_as_generated(tmp_path):
    page = (REPO / "docs" / doctor_codes.DOC_FILE).read_text()
    assert doctor_codes.main(["--check-docs", str(REPO / "docs")]) == 0, (
        "docs/doctor.md is stale: python -m vllm_kimi_ext.drafts.doctor.codes --write-docs docs")
    for c in doctor_codes.FINDING_CODES:
        assert f"| `{c.code}` | {c.severity} |" in page
    # a stale copy is named, and --write-docs repairs it
    (tmp_path / doctor_codes.DOC_FILE).write_text(page.replace("| `E-D2T-DUPLICATE` |", "| x |"))
    assert doctor_codes.main(["--check-docs", str(tmp_path)]) == 1
    doctor_codes.main(["--write-docs", str(tmp_path)])
    assert (tmp_path / doctor_codes.DOC_FILE).read_text() == page
