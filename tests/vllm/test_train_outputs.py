"""`draft train` never damages what it writes over and never exports a broken head:
a full disk or a SIGKILL during the export leaves the previous `--out` byte for byte,
a NaN shard or a NaN loss stops the run with the shard or step named and nothing
written, and `draft eval` refuses the same shard. Real speculators training on a tiny
DeepSeek-V3-architecture target, through the CLI."""

from __future__ import annotations

import errno
import json
import os
import signal
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("speculators", reason="training stack not installed (pip install .[train])")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """``{"target", "data"}``: a target folder for training and a captured data folder
    (seeded random states: what is tested here is the bookkeeping, not the fit)."""
    import torch
    from transformers import AutoModelForCausalLM

    from testkit.checkpoints import TinyKimiSpec, write_tiny_deepseek_v3
    from vllm_kimi_ext.train import capture, layout
    from vllm_kimi_ext.train.bridge import write_target_stub

    spec = TinyKimiSpec()
    root = tmp_path_factory.mktemp("train-outputs")
    write_tiny_deepseek_v3(root / "dsv3", spec)
    model = AutoModelForCausalLM.from_pretrained(root / "dsv3", dtype=torch.float32).eval()
    target = write_target_stub(model, root / "target")
    data = root / "data"
    g = torch.Generator().manual_seed(0)
    layout.append_samples(data, [layout.Sample(
        i, f"{i:024x}", "s", [], torch.randint(0, spec.num_ranks, (8,), generator=g).tolist(),
        torch.randint(0, spec.num_ranks, (24,), generator=g).tolist()) for i in range(4)])
    capture.capture(data, capture.TransformersCapture(model), layer_ids=[0, 1, 2, 3],
                    progress=False, log=lambda _m: None)
    return {"target": target, "data": data}


def _argv(inputs, out: Path, *extra: str) -> list[str]:
    return ["draft", "train", "--data", str(inputs["data"]), "--target", str(inputs["target"]),
            "--out", str(out), "--max-steps", "2", "--max-len", "64", "--device", "cpu",
            *extra]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _train(inputs, out, *extra, capsys=None) -> tuple[int, str]:
    from vllm_kimi_ext.cli import main

    code = main(_argv(inputs, out, *extra))
    err = capsys.readouterr().err if capsys is not None else ""
    return code, err


@pytest.fixture(scope="module", autouse=True)
def _quiet_speculators():
    """speculators logs through loguru, whose sink would outlive capsys' stream."""
    from loguru import logger

    logger.disable("speculators")
    yield
    logger.enable("speculators")


@pytest.fixture(scope="module")
def first_draft(inputs, tmp_path_factory):
    from vllm_kimi_ext.cli import main

    out = tmp_path_factory.mktemp("first") / "draft"
    assert main(_argv(inputs, out)) == 0
    return out


@pytest.fixture
def previous(first_draft, tmp_path):
    """A draft already exported to ``tmp_path/draft`` (and its bytes)."""
    import shutil

    out = tmp_path / "draft"
    shutil.copytree(first_draft, out)
    return out, _files(out)


def test_an_existing_out_needs_force_and_is_replaced_whole(inputs, previous, capsys):
    out, before = previous
    code, err = _train(inputs, out, "--seed", "1", capsys=capsys)
    assert code == 2 and "--force" in err and err.count("\n") == 1, err
    assert _files(out) == before
    code, err = _train(inputs, out, "--seed", "1", "--force", capsys=capsys)
    assert code == 0, err
    after = _files(out)
    assert (sorted(after) == sorted(before) and after["model.safetensors"] !=
        before["model.safetensors"])
    assert sorted(p.name for p in out.parent.iterdir()) == ["draft"]  # nothing left beside


def test_a_full_disk_during_the_export_leaves_the_previous_out(inputs, previous, capsys,
                                                               monkeypatch):
    import safetensors.torch as st
    from safetensors import SafetensorError

    out, before = previous
    real = st.save_file

    def full_disk(tensors, filename, metadata=None):
        real(tensors, filename, metadata=metadata)
        data = Path(filename).read_bytes()
        Path(filename).write_bytes(data[: len(data) // 3])
        # what safetensors raises on a full device (not an OSError)
        raise SafetensorError("Error while serializing: I/O error: "
                              f"{os.strerror(errno.ENOSPC)} (os error {errno.ENOSPC})")

    monkeypatch.setattr(st, "save_file", full_disk)
    code, err = _train(inputs, out, "--force", "--seed", "2", capsys=capsys)
    assert code == 2 and "Traceback" not in err, err
    assert f"{out}: no space left on the device while writing draft (about " in err, err
    assert "needed" in err and len(err.strip().splitlines()) == 1, err
    assert _files(out) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["draft"]


def test_sigkill_during_the_export_leaves_the_previous_out_and_the_next_run_cleans_up(
        inputs, previous, tmp_path, capsys):
    out, before = previous
    from testkit.interrupt import run_until_mid_write

    marker = tmp_path / "reached-the-export"
    proc, partial = run_until_mid_write(_argv(inputs, out, "--force", "--seed", "3"), marker)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert partial.parent == tmp_path / f".draft.draft-train-tmp-{proc.pid}"
    assert _files(out) == before  # the final name still holds the previous draft
    code, err = _train(inputs, out, "--force", "--seed", "3", capsys=capsys)
    assert code == 0, err
    assert not partial.parent.exists()  # the dead run's folder is removed by the next run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft", "reached-the-export"]


def _poison_shard(data: Path, index: int, tmp_path: Path) -> Path:
    """A copy of ``data`` whose shard ``index`` holds a NaN in the last layer."""
    import shutil

    from safetensors.torch import load_file, save_file

    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    shard = copy / "hidden_states" / f"hs_{index}.safetensors"
    t = load_file(str(shard))
    t["hidden_states"][5, -1, 3] = float("nan")
    save_file(t, str(shard))
    return copy


def test_a_nan_shard_is_refused_by_train_and_eval_naming_it(inputs, first_draft, tmp_path,
                                                            capsys):
    from vllm_kimi_ext.cli import main

    data = _poison_shard(inputs["data"], 2, tmp_path)
    out = tmp_path / "draft"
    code = main(_argv({**inputs, "data": data}, out, "--max-steps", "8"))
    err = capsys.readouterr().err
    assert code == 2 and "hs_2.safetensors: hidden_states hold NaN" in err, err
    assert "the last layer (the loss's targets)" in err and "Traceback" not in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["data"]

    code = main(["draft", "eval", "--data", str(data), "--target", str(inputs["target"]),
                 "--draft", str(first_draft), "--json"])
    err = capsys.readouterr().err
    assert code == 2 and "hs_2.safetensors: hidden_states hold NaN" in err, err


def test_a_nan_loss_stops_at_its_step_and_exports_nothing(inputs, tmp_path, capsys,
                                                          monkeypatch):
    from speculators.models.eagle3 import Eagle3DraftModel

    real = Eagle3DraftModel.forward
    calls = []

    def nan_at_step_3(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 3:
            return (out[0], out[1] * float("nan"), *out[2:])
        return out

    monkeypatch.setattr(Eagle3DraftModel, "forward", nan_at_step_3)
    out = tmp_path / "draft"
    code, err = _train(inputs, out, "--max-steps", "6", capsys=capsys)
    assert code == 2 and "step 3 of 6: the loss is nan" in err and "nothing was exported" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_nan_init_head_is_refused_before_training(inputs, previous, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    head, _ = previous
    w = load_file(str(head / "model.safetensors"))
    w["fc.weight"][0, 0] = float("inf")
    save_file(w, str(head / "model.safetensors"))
    out = tmp_path / "tuned"
    code, err = _train(inputs, out, "--init", str(head), capsys=capsys)
    assert code == 2 and f"--init {head}: tensor fc.weight holds NaN or infinite" in err, err
    assert not out.exists()


def test_eval_json_is_strict_and_the_training_record_is_valid_json(inputs, previous, capsys):
    from vllm_kimi_ext.cli import main

    out, _ = previous
    assert main(["draft", "eval", "--data", str(inputs["data"]), "--target",
                 str(inputs["target"]), "--draft", str(out), "--json"]) == 0
    text = capsys.readouterr().out

    def refuse(name):
        raise AssertionError(f"not strict JSON: {name}")

    rows = json.loads(text, parse_constant=refuse)
    assert rows[str(out)]["all"]["chains"] > 0
    json.loads((out / "training.json").read_text(), parse_constant=refuse)
