"""The README section "What to run on 8x PCIe" is generated and up to date."""

from __future__ import annotations

from pathlib import Path

from bench.harness import readme as R

ROOT = Path(__file__).resolve().parents[2]


def test_readme_section_is_up_to_date():
    text = (ROOT / "README.md").read_text()
    docs = (ROOT / "docs" / "what-to-run.md").read_text()
    assert R.current_section(text) == R.readme_section(docs), (
        "README section is stale: run python -m bench.harness.readme --write-docs .")


def test_section_says_it_is_a_model_and_sits_before_layout():
    text = (ROOT / "README.md").read_text()
    section = R.current_section(text)
    assert "A model until the real box confirms it" in section
    assert "```bash" in section and "vllm serve" in section
    assert text.index(R.HEADING) < text.index(R.INSERT_BEFORE)


def test_insert_and_replace_are_idempotent():
    docs = (ROOT / "docs" / "what-to-run.md").read_text()
    bare = "# X\n\n## Tests\n\nt\n\n## Layout\n\nl\n"
    once = R.updated_readme(bare, docs)
    assert once.index(R.HEADING) < once.index("## Layout") and "## Tests\n\nt\n" in once
    assert R.updated_readme(once, docs) == once


def test_cli_checks_a_tree_and_names_what_it_cannot_read(tmp_path, capsys):
    assert R.main(["--check-docs", str(ROOT)]) == 0
    assert R.main(["--check-docs", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"{tmp_path / 'README.md'}: cannot read (No such file or directory)"
