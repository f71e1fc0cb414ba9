"""Every generated document is committed up to date, and every generator follows one
convention (``--write-docs DIR`` / ``--check-docs DIR``); the list of generators is
``bench/harness/generated_docs.py`` (``nox -s docs`` runs it)."""

from __future__ import annotations

import importlib
import re
import shutil
from pathlib import Path

import pytest

from bench.harness.generated_docs import GENERATORS, documents, stale_documents

REPO = Path(__file__).resolve().parents[2]


def test_committed_documents_are_up_to_date(tmp_path):
    stale = stale_documents(REPO, tmp_path)
    assert stale == [], f"stale generated documents {stale}: run nox -s docs"
    assert set(documents()) == {"README.md", "docs/what-to-run.md", "docs/cost-model.md",
                                "docs/choosing-a-draft.md", "docs/collectives-per-token.md",
                                "docs/doctor.md", "docs/training-a-draft.md",
                                "docs/sharded-verification.md"}


def _stale_copy(tmp_path: Path) -> Path:
    """The committed documents with one generated line changed in each (the planted bug)."""
    root = tmp_path / "repo"
    for rel in documents():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, root / rel)
    edits = {
        "README.md": (r"Expected \*\*(\d+) tok/s", "Expected **1 tok/s"),
        "docs/what-to-run.md": (r"\n$", "\nA hand edit.\n"),
        # the answer block of choosing-a-draft.md (once told users DFlash at k = 7)
        "docs/choosing-a-draft.md": (r"\*\*k = (\d+)\*\*", "**k = 7**"),
        "docs/collectives-per-token.md": (r"\| 3 \| 3\.20 \|", "| 3 | 3.21 |"),
        # a line inside cost-model.md's generated anatomy block
        "docs/cost-model.md": (r"\| part \| GB per GPU \| how \|", "| part | GB | how |"),
        # a row of the generated finding-code table
        "docs/doctor.md": (r"\| `E-CONFIG-MISSING` \| error \|",
                           "| `E-CONFIG-MISSING` | warning |"),
        # a bytes cell of the histogram escalation's price table (it went stale twice when a
        # new verify report changed the prices: nothing regenerated it then)
        "docs/sharded-verification.md": (r"\| 16 \| 40,960 \| [\d,]+ \|", "| 16 | 40,960 | 1 |"),
        # the bill example's regeneration line (the doc once said 193.0 h, the tool 177.6 h)
        "docs/training-a-draft.md": (r"regenerate: (\S+) tokens at \d+ tok/s = [\d.]+ h",
                                     r"regenerate: \1 tokens at 863 tok/s = 193.0 h"),
    }
    for rel, (pattern, repl) in edits.items():
        text = (root / rel).read_text()
        new, n = re.subn(pattern, repl, text, count=1)
        assert n == 1, f"{rel}: the planted edit {pattern!r} no longer matches"
        (root / rel).write_text(new)
    # a second generator of cost-model.md (vllm_kimi_ext.costmodel.verify_report): a line of
    # its own generated block, so its --check-docs sees a stale copy too
    path = root / "docs/cost-model.md"
    text, n = re.subn(r"\| batch \| verified rows \|", "| batch | rows |", path.read_text(),
                      count=1)
    assert n == 1, "docs/cost-model.md: the planted verify-block edit no longer matches"
    path.write_text(text)
    # a second generator of training-a-draft.md (bench.harness.smallscale_docs): one
    # chain count of its held-out table
    path = root / "docs/training-a-draft.md"
    text, n = re.subn(r"\| untrained \| gsm8k \| (\d+) \|", "| untrained | gsm8k | 504 |",
                      path.read_text(), count=1)
    assert n == 1, "docs/training-a-draft.md: the planted small-scale edit no longer matches"
    path.write_text(text)
    return root


def test_a_stale_document_is_named(tmp_path):
    root = _stale_copy(tmp_path)
    assert sorted(stale_documents(root, tmp_path / "scratch")) == sorted(documents())


def test_hand_written_parts_are_not_stale(tmp_path):
    root = tmp_path / "repo"
    for rel in documents():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, root / rel)
    for rel in ("README.md", "docs/cost-model.md", "docs/choosing-a-draft.md"):
        # outside every generated part
        (root / rel).write_text((root / rel).read_text() + "\nA hand-written line.\n")
    assert stale_documents(root, tmp_path / "scratch") == []


@pytest.mark.parametrize("gen", GENERATORS, ids=lambda g: g.module)
def test_every_generator_checks_with_check_docs(gen, tmp_path):
    main = importlib.import_module(gen.module).main
    assert main(gen.command(REPO, check=True)[2:]) == 0
    assert main(gen.command(_stale_copy(tmp_path), check=True)[2:]) == 1
