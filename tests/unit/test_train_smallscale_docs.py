"""The small-scale tables of ``docs/training-a-draft.md`` are the committed run's JSON:
every held-out and train-set row of the document carries that run's chains, α and τ,
every training row its steps and tokens, and a hand edit of any of them is reported
stale by the generator's ``--check-docs``."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from pathlib import Path

import pytest

from bench.harness import smallscale_docs as gen

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / gen.DOC


def _block(name: str) -> list[str]:
    text = DOC.read_text()
    begin = text.index(f"<!-- BEGIN GENERATED: {name} ")
    end = text.index(f"<!-- END GENERATED: {name} -->")
    return [ln for ln in text[begin:end].splitlines()[1:] if ln.startswith("| ")][1:]


def _cells(line: str) -> list[str]:
    return [c.strip().strip("*") for c in line.strip("|").split("|")]


@pytest.mark.parametrize("block, key", [("smallscale-heldout", "results"),
                                        ("smallscale-train-set", "train_set_results")])
def test_acceptance_rows_are_the_runs(block, key):
    results = json.loads(gen.RESULTS.read_text())[key]
    rows = [_cells(ln) for ln in _block(block)]
    expected = [(gen.HEADS[h], src, r) for h, by in results.items() for src, r in by.items()]
    assert len(rows) == len(expected)
    for cells, (head, source, r) in zip(rows, expected):
        assert cells[0] == head and cells[1] == source
        assert int(cells[2]) == r["chains"]
        assert [float(x) for x in cells[3:6]] == pytest.approx(r["alpha"], abs=5e-4)
        assert float(cells[6]) == pytest.approx(r["tau"], abs=5e-4)
        assert float(cells[7]) == pytest.approx(r["greedy_draft_tau"], abs=5e-4)
        assert float(cells[8]) == pytest.approx(r["greedy_tau"], abs=5e-4)


def test_training_and_set_rows_are_the_runs():
    summary = json.loads(gen.RESULTS.read_text())
    rows = [_cells(ln) for ln in _block("smallscale-training")]
    assert [(c[0], int(c[2]), int(c[3])) for c in rows] == [
        (gen.HEADS[h], t["steps"], t["tokens"]) for h, t in summary["training"].items()]
    sets = [_cells(ln) for ln in _block("smallscale-sets")]
    assert [(int(c[1]), int(c[3]), int(c[4])) for c in sets] == [
        (d["samples"], d["prompt_tokens"], d["response_tokens"])
        for d in summary["data"].values()]


def test_a_hand_edited_number_is_stale(tmp_path):
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    doc = tmp_path / "docs" / gen.DOC
    text = doc.read_text()
    line = _block("smallscale-heldout")[0]
    edited = re.sub(r"\| (\d+) \|", lambda m: f"| {int(m[1]) + 8} |", line, count=1)
    assert edited != line
    doc.write_text(text.replace(line, edited, 1))
    with contextlib.redirect_stderr(io.StringIO()) as err:
        assert gen.main(["--check-docs", str(tmp_path / "docs")]) == 1
    assert "stale" in err.getvalue()
    assert gen.main(["--write-docs", str(tmp_path / "docs")]) == 0
    assert doc.read_text() == text
