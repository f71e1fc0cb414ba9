"""A full disk while a training command writes: one line naming the path and the space
needed (exit 2 through the CLI), the temporary files removed, and what was complete
before (older checkpoints, earlier shards and sample lines, the previous output) left as
it was. The device filling up is ``ENOSPC`` raised by the writer after part of the bytes
landed, as a real full device does."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from testkit.full_disk import OnesCapture
from vllm_kimi_ext.user_input import DiskFullError, human_bytes

torch = pytest.importorskip("torch")


def _enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


# --------------------------------------------------------------------------- checkpoints


def _payload(step: int) -> dict:
    from vllm_kimi_ext.train import runstate

    return {"run": {"lr": 1e-3}, "model": {"w": torch.full((256,), float(step))},
            "optimizer": {}, "scheduler": {}, "best": None, "loop": {"step": step},
            "rng": [runstate.rng_state()]}


def test_payload_bytes_by_hand():
    from vllm_kimi_ext.train import runstate

    payload = {"a": torch.zeros(10), "b": [torch.zeros(2, dtype=torch.float64), "x"],
               "c": {"d": torch.zeros(3, dtype=torch.bfloat16)}, "e": 3}
    assert runstate.payload_bytes(payload) == 40 + 16 + 6


def test_checkpoint_on_a_full_disk(tmp_path, monkeypatch):
    from vllm_kimi_ext.train import runstate

    root = tmp_path / "ck"
    runstate.save_checkpoint(root, 2, _payload(2))
    before = _files(root)
    real = torch.save

    def half_then_full(obj, fh, *a, **kw):
        real(obj, fh, *a, **kw)
        fh.truncate(fh.tell() // 2)
        raise _enospc()

    monkeypatch.setattr(torch, "save", half_then_full)
    with pytest.raises(DiskFullError) as info:
        runstate.save_checkpoint(root, 4, _payload(4))
    msg = str(info.value)
    need = human_bytes(runstate.payload_bytes(_payload(4)))
    assert msg.startswith(f"{root / 'step-000000004'}: no space left on the device while "
                          f"writing a checkpoint (about {need} needed, "), msg
    assert "partial files were removed" in msg and "\n" not in msg
    assert _files(root) == before  # no .step-000000004.tmp, step 2 untouched
    assert sorted(p.name for p in root.iterdir()) == ["step-000000002"]


def test_checkpoint_larger_than_the_free_space_is_refused_before_writing(tmp_path,
                                                                         monkeypatch):
    from vllm_kimi_ext import user_input
    from vllm_kimi_ext.train import runstate

    monkeypatch.setattr(user_input, "_free_bytes", lambda _p: 100)
    need = human_bytes(runstate.payload_bytes(_payload(2)))
    with pytest.raises(DiskFullError, match=rf"step-000000002: {need} needed for a "
                                            r"checkpoint, 100 B free"):
        runstate.save_checkpoint(tmp_path / "ck", 2, _payload(2))
    assert list((tmp_path / "ck").iterdir()) == []


def test_other_write_errors_pass_through_unchanged(tmp_path, monkeypatch):
    from vllm_kimi_ext.train import runstate

    def denied(*_a, **_kw):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(torch, "save", denied)
    with pytest.raises(PermissionError):
        runstate.save_checkpoint(tmp_path / "ck", 2, _payload(2))
    assert list((tmp_path / "ck").iterdir()) == []


# --------------------------------------------------------------------------- capture


def _samples(n: int):
    from vllm_kimi_ext.train import layout

    return [layout.Sample(i, f"{i:024x}", "s", [], [1, 2, 3], [4, 5, 6, 7]) for i in range(n)]


def test_capture_on_a_full_disk_keeps_the_earlier_shards(tmp_path, monkeypatch):
    import safetensors.torch as st

    from vllm_kimi_ext.train import capture, layout

    data = tmp_path / "data"
    layout.append_samples(data, _samples(4))
    real, calls = st.save_file, []

    def full_at_the_fourth(tensors, filename, metadata=None):
        calls.append(filename)
        real(tensors, filename, metadata=metadata)
        if len(calls) >= 4:  # sample 3: sample 2 of the same chunk landed whole
            Path(filename).write_bytes(Path(filename).read_bytes()[:40])
            raise _enospc()

    monkeypatch.setattr(st, "save_file", full_at_the_fourth)
    with pytest.raises(DiskFullError) as info:
        capture.capture(data, OnesCapture(), layer_ids=[1, 3], batch_size=2, progress=False,
                        log=lambda _m: None)
    msg = str(info.value)
    assert msg.startswith(f"{data / 'hidden_states'}: no space left on the device while "
                          "writing shards (about "), msg
    names = sorted(p.name for p in (data / "hidden_states").iterdir())
    # the first chunk (samples 0, 1) recorded; the second's shards and temporaries gone
    assert names == ["hs_0.safetensors", "hs_1.safetensors", "shards.jsonl"], names
    assert set(layout.shard_records(data)) == {0, 1}
    monkeypatch.setattr(st, "save_file", real)  # space freed: the rerun completes
    section = capture.capture(data, OnesCapture(), layer_ids=[1, 3], batch_size=2,
                              progress=False, log=lambda _m: None)
    assert [e["index"] for e in section["samples"]] == [0, 1, 2, 3]
    assert all(e["finite"] is True and e["shape"] == [7, 2, 8] for e in section["samples"])


# --------------------------------------------------------------------------- samples, manifest


class _FullAfter:
    """A binary file whose device fills after ``room`` more bytes."""

    def __init__(self, fh, room: int):
        self.fh, self.room = fh, room

    def write(self, data: bytes) -> int:
        if len(data) > self.room:
            self.fh.write(data[: self.room])
            self.fh.flush()
            raise _enospc()
        self.room -= len(data)
        return self.fh.write(data)

    def __getattr__(self, name):
        return getattr(self.fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()


def test_appending_samples_on_a_full_disk_ends_at_the_last_whole_line(tmp_path, monkeypatch):
    from vllm_kimi_ext.train import layout

    data = tmp_path / "data"
    layout.append_samples(data, _samples(2))
    before = (data / layout.SAMPLES).read_bytes()
    first_new = len(layout.Sample(2, f"{2:024x}", "s", [], [1, 2, 3], [4, 5, 6, 7])
                    .to_json()) + 1
    monkeypatch.setattr(layout, "open", lambda p, mode: _FullAfter(open(p, mode),
                                                                   first_new + 10),
                        raising=False)
    with pytest.raises(DiskFullError, match="samples.jsonl: no space left on the device "
                                            "while appending samples"):
        layout.append_samples(data, _samples(5)[2:])
    monkeypatch.undo()
    after = (data / layout.SAMPLES).read_bytes()
    assert after.startswith(before) and after.endswith(b"\n")
    assert len(after) == len(before) + first_new  # sample 2 whole, sample 3 cut away
    assert [s.index for s in layout.read_samples(data)] == [0, 1, 2]


def test_manifest_on_a_full_disk_stays_as_it_was(tmp_path, monkeypatch):
    from vllm_kimi_ext.train import layout

    layout.update_manifest(tmp_path, generation={"model": "a"})
    before = _files(tmp_path)

    def full(self, text, *a, **kw):
        Path.write_bytes(self, text.encode()[:5])
        raise _enospc()

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(DiskFullError, match="manifest.json: no space left"):
        layout.update_manifest(tmp_path, capture={"layer_ids": [1, 2]})
    assert _files(tmp_path) == before


# --------------------------------------------------------------------------- directories


def test_a_directory_output_on_a_full_disk_names_it_and_what_was_written(tmp_path):
    from vllm_kimi_ext.drafts.shrink_vocab.output_dir import write_directory_atomically

    out = tmp_path / "small-head"
    out.mkdir()
    (out / "config.json").write_text("{}")

    def write(tmp: Path) -> None:
        (tmp / "model.safetensors").write_bytes(b"x" * 5000)
        raise _enospc()

    with pytest.raises(DiskFullError) as info:
        write_directory_atomically(out, write, force=True, exists_error=FileExistsError)
    msg = str(info.value)
    assert msg.startswith(f"{out}: no space left on the device while writing small-head "
                          "(about 5.0 KB needed, "), msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small-head"]
    assert _files(out) == {"config.json": b"{}"}


def test_the_cli_turns_a_full_disk_into_one_line_and_exit_2(capsys):
    import argparse

    from vllm_kimi_ext.cli import run_handler

    def handler(_args):
        with __import__("vllm_kimi_ext.user_input").user_input.disk_full_refusal(
                "/data/out", 3_000_000, what="writing shards"):
            raise _enospc()

    args = argparse.Namespace(func=handler, _prog="vllm-kimi-ext draft capture")
    assert run_handler(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "vllm-kimi-ext draft capture: error: /data/out: no space left on the device while "
        "writing shards (about 3.0 MB needed"), err


def test_a_foreign_checkpoint_is_refused_naming_its_file(tmp_path):
    from vllm_kimi_ext.train import runstate
    from vllm_kimi_ext.train.layout import DataError

    step = tmp_path / "step-000000002"
    step.mkdir()
    torch.save({"model": {}, "epoch": 3}, step / runstate.STATE_FILE)
    with pytest.raises(DataError, match=r"state.pt: not a `draft train` checkpoint \(no run, "
                                        r"optimizer, scheduler, loop, best, rng\)"):
        runstate.load_latest(tmp_path)
    with pytest.raises(DataError, match=r"step-000000002/run.json: not a `draft train` "
                                        r"checkpoint's run record"):
        runstate.check_resume_identity(tmp_path, {"lr": 1.0})
    (step / "run.json").write_text(json.dumps({"lr": 2.0}))
    with pytest.raises(DataError, match="run setting 'lr' was 2.0, now 1.0"):
        runstate.check_resume_identity(tmp_path, {"lr": 1.0})
