"""Tests written for mutants of train/ that `nox -s mutants` found surviving."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("flags,expected", [([], True), (["--no-space-check"], False)])
def test_capture_checks_free_space_unless_told_not_to(tmp_path, monkeypatch, capsys, flags,
                                                      expected):
    """`draft capture` asks capture() for the disk check by default (cli.py passes
    ``check_free_space=not args.no_space_check``); the model and capture are stand-ins."""
    from vllm_kimi_ext.cli import main
    from vllm_kimi_ext.train import capture as capture_mod
    from vllm_kimi_ext.train import cli as train_cli

    seen = {}

    def fake_capture(data, backend, **kwargs):
        seen.update(kwargs)
        return {"layer_ids": [0], "dtype": "bfloat16", "disk_bytes": 0, "measured": {}}

    # the input checks have their own tests (test_bad_input_train.py); this one is about
    # what run_capture passes on once they pass
    monkeypatch.setattr(train_cli, "check_args", lambda *_a, **_k: None)
    monkeypatch.setattr(train_cli, "load_hf", lambda *_a, **_k: (object(), None))
    monkeypatch.setattr(capture_mod, "TransformersCapture", lambda *a, **k: object())
    monkeypatch.setattr(capture_mod, "capture", fake_capture)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    rc = main(["draft", "capture", "--data", str(tmp_path / "data"), "--hf-model", str(model),
               *flags])
    assert rc == 0, capsys.readouterr().err
    assert seen["check_free_space"] is expected


def test_checkpoint_payload_bytes_count_every_tensor_byte():
    """The space a checkpoint write needs (checked before writing): numel x element size of
    every tensor, nested in dicts, lists and tuples; other values count 0."""
    import torch

    from vllm_kimi_ext.train.runstate import payload_bytes

    payload = {"model": {"w": torch.zeros(10, 3, dtype=torch.float32)},
               "optim": [torch.zeros(5, dtype=torch.bfloat16),
                         (torch.zeros(2, dtype=torch.int64),)],
               "step": 7, "rng": b"\x00" * 100}
    assert payload_bytes(payload) == 10 * 3 * 4 + 5 * 2 + 2 * 8
