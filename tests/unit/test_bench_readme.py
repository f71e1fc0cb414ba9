"""The README doc generator (``python -m bench.harness.readme``) follows the docs convention."""

from __future__ import annotations

from pathlib import Path

from bench.harness import readme as R
from vllm_kimi_ext.costmodel.answer_text import README_HEADING, readme_section

ROOT = Path(__file__).resolve().parents[2]


def test_check_passes_on_the_repository_and_fails_on_a_stale_copy(tmp_path, capsys):
    assert R.main(["--check-docs", str(ROOT)]) == 0
    text = (ROOT / "README.md").read_text()
    stale = text.replace(readme_section(), README_HEADING + "\n\nold text\n\n", 1)
    assert stale != text
    (tmp_path / "README.md").write_text(stale)
    assert R.main(["--check-docs", str(tmp_path)]) == 1
    assert "stale" in capsys.readouterr().err
    assert R.main(["--write-docs", str(tmp_path)]) == 0
    assert (tmp_path / "README.md").read_text() == text


def test_cli_names_what_it_cannot_read(tmp_path, capsys):
    assert R.main(["--check-docs", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"{tmp_path / 'README.md'}: cannot read (No such file or directory)"
    (tmp_path / "README.md").write_text("# no section\n")
    assert R.main(["--check-docs", str(tmp_path)]) == 2
    assert "has no" in capsys.readouterr().err
