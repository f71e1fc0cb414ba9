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
        assert f"{IMG}/{name}" in (DOCS / "cost-model.md").read_text() + \
            (DOCS / "what-to-run.md").read_text()


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
