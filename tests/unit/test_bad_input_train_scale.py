"""Bad values of the long-run flags of ``draft train`` (checkpoints, resume,
validation, loader workers) and of ``draft eval``'s length limit: each refused while
the arguments are read, with the flag named in one line on stderr, exit 2, no
traceback, and the data directory byte for byte as it was."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from vllm_kimi_ext.cli import main

TRAIN = ("draft", "train", "--data", "{data}", "--target", "{data}", "--out", "{out}")
CAPTURE = ("draft", "capture", "--data", "{data}", "--hf-model", "{data}")
EVAL = ("draft", "eval", "--data", "{data}", "--target", "{data}", "--draft", "{data}")

#: (id, argv after the command, the words stderr must contain)
CASES = [
    ("checkpoint-every-zero", TRAIN + ("--checkpoint-every", "0"), ("--checkpoint-every",)),
    ("checkpoint-every-negative", TRAIN + ("--checkpoint-every", "-3"), ("--checkpoint-every",)),
    ("checkpoint-every-float", TRAIN + ("--checkpoint-every", "1.5"), ("--checkpoint-every",)),
    ("checkpoint-every-word", TRAIN + ("--checkpoint-every", "often"), ("--checkpoint-every",)),
    ("val-fraction-negative", TRAIN + ("--val-fraction", "-0.1"), ("--val-fraction",)),
    ("val-fraction-above-half", TRAIN + ("--val-fraction", "0.6"), ("--val-fraction",)),
    ("val-fraction-nan", TRAIN + ("--val-fraction", "nan"), ("--val-fraction",)),
    ("val-fraction-inf", TRAIN + ("--val-fraction", "inf"), ("--val-fraction",)),
    ("val-fraction-word", TRAIN + ("--val-fraction", "some"), ("--val-fraction",)),
    ("val-every-zero", TRAIN + ("--val-fraction", "0.1", "--val-every", "0"), ("--val-every",)),
    ("patience-zero", TRAIN + ("--val-fraction", "0.1", "--patience", "0"), ("--patience",)),
    ("patience-negative", TRAIN + ("--val-fraction", "0.1", "--patience", "-1"),
     ("--patience",)),
    ("patience-without-validation", TRAIN + ("--patience", "2"),
     ("--patience", "--val-fraction")),
    ("val-every-without-validation", TRAIN + ("--val-every", "5"),
     ("--val-every", "--val-fraction")),
    ("checkpoint-dir-without-checkpoints", TRAIN + ("--checkpoint-dir", "{data}/ck"),
     ("--checkpoint-dir", "--checkpoint-every")),
    ("checkpoint-dir-is-a-file", TRAIN + ("--checkpoint-every", "5", "--checkpoint-dir",
                                          "{data}/samples.jsonl"),
     ("--checkpoint-dir", "samples.jsonl", "folder")),
    ("loader-workers-negative", TRAIN + ("--loader-workers", "-1"), ("--loader-workers",)),
    ("loader-workers-huge", TRAIN + ("--loader-workers", "1000"), ("--loader-workers",)),
    ("shard-no-slash", CAPTURE + ("--shard", "1"), ("--shard", "I/N")),
    ("shard-index-equals-count", CAPTURE + ("--shard", "2/2"), ("--shard", "0 <= I < N")),
    ("shard-negative", CAPTURE + ("--shard", "-1/2"), ("--shard",)),
    ("shard-zero-count", CAPTURE + ("--shard", "0/0"), ("--shard",)),
    ("shard-words", CAPTURE + ("--shard", "a/b"), ("--shard",)),
    ("eval-max-len-zero", EVAL + ("--max-len", "0"), ("--max-len",)),
    ("eval-max-len-word", EVAL + ("--max-len", "long"), ("--max-len",)),
    ("eval-device-unknown", EVAL + ("--device", "gpu0"), ("--device", "cuda:N")),
    ("eval-device-index-word", EVAL + ("--device", "cuda:x"), ("--device",)),
]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_refused_with_the_flag_named(case, tmp_path):
    _, argv, words = case
    data = tmp_path / "data"
    data.mkdir()
    (data / "samples.jsonl").write_text('{"index": 0}\n')
    before = _snapshot(tmp_path)
    filled = [a.format(data=data, out=tmp_path / "out") for a in argv]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(filled)
    text = err.getvalue()
    assert code == 2, text
    assert "Traceback" not in text + out.getvalue()
    error_lines = [line for line in text.splitlines() if "error" in line]
    assert error_lines, text
    for word in words:
        assert word in error_lines[-1], f"{word!r} missing: {text}"
    assert _snapshot(tmp_path) == before
    assert not (tmp_path / "out").exists()
