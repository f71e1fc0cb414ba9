"""``shrink_vocab``: a full-vocabulary EAGLE-3 head reduced to a frequent-token vocabulary.

A fake tokenizer maps each whitespace-separated word to a known id (``t<N>`` is id
N, named special tokens have fixed ids), so every count, the kept set and the
coverage figures below are computed by hand from the constructed corpora.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from testkit.checkpoints import TinyEagle3Spec, TinyKimiSpec, write_tiny_eagle3
from vllm_kimi_ext.drafts.shrink_vocab import shrink as sv
from vllm_kimi_ext.drafts.shrink_vocab.shrink import ShrinkVocabError, shrink_vocab

TARGET = TinyKimiSpec(num_ranks=1024)
VOCAB = TARGET.vocab_size  # 1280: bos 1024, eos 1025, pad 1279 in the head's config

SPECIAL = {"<bos>": 1024, "<eos>": 1025, "<pad>": 1279}
ADDED = {**SPECIAL, "<|user|>": 1026, "<|end|>": 1027, "<think>": 1046, "<|unused|>": 1100}
WORDS = {"assistant:": 900}  # template literal text, never in the corpora
TEMPLATE = ("{% for m in messages %}<|user|>{{ m['content'] }}<|end|>{% endfor %}"
            "{{ '<think>' }}assistant:")
# forced: specials + added + template ("<|user|>", "<|end|>", "<think>", "assistant:")
FORCED = {1024, 1025, 1279, 1026, 1027, 1046, 1100, 900}


class FakeTokenizer:
    def __init__(self, n: int = VOCAB, template: str | None = TEMPLATE):
        self._n = n
        self.all_special_ids = sorted(SPECIAL.values())
        self.added_tokens_decoder = {i: s for s, i in ADDED.items()}
        self.chat_template = template
        self.bos_token_id, self.eos_token_id, self.pad_token_id = 1024, 1025, 1279

    def encode(self, text: str) -> list[int]:
        out = []
        for word in text.split():
            if word in ADDED:
                out.append(ADDED[word])
            elif word in WORDS:
                out.append(WORDS[word])
            else:
                assert word[0] == "t", word
                out.append(int(word[1:]))
        return out

    def __len__(self) -> int:
        return self._n


@pytest.fixture
def head(tmp_path) -> Path:
    path = tmp_path / "head"
    write_tiny_eagle3(path, TARGET, TinyEagle3Spec(style="llama"))
    (path / "generation_config.json").write_text('{"max_new_tokens": 8}\n')
    return path


@pytest.fixture
def corpora(tmp_path) -> list[Path]:
    a = tmp_path / "a.jsonl"
    a.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "t5 t5 t5 t7 <|user|>"},   # default field "prompt"
        {"text": "t7 t9 t9"},                  # falls back to "text"
        {"turns": ["t5 t11", "t3"]},           # list of strings
        {"other": "t1"},                       # no usable field: skipped
    ]) + "\n")
    b = tmp_path / "b.txt.gz"
    with gzip.open(b, "wt") as fh:
        fh.write("t9 t12 t13\n\nt12 t2 t4 t6 t8\n")
    return [a, b]


# counts: t5 4, t9 3, t7 2, t12 2, t2/t3/t4/t6/t8/t11/t13 1, <|user|> 1
SIZE = 14  # 8 forced + 6 by frequency: 5, 9, then 7 and 12 (tie), then 2 and 3 (tie)
EXPECTED_KEPT = sorted(FORCED | {5, 9, 7, 12, 2, 3})


def test_round_trip(head, corpora, tmp_path):
    out = tmp_path / "out"
    report = shrink_vocab(head, FakeTokenizer(), corpora, SIZE, out)

    assert report.kept_ids == EXPECTED_KEPT
    assert (report.size, report.vocab_size) == (SIZE, VOCAB)
    assert report.num_forced == 8 and report.num_by_frequency == 6
    assert report.num_forced_unseen == 7  # only <|user|> occurs in the corpora
    a, b = report.corpora
    # a: 5 + 3 + 3 tokens, only t11 not kept; 1 skipped record
    assert (a.records, a.skipped_records, a.tokens, a.covered_tokens) == (3, 1, 11, 10)
    # b: 3 + 5 tokens, t9 t12 t12 t2 kept, t13 t4 t6 t8 not
    assert (b.records, b.skipped_records, b.tokens, b.covered_tokens) == (2, 0, 8, 4)
    assert a.coverage == pytest.approx(10 / 11) and b.coverage == pytest.approx(0.5)
    assert (report.tokens, report.covered_tokens) == (19, 14)
    assert report.coverage == pytest.approx(14 / 19)

    # weights
    src = load_file(head / "model.safetensors")
    dst = load_file(out / "model.safetensors")
    kept = torch.tensor(EXPECTED_KEPT)
    assert dst["lm_head.weight"].shape == (SIZE, TARGET.hidden_size)
    assert torch.equal(dst["lm_head.weight"], src["lm_head.weight"][kept])
    assert dst["d2t"].dtype == torch.int64 and dst["t2d"].dtype == torch.bool
    assert torch.equal(dst["d2t"] + torch.arange(SIZE), kept)
    assert dst["t2d"].shape == (VOCAB,)
    assert torch.equal(torch.nonzero(dst["t2d"]).flatten(), kept)
    for name, tensor in src.items():
        if name != "lm_head.weight":
            assert torch.equal(dst[name], tensor), name
    assert set(dst) == set(src) | {"d2t", "t2d"}

    # config and other files
    cfg_in = json.loads((head / "config.json").read_text())
    cfg_out = json.loads((out / "config.json").read_text())
    assert cfg_out == {**cfg_in, "draft_vocab_size": SIZE}
    assert (out / "generation_config.json").read_text() == '{"max_new_tokens": 8}\n'
    cov = json.loads((out / "coverage.json").read_text())
    assert cov["size"] == SIZE and cov["num_forced"] == 8
    assert cov["overall"] == {"tokens": 19, "covered_tokens": 14, "coverage": 14 / 19}
    assert [c["covered_tokens"] for c in cov["corpora"]] == [10, 4]
    md = (out / "coverage.md").read_text()
    assert "73.68%" in md and "90.91%" in md and "50.00%" in md
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_output_passes_doctor(head, corpora, tmp_path):
    from testkit.checkpoints import write_tiny_deepseek_v3
    from vllm_kimi_ext.drafts.doctor.diagnosis import diagnose

    target = tmp_path / "target"
    write_tiny_deepseek_v3(target, TARGET)
    shrink_vocab(head, FakeTokenizer(), corpora, SIZE, tmp_path / "out")
    report = diagnose(target, tmp_path / "out", method="eagle3")
    assert report.errors == [], report.format_text()


def test_field_and_whole_file_text(head, tmp_path):
    c = tmp_path / "c.jsonl"
    c.write_text(json.dumps({"q": "t40 t40 t41", "prompt": "t1"}) + "\n")
    d = tmp_path / "d.txt"
    d.write_text("t50\nt50 t50\n")
    report = shrink_vocab(head, FakeTokenizer(), [c, d], 11, tmp_path / "out", field="q",
                          text_unit="file")
    assert report.kept_ids == sorted(FORCED | {50, 40, 41})
    assert [(x.records, x.tokens) for x in report.corpora] == [(1, 3), (1, 3)]


def test_forced_tokens_without_template(head, corpora, tmp_path):
    report = shrink_vocab(head, FakeTokenizer(template=None), corpora, SIZE, tmp_path / "o")
    assert report.num_forced == 7  # "assistant:" no longer forced: one more frequent id
    assert report.kept_ids == sorted((FORCED - {900}) | {5, 9, 7, 12, 2, 3, 4})


def _refused(match: str, *args, **kwargs):
    with pytest.raises(ShrinkVocabError, match=match):
        shrink_vocab(*args, **kwargs)


def _edit_config(head: Path, **changes):
    cfg = json.loads((head / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (head / "config.json").write_text(json.dumps(cfg))


def test_refuses_non_eagle3(head, corpora, tmp_path):
    out = tmp_path / "out"
    _edit_config(head, architectures=["LlamaForCausalLM"])
    _refused(r"not an EAGLE-3 head: architectures \['LlamaForCausalLM'\] contain no 'Eagle3'",
             head, FakeTokenizer(), corpora, SIZE, out)
    _edit_config(head, architectures=["LlamaForCausalLMEagle3"])
    tensors = load_file(head / "model.safetensors")
    del tensors["fc.weight"]
    save_file(tensors, head / "model.safetensors")
    _refused("not an EAGLE-3 head: no fc.weight", head, FakeTokenizer(), corpora, SIZE, out)
    assert not out.exists()


@pytest.mark.parametrize("with_d2t,match", [
    (True, r"already reduced \(has d2t and t2d\)"),
    (False, "already reduced .*draft_vocab_size 512 < vocab_size 1280"),
])
def test_refuses_reduced_head(tmp_path, corpora, with_d2t, match):
    head = tmp_path / "reduced"
    write_tiny_eagle3(head, TARGET, TinyEagle3Spec(draft_vocab_size=512, with_d2t=with_d2t))
    _refused(match, head, FakeTokenizer(), corpora, SIZE, tmp_path / "out")


def test_refuses_lm_head_rows_mismatch(head, corpora, tmp_path):
    _edit_config(head, vocab_size=1300, draft_vocab_size=None)  # absent = full vocab
    _refused("lm_head.weight has 1280 rows .* config vocab_size is 1300",
             head, FakeTokenizer(1300), corpora, SIZE, tmp_path / "out")


def test_refuses_tokenizer_size_mismatch(head, corpora, tmp_path):
    _refused(r"tokenizer has 1000 tokens \(len\(tokenizer\)\) but the head's vocab_size is 1280",
             head, FakeTokenizer(1000), corpora, SIZE, tmp_path / "out")


@pytest.mark.parametrize("size", [1280, 5000, 0])
def test_refuses_bad_size(head, corpora, tmp_path, size):
    _refused(f"smaller than the head's vocab_size 1280, got {size}",
             head, FakeTokenizer(), corpora, size, tmp_path / "out")


def test_refuses_size_below_forced(head, corpora, tmp_path):
    _refused("8 special/chat-template tokens must be kept but --size is 4",
             head, FakeTokenizer(), corpora, 4, tmp_path / "out")


def test_refuses_empty_corpus(head, tmp_path):
    out = tmp_path / "out"
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    _refused("empty corpus: .*empty.txt has no records", head, FakeTokenizer(), [empty], 20, out)
    nofield = tmp_path / "nofield.jsonl"
    nofield.write_text('{"x": "t1"}\n')
    _refused("empty corpus: .*nofield.jsonl has no usable records .*prompt, text, question",
             head, FakeTokenizer(), [nofield], 20, out)
    _refused("empty corpus: .*field 'body'", head, FakeTokenizer(), [nofield], 20, out,
             field="body")
    blank = tmp_path / "blank.jsonl"
    blank.write_text('{"prompt": ""}\n')
    _refused("empty corpus: the corpora tokenize to 0 tokens", head, FakeTokenizer(), [blank],
             20, out)
    _refused("empty corpus: no corpus file given", head, FakeTokenizer(), [], 20, out)
    _refused("does not exist", head, FakeTokenizer(), [tmp_path / "missing.txt"], 20, out)
    assert not out.exists()


def test_existing_output_needs_force(head, corpora, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    _refused("exists \\(use --force", head, FakeTokenizer(), corpora, SIZE, out)
    assert (out / "stale.txt").exists()
    shrink_vocab(head, FakeTokenizer(), corpora, SIZE, out, force=True)
    assert not (out / "stale.txt").exists()
    assert json.loads((out / "config.json").read_text())["draft_vocab_size"] == SIZE
    _refused("is the input head", head, FakeTokenizer(), corpora, SIZE, head, force=True)


def test_failure_leaves_no_output(head, corpora, tmp_path, monkeypatch):
    def boom(*_):
        raise RuntimeError("disk full")

    monkeypatch.setattr(sv, "_write_coverage", boom)  # the last write before the rename
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="disk full"):
        shrink_vocab(head, FakeTokenizer(), corpora, SIZE, out)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    # under --force the previous output survives a failed run untouched
    out.mkdir()
    (out / "keep.txt").write_text("previous")
    with pytest.raises(RuntimeError, match="disk full"):
        shrink_vocab(head, FakeTokenizer(), corpora, SIZE, out, force=True)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_cli_registers_draft_group_and_keeps_doctor():
    from vllm_kimi_ext.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["draft", "shrink-vocab", "--head", "h", "--tokenizer", "t",
                              "--corpus", "a", "--corpus", "b", "--out", "o"])
    assert args.corpus == ["a", "b"] and args.size == 32000 and args.field == []
    assert not args.trust_remote_code and not args.force
    args = parser.parse_args(["doctor", "--target", "t", "--draft", "d"])
    assert args.func.__name__ == "run_doctor"


# --------------------------------------------------------------------------- #
# Interrupted runs: a real SIGKILL / SIGTERM of the CLI in a subprocess        #
# --------------------------------------------------------------------------- #

@pytest.fixture(scope="module")
def cli_inputs(tmp_path_factory):
    from testkit.tokenizers import write_kimi_tokenizer

    root = tmp_path_factory.mktemp("interrupted")
    spec = TinyKimiSpec(num_ranks=512)
    write_tiny_eagle3(root / "head", spec)
    write_kimi_tokenizer(root / "tok", n_ranks=512)
    (root / "corpus.jsonl").write_text(
        json.dumps({"prompt": "The quick brown fox jumps over the lazy dog."}) + "\n")
    return root


def _cli_argv(root: Path, out: Path, *extra: str) -> list[str]:
    return ["draft", "shrink-vocab", "--head", str(root / "head"), "--tokenizer",
            str(root / "tok"), "--trust-remote-code", "--corpus", str(root / "corpus.jsonl"),
            "--size", "400", "--out", str(out), *extra]


def _run_until_mid_write(root: Path, out: Path, *extra: str):
    """Start the CLI in a subprocess; return it once it is half-way through a file."""
    from testkit.interrupt import run_until_mid_write

    return run_until_mid_write(_cli_argv(root, out, *extra),
                               out.parent / f"{out.name}.marker", timeout=180)


def test_sigkill_mid_write_leaves_the_previous_output_and_the_next_run_cleans_up(
        cli_inputs, tmp_path, capsys):
    import signal

    from safetensors.torch import load_file

    from vllm_kimi_ext.cli import main

    out = tmp_path / "small-head"
    assert main(_cli_argv(cli_inputs, out)) == 0
    previous = {p.name: p.read_bytes() for p in out.iterdir()}

    proc, partial = _run_until_mid_write(cli_inputs, out, "--force", "--size", "350")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # killed mid-write: the final name still holds the previous, complete output ...
    assert {p.name: p.read_bytes() for p in out.iterdir()} == previous
    # ... and the half-written file sits in this tool's own temporary directory
    assert partial.parent == tmp_path / f".{out.name}.shrink-vocab-tmp-{proc.pid}"
    assert partial.exists() and partial.stat().st_size > 0
    assert partial.stat().st_size < (out / partial.name).stat().st_size

    capsys.readouterr()
    assert main(_cli_argv(cli_inputs, out, "--force", "--size", "350")) == 0
    assert not partial.parent.exists()  # the dead run's leftovers are gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small-head", "small-head.marker"]
    assert load_file(out / "model.safetensors")["d2t"].numel() == 350


def test_sigterm_mid_write_leaves_nothing(cli_inputs, tmp_path):
    import signal

    out = tmp_path / "small-head"
    proc, partial = _run_until_mid_write(cli_inputs, out)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small-head.marker"]


def test_stale_directories_of_dead_runs_only_are_removed(tmp_path):
    import os
    import subprocess
    import sys

    from vllm_kimi_ext.drafts.shrink_vocab.output_dir import clean_stale

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    mine = tmp_path / f".out.shrink-vocab-tmp-{os.getpid()}"
    stale = tmp_path / f".out.shrink-vocab-tmp-{dead_pid}"
    moved = tmp_path / f".gone.shrink-vocab-old-{dead_pid}"  # replacement killed mid-rename
    other = tmp_path / f".out.tmp-{dead_pid}"  # not ours: never touched
    for d in (mine, stale, moved, other):
        d.mkdir()
    (moved / "config.json").write_text("{}")
    done = clean_stale(tmp_path)
    assert mine.exists() and other.exists() and not stale.exists()
    assert (tmp_path / "gone" / "config.json").exists() and not moved.exists()
    assert len(done) == 2


def test_progress_bar_advances_over_the_corpus_bytes(tmp_path, capsys):
    import time

    corpus = tmp_path / "long.txt"
    corpus.write_text("t1 t2 t3\n" * 600)

    def slow_encode(text):  # a tokenizer slow enough for tqdm to redraw (every 0.1 s)
        time.sleep(0.001)
        return FakeTokenizer().encode(text)

    counted = sv.count_corpus(corpus, slow_encode, VOCAB, progress=True)
    assert counted.records == 600
    err = capsys.readouterr().err
    shown = {int(p) for p in __import__("re").findall(r"long\.txt:\s+(\d+)%", err)}
    assert any(0 < p < 100 for p in shown), err  # redrawn part-way, not only at the ends
    assert "5.40k" in err  # total = the file's 5400 bytes


def test_a_leftover_whose_pid_was_reused_is_stale_and_a_held_one_is_kept(tmp_path):
    """A process id alone does not say a leftover is alive: ids are reused. A writer
    holds an flock on its folders, so an unheld folder under a live id (here: this test's
    parent process, which writes nothing there) is removed, and a folder a running writer
    holds is kept; what was done is reported."""
    import os
    import subprocess
    import sys

    from vllm_kimi_ext.drafts.shrink_vocab.output_dir import clean_stale

    reused = tmp_path / f".out.shrink-vocab-tmp-{os.getppid()}"
    reused.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        "d = sys.argv[1] + f'/.held.draft-train-tmp-{os.getpid()}'\n"
        "os.mkdir(d); fd = os.open(d, os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print(d, flush=True); time.sleep(60)\n"), str(tmp_path)],
        stdout=subprocess.PIPE, text=True)
    try:
        held = Path(holder.stdout.readline().strip())
        done = clean_stale(tmp_path)
        assert not reused.exists() and held.exists()
        assert done == [f"removed {reused} (left by a run that is no longer running)"]
    finally:
        holder.kill()
        holder.wait()
    assert clean_stale(tmp_path) == [f"removed {held} (left by a run that is no longer "
                                     "running)"]


def test_a_restored_output_is_reported_on_stderr(tmp_path, capsys):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    moved = tmp_path / f".small-head.shrink-vocab-old-{int(dead.stdout)}"
    moved.mkdir()
    (moved / "config.json").write_text("{}")
    with pytest.raises(sv.ShrinkVocabError):  # the head is missing: refused after cleanup
        sv.check_inputs(tmp_path / "no-head", [tmp_path / "c.txt"], tmp_path / "small-head")
    err = capsys.readouterr().err
    assert (f"shrink-vocab: restored {tmp_path / 'small-head'} from {moved.name} (an earlier "
        "run was killed while replacing it)" in err)
    assert (tmp_path / "small-head" / "config.json").exists()
