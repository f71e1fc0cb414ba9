"""``vllm-kimi-ext plan``: smoke test, PNG and JSON outputs, clear errors."""

from __future__ import annotations

import json

import pytest

from vllm_kimi_ext.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_plan_writes_png_and_json(tmp_path, capsys):
    png, js = tmp_path / "plot.png", tmp_path / "out.json"
    rc = main(["plan", "--hardware", "rtx-pro-6000-pcie-x8", "--draft", "lightseek-eagle3",
               "--batch", "1", "--out", str(png), "--json", str(js)])
    assert rc == 0
    out = capsys.readouterr().out
    for col in ("k", "placement", "tok/s", "x no-spec", "coll/tok", "comm/tok"):
        assert col in out
    assert "Recommended:" in out and "(no speculation)" in out
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000
    # IHDR: width and height are big-endian ints at bytes 16..24
    assert int.from_bytes(data[16:20], "big") > 300 and int.from_bytes(data[20:24], "big") > 200
    doc = json.loads(js.read_text())
    assert doc["recommended"]["draft"] == "lightseek-eagle3"
    assert doc["rows"] and all(r["tokens_per_s"] > 0 for r in doc["rows"])


@pytest.mark.parametrize("flags", [["--tau", "2.9"], ["--acceptance", "0.7,0.5,0.4"]])
def test_acceptance_overrides(flags, capsys):
    rc = main(["plan", "--draft", "nvidia-eagle3", "--draft", "lightseek-eagle3", *flags])
    assert rc == 0
    out = capsys.readouterr().out
    assert "nvidia-eagle3" in out


def test_list(capsys):
    assert main(["plan", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("rtx-pro-6000-pcie-x8", "h200-nvlink-x8", "kimi-k2.5", "lightseek-eagle3",
                 "zlab-dflash", "modular-mtp"):
        assert name in out


@pytest.mark.parametrize("flag,name,valid", [
    ("--draft", "lightseek-eagel3", "lightseek-eagle3"),
    ("--hardware", "rtx-6000-pcie", "rtx-pro-6000-pcie-x8"),
    ("--model", "kimi-k3", "kimi-k2.5"),
])
def test_unknown_profile_lists_valid_names(flag, name, valid, capsys):
    assert main(["plan", flag, name]) == 2
    err = capsys.readouterr().err
    assert "unknown" in err and repr(name) in err and valid in err and "valid:" in err


def test_draft_without_acceptance_asks_for_it(capsys):
    assert main(["plan", "--draft", "nvidia-eagle3"]) == 2
    assert "--tau" in capsys.readouterr().err


def test_unknown_backend(capsys):
    assert main(["plan", "--draft", "lightseek-eagle3", "--backend", "gloo"]) == 2
    assert "nccl" in capsys.readouterr().err
