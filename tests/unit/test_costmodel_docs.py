"""The committed docs generated from the cost model are up to date, and say it is a model."""

from __future__ import annotations

import shutil
from pathlib import Path

from vllm_kimi_ext.costmodel.report import (
    IMG,
    generated_docs,
    main,
    markdown_report,
    write_docs,
)

DOCS = Path(__file__).resolve().parents[2] / "docs"
IMAGES = ("costmodel-validation.png", "costmodel-latency.png", "costmodel-levers.png")


def test_committed_docs_are_up_to_date(tmp_path):
    # regenerate from a copy of the hand-written parts and compare with what is committed
    shutil.copy(DOCS / "cost-model.md", tmp_path / "cost-model.md")
    shutil.copy(DOCS / "choosing-a-draft.md", tmp_path / "choosing-a-draft.md")
    write_docs(tmp_path, images=False)
    for name in ("what-to-run.md", "cost-model.md", "choosing-a-draft.md"):
        assert (tmp_path / name).read_text() == (DOCS / name).read_text(), (
            f"docs/{name} is stale: run python -m vllm_kimi_ext.costmodel.report "
            "--write-docs docs/")
    assert {p.name for p in generated_docs(DOCS)} == {"what-to-run.md", "cost-model.md",
                                                      "choosing-a-draft.md"}
    for name in IMAGES:  # written by --write-docs, linked from the docs
        assert (DOCS / IMG / name).read_bytes().startswith(b"\x89PNG")
        assert (f"{IMG}/{name}" in (DOCS / "cost-model.md").read_text() +
            (DOCS / "what-to-run.md").read_text())


def test_what_to_run_carries_the_caveat_and_the_ranking():
    text = (DOCS / "what-to-run.md").read_text()
    assert text.startswith("# What to run on 8x PCIe")
    assert "A forecast ranked by evidence, not a measurement of your box" in text
    assert text.index("## What-if") < text.index("## Ranking")
    assert "upper bound, no setting" in text and "What you can set or install today" in text
    assert "UNEXPLAINED" not in (DOCS / "cost-model.md").read_text()


def test_check_docs_exit_codes(tmp_path):
    shutil.copy(DOCS / "cost-model.md", tmp_path / "cost-model.md")
    assert main(["--check-docs", str(tmp_path)]) == 1  # nothing generated yet
    write_docs(tmp_path, images=False)
    assert main(["--check-docs", str(tmp_path)]) == 0


def test_markdown_report_for_the_bench_session(tmp_path):
    text = markdown_report(tmp_path, name="plan")
    assert "**What to run**" in text and "![tokens/s" in text
    assert "**Why this configuration**" in text and "## Every draft, ranked by evidence" in text
    assert (tmp_path / "plan.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "plan.md").read_text() == text
    other = markdown_report(tmp_path, drafts=["lightseek-eagle3"], name="other")
    assert "**Recommendation**" in other and "**What to run**" not in other


def test_write_docs_names_the_hand_written_documents_it_skips(tmp_path, capsys, monkeypatch):
    """A docs folder without cost-model.md / choosing-a-draft.md: what-to-run.md is written
    and each missing host document is named on stderr (it used to be skipped silently)."""
    import vllm_kimi_ext.costmodel.report as report

    monkeypatch.setattr(report, "write_images", lambda d: [])
    shutil.copy(DOCS / "choosing-a-draft.md", tmp_path / "choosing-a-draft.md")
    assert main(["--write-docs", str(tmp_path)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"skipped: {tmp_path / 'cost-model.md'} does not exist (its generated "
                   "blocks live inside a hand-written document; copy it from the "
                   "repository's docs/ first)"]
    assert (tmp_path / "what-to-run.md").is_file()
    assert not (tmp_path / "cost-model.md").exists()


COSTMODEL = Path(__file__).resolve().parents[2] / "vllm_kimi_ext" / "costmodel"
#: What prints the answer: defined in costmodel/answer_text.py and nowhere else.
ANSWER_RENDERERS = ("headline_markdown", "answer_line", "format_answer", "answer_dict",
                    "readme_section", "expected_line", "drafts_section", "interval_text")


def _module_facts(path: Path) -> tuple[set[str], set[str]]:
    """(imported modules, top-level function names) of one source file."""
    import ast

    tree = ast.parse(path.read_text())
    imports, defs = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            imports.add(node.module)
        elif isinstance(node, ast.Import):
            imports.update(a.name for a in node.names)
    defs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    return imports, defs


def test_the_answer_is_printed_from_one_module_and_no_docs_module_imports_a_cli():
    """Planted: ``format_answer`` copied back into tables.py, or report.py importing
    ``vllm_kimi_ext.cli.run_handler`` again -> this fails naming the file."""
    for path in sorted(COSTMODEL.glob("*.py")):
        imports, defs = _module_facts(path)
        if path.name != "answer_text.py":
            assert not defs & set(ANSWER_RENDERERS), (path.name, defs & set(ANSWER_RENDERERS))
        if path.name in ("report.py", "what_to_run.py", "cost_model_doc.py", "answer_text.py",
                         "headline.py", "markdown.py", "interval.py", "evidence.py"):
            assert not {"vllm_kimi_ext.cli", "vllm_kimi_ext.costmodel.cli"} & imports, path.name
    _, defs = _module_facts(COSTMODEL / "answer_text.py")
    assert set(ANSWER_RENDERERS) <= defs
    for path in COSTMODEL.glob("*.py"):
        if path.name != "verify_cost.py":  # split by the architecture work, not here
            assert len(path.read_text().splitlines()) <= 650, path.name
