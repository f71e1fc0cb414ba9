"""``vllm-kimi-ext draft rope-config`` and the doctor's YaRN attention-factor finding.

A config shaped like z-lab/Kimi-K2.5-DFlash's (yarn factor 64, mscale = mscale_all_dim = 1)
runs at attention factor 1.0 on vLLM 0.34.0 where plain YaRN (its training stack) uses
0.1 ln 64 + 1 = 1.4159. The doctor names the effective factor; the command writes a copy
whose config carries the trained factor and leaves everything else as it was. Its table of
bad inputs: each exits 2 with one line naming the file or flag and the field, writes nothing.
(vLLM's own rotary embedding reads both configs in tests/vllm/test_draft_rope_config_vllm.py.)
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from testkit.checkpoints import TinyKimiSpec, write_tiny_kimi_k25
from vllm_kimi_ext.cli import main
from vllm_kimi_ext.drafts.doctor.diagnosis import diagnose
from vllm_kimi_ext.drafts.rope_config import effective_attention_factor, write_copy

PLAIN_YARN_64 = 0.1 * math.log(64) + 1  # 1.4159


def dflash_config(**rope) -> dict:
    """A config.json shaped like z-lab/Kimi-K2.5-DFlash's (tiny widths)."""
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_hidden_layers": 1, "intermediate_size": 128, "vocab_size": 256,
        "max_position_embeddings": 4096, "rope_theta": 50000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 64.0,
                         "original_max_position_embeddings": 64, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1, **rope},
        "block_size": 8, "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1]},
    }


def write_draft(path: Path, cfg: dict | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(cfg or dflash_config()))
    (path / "model.safetensors").write_bytes(b"weights")
    return path


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(root.rglob("*"))}


def test_effective_factor_follows_vllm_0_34_rules():
    rope = dflash_config()["rope_scaling"]
    assert effective_attention_factor(rope)[0] == 1.0  # mscale / mscale_all_dim
    assert effective_attention_factor({**rope, "mscale_all_dim": None})[0] == \
        pytest.approx(PLAIN_YARN_64)  # one of them missing: plain YaRN
    assert effective_attention_factor({**rope, "attention_factor": 1.3})[0] == 1.3


def test_copy_carries_the_trained_factor_and_links_the_rest(tmp_path, capsys):
    draft = write_draft(tmp_path / "Kimi-K2.5-DFlash")
    out = tmp_path / "Kimi-K2.5-DFlash-trained-rope"
    assert main(["draft", "rope-config", "--draft", str(draft), "--out", str(out)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_scaling"]["attention_factor"] == pytest.approx(PLAIN_YARN_64)
    assert {k: v for k, v in cfg["rope_scaling"].items() if k != "attention_factor"} == \
        dflash_config()["rope_scaling"]  # nothing else changed
    assert os.path.islink(out / "model.safetensors")
    assert (out / "model.safetensors").read_bytes() == b"weights"
    line = capsys.readouterr().out
    assert "attention_factor = 1.4159" in line and "at 1.0000" in line
    # an explicit factor is written as given
    out2 = tmp_path / "other"
    write_copy(draft, out2, 1.25)
    assert json.loads((out2 / "config.json").read_text())["rope_scaling"][
        "attention_factor"] == 1.25


def test_doctor_reports_the_effective_factor_and_names_dflash(tmp_path):
    target = tmp_path / "target"
    write_tiny_kimi_k25(target, TinyKimiSpec(num_hidden_layers=6))
    draft = write_draft(tmp_path / "Kimi-K2.5-DFlash")
    report = diagnose(target, draft, method="dflash")
    hits = [f for f in report.findings if f.code == "W-ROPE-YARN-FACTOR"]
    assert len(hits) == 1, report.codes()
    msg = hits[0].message
    assert "attention factor 1.0000" in msg and "1.4159" in msg
    assert "z-lab/Kimi-K2.5-DFlash" in msg and "draft rope-config" in msg
    # the written copy carries the factor explicitly: nothing left to report
    out = tmp_path / "copy"
    write_copy(draft, out)
    assert "W-ROPE-YARN-FACTOR" not in diagnose(target, out, method="dflash").codes()


def _bad(tmp_path: Path, case: str) -> tuple[list[str], str]:
    draft = tmp_path / "d"
    out = tmp_path / "out"
    if case == "missing-dir":
        return ["--draft", str(tmp_path / "nope"), "--out", str(out)], "not a directory"
    if case == "no-config":
        draft.mkdir()
        return ["--draft", str(draft), "--out", str(out)], "config.json: missing"
    if case == "bad-json":
        draft.mkdir()
        (draft / "config.json").write_text("{")
        return ["--draft", str(draft), "--out", str(out)], "not valid JSON"
    if case == "no-rope":
        write_draft(draft, {**dflash_config(), "rope_scaling": None})
        return ["--draft", str(draft), "--out", str(out)], "field rope_scaling: missing"
    if case == "not-yarn":
        write_draft(draft, dflash_config(rope_type="linear"))
        return ["--draft", str(draft), "--out", str(out)], "rope_scaling.rope_type"
    if case == "factor-bool":
        write_draft(draft, dflash_config(factor=True))
        return ["--draft", str(draft), "--out", str(out)], "rope_scaling.factor"
    if case == "mscale-negative":
        write_draft(draft, dflash_config(mscale=-1))
        return ["--draft", str(draft), "--out", str(out)], "rope_scaling.mscale"
    write_draft(draft)
    if case == "out-exists":
        out.mkdir()
        (out / "keep").write_text("x")
        return ["--draft", str(draft), "--out", str(out)], "not an empty directory"
    if case == "out-inside-draft":
        return ["--draft", str(draft), "--out", str(draft / "copy")], "inside --draft"
    if case == "out-parent-missing":
        return ["--draft", str(draft), "--out", str(tmp_path / "a" / "b")], "parent"
    if case == "factor-zero":
        return ["--draft", str(draft), "--out", str(out), "--attention-factor", "0"], \
            "--attention-factor"
    if case == "factor-nan":
        return ["--draft", str(draft), "--out", str(out), "--attention-factor", "nan"], \
            "--attention-factor"
    raise AssertionError(case)


BAD = ["missing-dir", "no-config", "bad-json", "no-rope", "not-yarn", "factor-bool",
       "mscale-negative", "out-exists", "out-inside-draft", "out-parent-missing",
       "factor-zero", "factor-nan"]


@pytest.mark.parametrize("case", BAD)
def test_bad_inputs_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, case):
    argv, words = _bad(tmp_path, case)
    before = snapshot(tmp_path)
    assert main(["draft", "rope-config", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err, err
    assert snapshot(tmp_path) == before  # nothing written, nothing left behind


def test_an_interrupted_copy_leaves_no_output(tmp_path, monkeypatch):
    draft = write_draft(tmp_path / "d")
    out = tmp_path / "out"
    before = snapshot(tmp_path)

    def killed(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "symlink", killed)
    with pytest.raises(KeyboardInterrupt):
        write_copy(draft, out)
    assert snapshot(tmp_path) == before
