"""``bench/kernels/profile_folded.py``: its table of bad inputs (exit 2, one line naming the
argument, no traceback, nothing written) and its dry run (CPU, torch backend) with both kernel
variants side by side: the same tokens from the merge of sorted runs / send by bisection and
from the full sort / top-k, for both escalations.

The kernels themselves are checked in Triton's interpreter (``test_verify_merge_runs.py``,
``test_verify_folded_counts.py``) and on a GPU (``tests/gpu``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location(
        "profile_folded_cli", ROOT / "bench" / "kernels" / "profile_folded.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["profile_folded_cli"] = mod
    spec.loader.exec_module(mod)
    return mod


PF = _load()


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("rows") / "rows.pt"
    g = torch.Generator().manual_seed(0)
    torch.save({"logits_bf16": (torch.randn(32, 2048, generator=g) * 2).to(torch.bfloat16),
                "source": "test rows"}, p)
    return p


def _files(tmp_path: Path) -> dict[str, Path]:
    text = tmp_path / "rows.txt"
    text.write_text("not a tensor\n")
    flat = tmp_path / "flat.pt"
    torch.save(torch.zeros(2048, dtype=torch.bfloat16), flat)
    few = tmp_path / "few.pt"
    torch.save(torch.zeros(4, 2048, dtype=torch.bfloat16), few)
    return {"text": text, "flat": flat, "few": few, "missing": tmp_path / "nope.pt"}


BAD = [
    (["--logits", "{missing}"], ["--logits", "no such file"]),
    (["--logits", "{text}", "--dry-run"], ["--logits", "not a logits rows file"]),
    (["--logits", "{flat}", "--dry-run"], ["--logits", "expected [rows >= 16, vocab]"]),
    (["--logits", "{few}", "--dry-run"], ["--logits", "expected [rows >= 16, vocab]"]),
    (["--logits", "{rows}", "--steps", "0"], ["--steps"]),
    (["--logits", "{rows}", "--steps", "1001"], ["--steps", "at most 1000"]),
    (["--logits", "{rows}", "--warmup", "x"], ["--warmup"]),
    (["--logits", "{rows}", "--kernels", "fast"], ["--kernels", "invalid choice"]),
    (["--logits", "{rows}", "--bogus"], ["unrecognized arguments", "--bogus"]),
]


@pytest.mark.parametrize("argv,words", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_exit_2(argv, words, tmp_path, rows_file, capsys):
    files = {k: str(v) for k, v in _files(tmp_path).items()} | {"rows": str(rows_file)}
    before = {p: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    with pytest.raises(SystemExit) as e:
        rc = PF.main([a.format(**files) for a in argv])
        raise SystemExit(rc)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2, err
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    for w in words:
        assert w.lower() in last.lower(), (w, err)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before


def test_dry_run_both_kernel_variants_same_tokens(rows_file, capsys):
    rc = PF.main(["--dry-run", "--logits", str(rows_file), "--steps", "1", "--warmup", "1",
                  "--top", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    for esc in ("folded", "rows"):
        assert f"{esc}: same tokens with new and old kernels: True" in out
        for kern in ("new", "old"):
            assert f"== escalation {esc!r}, {kern} kernels" in out
    assert "TOTAL per step, new kernels: folded" in out
    assert "TOTAL per step, old kernels: folded" in out
