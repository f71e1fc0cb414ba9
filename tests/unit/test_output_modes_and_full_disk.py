"""Every writer of ``draft capture``, ``draft train`` and ``draft shrink-vocab`` gives its
outputs the modes the user's umask asks for, and a full disk reported the way the real
libraries report it is one line naming the path and the space, exit 2, no debris.

Modes: safetensors (0.7 and later) writes ``save_file`` through a private temporary file
whose ``0600`` survived the rename; each writer here runs under umask ``027`` and every
file must come out ``0640``, every folder ``0750``.

A full disk: safetensors raises ``SafetensorError("... No space left on device (os error
28)")``, not an ``OSError``, so the ``errno`` test alone let it through as an "internal
error" without a path. The stand-ins below raise exactly that type and text after part of
the file landed, as a full device does (a tiny tmpfs is not available to tests).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
from pathlib import Path

import pytest

from testkit.full_disk import OnesCapture, safetensors_full
from vllm_kimi_ext.user_input import DiskFullError, human_bytes

torch = pytest.importorskip("torch")
safetensors = pytest.importorskip("safetensors")

UMASK = 0o027
FILE, DIR = 0o666 & ~UMASK, 0o777 & ~UMASK


@pytest.fixture
def umask():
    old = os.umask(UMASK)
    try:
        yield UMASK
    finally:
        os.umask(old)


def _modes(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (and root) whose mode is not the umask's: name -> mode."""
    bad = {}
    for p in [root, *root.rglob("*")]:
        want = DIR if p.is_dir() else FILE
        got = stat.S_IMODE(p.stat().st_mode)
        if got != want:
            bad[str(p.relative_to(root.parent))] = oct(got)
    return bad


# --------------------------------------------------------------------------- capture


def _data(root: Path, n: int = 4) -> Path:
    from vllm_kimi_ext.train import layout

    layout.append_samples(root, [layout.Sample(i, f"{i:024x}", "s", [], [1, 2, 3], [4, 5, 6])
                                 for i in range(n)])
    layout.update_manifest(root, generation={"backend": "test"})
    return root


def _capture(data: Path) -> dict:
    from vllm_kimi_ext.train import capture

    return capture.capture(data, OnesCapture(), layer_ids=[1, 3], batch_size=2, progress=False,
                           log=lambda _m: None)


def test_capture_writes_samples_manifest_and_shards_with_the_umask(tmp_path, umask):
    data = _data(tmp_path / "data")
    _capture(data)
    assert sorted(p.name for p in (data / "hidden_states").iterdir()) == [
        "hs_0.safetensors", "hs_1.safetensors", "hs_2.safetensors", "hs_3.safetensors",
        "shards.jsonl"]
    assert _modes(data) == {}


def test_capture_on_a_full_disk_names_the_folder_and_the_space(tmp_path, monkeypatch):
    import safetensors.torch as st

    from vllm_kimi_ext.cli import run_handler

    data = _data(tmp_path / "data")
    monkeypatch.setattr(st, "save_file", safetensors_full(st.save_file, after=3))
    with pytest.raises(DiskFullError) as info:
        _capture(data)
    msg = str(info.value)
    assert msg.startswith(f"{data / 'hidden_states'}: no space left on the device while "
                          "writing shards (about "), msg
    assert " needed, " in msg and " free)" in msg and "\n" not in msg
    # the first chunk whole and recorded; the second's shard and temporaries gone
    assert sorted(p.name for p in (data / "hidden_states").iterdir()) == [
        "hs_0.safetensors", "hs_1.safetensors", "shards.jsonl"]

    def handler(_args):
        _capture(data)

    code = run_handler(argparse.Namespace(func=handler, _prog="vllm-kimi-ext draft capture"))
    assert code == 2


# --------------------------------------------------------------------------- checkpoints


def test_checkpoints_are_written_with_the_umask(tmp_path, umask):
    from vllm_kimi_ext.train import runstate

    payload = {"run": {"lr": 1e-3}, "model": {"w": torch.zeros(4)}, "optimizer": {},
               "scheduler": {}, "best": None, "loop": {"step": 2},
               "rng": [runstate.rng_state()]}
    runstate.save_checkpoint(tmp_path / "ck", 2, payload)
    assert _modes(tmp_path / "ck") == {}


# --------------------------------------------------------------------------- train export


def _fake_export(model, target_dir, out):
    """What bridge.export_flat writes (config.json and model.safetensors), through the
    same writers, for a state dict instead of a speculators model."""
    from vllm_kimi_ext.outputs import save_safetensors

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text("{}\n")
    save_safetensors(dict(model.state_dict()), out / "model.safetensors")


def _export(tmp_path, monkeypatch, **kw):
    from vllm_kimi_ext.train import bridge, export

    monkeypatch.setattr(bridge, "export_flat", _fake_export)
    model = torch.nn.Linear(4, 4)
    return export.export_atomically(model, tmp_path / "target", tmp_path / "head",
                                    {"steps": 1}, log=lambda _m: None, **kw)


def test_the_exported_head_is_written_with_the_umask(tmp_path, monkeypatch, umask):
    out = _export(tmp_path, monkeypatch)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors",
                                                     "training.json"]
    assert _modes(out) == {}


def test_the_export_on_a_full_disk_names_out_and_leaves_nothing(tmp_path, monkeypatch):
    import safetensors.torch as st

    monkeypatch.setattr(st, "save_file", safetensors_full(st.save_file))
    with pytest.raises(DiskFullError) as info:
        _export(tmp_path, monkeypatch)
    msg = str(info.value)
    assert msg.startswith(f"{tmp_path / 'head'}: no space left on the device while writing "
                          "head (about 80 B needed, "), msg  # 4x4 + 4 float32
    assert sorted(p.name for p in tmp_path.iterdir()) == []


class _Rank:
    """One rank of a 2-rank job whose all-reduce says how many ranks failed."""

    def __init__(self, rank: int, failures_elsewhere: int):
        self.rank, self.world, self.failures = rank, 2, failures_elsewhere
        self.barriers = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_sum(self, values):
        return [float(values[0]) + self.failures]

    def barrier(self):
        self.barriers += 1


def test_under_torchrun_every_rank_stops_when_rank_0_cannot_export(tmp_path, monkeypatch):
    """Rank 0 raises its own refusal, rank 1 one naming rank 0, and neither waits in a
    barrier rank 0 will never reach (the old rank-1 path: barrier, then success)."""
    import safetensors.torch as st

    from vllm_kimi_ext.train import bridge, export
    from vllm_kimi_ext.train.layout import DataError

    monkeypatch.setattr(bridge, "export_flat", _fake_export)
    monkeypatch.setattr(st, "save_file", safetensors_full(st.save_file))
    model = torch.nn.Linear(4, 4)
    rank0, rank1 = _Rank(0, failures_elsewhere=0), _Rank(1, failures_elsewhere=1)
    with pytest.raises(DiskFullError, match="no space left on the device"):
        export.export_on_main(rank0, model, tmp_path / "t", tmp_path / "head", {},
                              log=lambda _m: None)
    with pytest.raises(DataError, match=rf"rank 1: stopped because rank 0 could not export "
                                        rf"the draft to {tmp_path / 'head'}"):
        export.export_on_main(rank1, model, tmp_path / "t", tmp_path / "head", {},
                              log=lambda _m: None)
    assert rank0.barriers == rank1.barriers == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- shrink-vocab


@pytest.fixture(scope="module")
def shrink_inputs(tmp_path_factory):
    from testkit.checkpoints import TinyEagle3Spec, TinyKimiSpec, write_tiny_eagle3
    from testkit.tokenizers import write_kimi_tokenizer

    root = tmp_path_factory.mktemp("shrink-modes")
    spec = TinyKimiSpec(num_ranks=512)
    write_tiny_eagle3(root / "head", spec, TinyEagle3Spec(style="llama"))
    (root / "head" / "generation_config.json").write_text('{"max_new_tokens": 8}\n')
    os.chmod(root / "head" / "generation_config.json", 0o644)  # copied: keeps no mode
    write_kimi_tokenizer(root / "tok", n_ranks=512)
    (root / "corpus.jsonl").write_text(json.dumps({"prompt": "the quick brown fox"}) + "\n")
    return root


def _shrink(root: Path, out: Path, capsys) -> tuple[int, str]:
    from vllm_kimi_ext.cli import main

    code = main(["draft", "shrink-vocab", "--head", str(root / "head"), "--tokenizer",
                 str(root / "tok"), "--trust-remote-code", "--corpus",
                 str(root / "corpus.jsonl"), "--size", "400", "--out", str(out)])
    return code, capsys.readouterr().err


def test_shrink_vocab_writes_its_head_with_the_umask(shrink_inputs, tmp_path, umask, capsys):
    out = tmp_path / "small"
    code, err = _shrink(shrink_inputs, out, capsys)
    assert code == 0, err
    assert "model.safetensors" in {p.name for p in out.iterdir()}
    assert _modes(out) == {}


def test_shrink_vocab_on_a_full_disk_is_one_line_and_exit_2(shrink_inputs, tmp_path,
                                                             monkeypatch, capsys):
    import safetensors.torch as st

    monkeypatch.setattr(st, "save_file", safetensors_full(st.save_file))
    out = tmp_path / "small"
    code, err = _shrink(shrink_inputs, out, capsys)
    assert code == 2
    lines = [ln for ln in err.splitlines() if ": error: " in ln]  # (and the progress bar)
    head_bytes = sum(p.stat().st_size for p in (shrink_inputs / "head").iterdir())
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.fullmatch(
        re.escape(f"vllm-kimi-ext draft shrink-vocab: error: {out}: no space left on the "
                  f"device while writing small (about {human_bytes(head_bytes)} needed, ")
        + r"[\d.]+ [KMGTP]?B free" + re.escape(
            "); free space or choose another folder and run the command again (its partial "
            "files were removed)"), lines[0].split("\r")[-1].strip()), err
    assert list(tmp_path.iterdir()) == []  # no output, no temporary folder


# --------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize("exc,where", [
    (lambda p: safetensors.SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28)"),
     "an output"),
    (lambda p: OSError(28, os.strerror(28), str(p)), "{p}"),
    (lambda p: OSError(122, os.strerror(122), str(p)), "{p}"),
])
def test_a_full_disk_outside_any_writer_is_one_line_not_an_internal_error(exc, where, tmp_path,
                                                                         capsys):
    from vllm_kimi_ext.cli import run_handler

    def handler(_args):
        raise exc(tmp_path / "x.bin")

    code = run_handler(argparse.Namespace(func=handler, _prog="vllm-kimi-ext draft train"))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    where = where.replace("{p}", str(tmp_path / "x.bin"))
    assert err.startswith(f"vllm-kimi-ext draft train: error: {where}: no space left on the "
                          "device"), err
    assert "internal error" not in err


# --------------------------------------------------------------------------- not writable


@pytest.mark.parametrize("code", [13, 30])  # EACCES (a folder of another user), EROFS
def test_an_out_whose_folder_is_not_writable_names_out_not_the_temporary_folder(
        shrink_inputs, tmp_path, monkeypatch, capsys, code):
    """As root no folder refuses a write, so the refusal is the one ``mkdir`` raises in a
    read-only folder: the line names ``--out`` and its folder, never the hidden
    ``.small.shrink-vocab-tmp-PID`` the command would have made."""
    real = Path.mkdir

    def mkdir(self, *a, **kw):
        if self.parent == tmp_path:
            raise OSError(code, os.strerror(code), str(self))
        return real(self, *a, **kw)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    out = tmp_path / "small"
    exit_code, err = _shrink(shrink_inputs, out, capsys)
    lines = [ln.split("\r")[-1].strip() for ln in err.splitlines() if ": error: " in ln]
    assert exit_code == 2 and len(lines) == 1, err
    assert lines[0] == (f"vllm-kimi-ext draft shrink-vocab: error: {out}: cannot be written: "
                        f"its folder {tmp_path} is not writable ({os.strerror(code)}); choose "
                        "another folder"), err
    assert "shrink-vocab-tmp" not in err and list(tmp_path.iterdir()) == []
