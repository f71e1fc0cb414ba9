"""``vllm-kimi-ext draft rope-config`` and the doctor's YaRN attention-factor finding.

A config shaped like z-lab/Kimi-K2.5-DFlash's (yarn factor 64, mscale = mscale_all_dim = 1)
runs at attention factor 1.0 on vLLM 0.34.0 where plain YaRN (SGLang, vLLM <= 0.29) uses
0.1 ln 64 + 1 = 1.4159; which one the draft was trained with is unknown. The doctor names
both; the command writes a copy whose config carries a chosen factor (the other arm of the
A/B) and leaves everything else as it was. Its table of bad inputs (DeepSeek / MLA heads,
differing rope_scaling / rope_parameters, a factor printed as 0.0000, ...): each exits 2 with
one line naming the file or flag and the field, writes nothing. Doctor and rope-config agree
on every draft kind (a table). (vLLM's own rotary embedding reads the configs in
tests/vllm/test_draft_rope_config_vllm.py.)

Planted bugs, one at a time: the mscale ratio inverted in ``effective_attention_factor``
fails ``test_effective_factor_follows_vllm_0_34_rules`` (mscale 2 / mscale_all_dim 1);
the writer skipping a YaRN dict under ``rope_parameters`` fails
``test_rope_parameters_only_and_both_dicts``; an explicit ``attention_factor`` no longer
silencing doctor's W-ROPE-YARN-FACTOR fails ``test_doctor_and_rope_config_agree`` (the
1.0 copy row).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest

from testkit.checkpoints import TinyKimiSpec, write_tiny_kimi_k25
from vllm_kimi_ext.cli import main
from vllm_kimi_ext.drafts.doctor.diagnosis import diagnose
from vllm_kimi_ext.drafts.rope_config import (
    effective_attention_factor,
    rope_parameters,
    write_copy,
)

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


def mla_head_config() -> dict:
    """A config shaped like lightseekorg/kimi-k2.5-eagle3-mla's (an MLA EAGLE-3 head with
    Kimi's yarn rope; tiny widths)."""
    return {
        "architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "kimi_k2",
        "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1,
        "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
        "v_head_dim": 16, "vocab_size": 256, "max_position_embeddings": 4096,
        "rope_theta": 50000.0,
        "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 64,
                         "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32,
                         "beta_slow": 1},
    }


def llama_head_config() -> dict:
    """A Llama-style EAGLE-3 head (lightseekorg/kimi-k2.5-eagle3's kind) with a yarn rope."""
    cfg = dflash_config()
    for key in ("block_size", "dflash_config"):
        del cfg[key]
    return {**cfg, "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama"}


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
    # mscale != mscale_all_dim: yarn_get_mscale(64, 2) / yarn_get_mscale(64, 1)
    uneven = {**rope, "mscale": 2.0, "mscale_all_dim": 1.0}
    want = (0.2 * math.log(64) + 1) / (0.1 * math.log(64) + 1)
    assert effective_attention_factor(uneven)[0] == pytest.approx(want) != 1.0
    assert (effective_attention_factor({**rope, "mscale_all_dim": None})[0] ==
        pytest.approx(PLAIN_YARN_64))  # one of them missing: plain YaRN
    assert effective_attention_factor({**rope, "attention_factor": 1.3})[0] == 1.3


def test_copy_carries_the_trained_factor_and_links_the_rest(tmp_path, capsys):
    draft = write_draft(tmp_path / "Kimi-K2.5-DFlash")
    out = tmp_path / "Kimi-K2.5-DFlash-rope-1.4159"
    assert main(["draft", "rope-config", "--draft", str(draft), "--out", str(out)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_scaling"]["attention_factor"] == pytest.approx(PLAIN_YARN_64)
    assert ({k: v for k, v in cfg["rope_scaling"].items() if k != "attention_factor"} ==
        dflash_config()["rope_scaling"])  # nothing else changed
    assert os.path.islink(out / "model.safetensors")
    assert (out / "model.safetensors").read_bytes() == b"weights"
    line = capsys.readouterr().out
    assert "attention_factor = 1.4159" in line and "at 1.0000" in line
    assert "not established" in line and "trained with" in line
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
    assert "not established" in msg and not re.search(r"\bas trained\b", msg)
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
    if case == "mla-eagle3-head":  # lightseekorg/kimi-k2.5-eagle3-mla's kind
        write_draft(draft, mla_head_config())
        return ["--draft", str(draft), "--out", str(out)], "deepseek_yarn"
    if case == "mla-kimi-k2-model-type":
        write_draft(draft, {**mla_head_config(), "architectures": ["SomeDraft"]})
        return ["--draft", str(draft), "--out", str(out)], "model_type kimi_k2"
    if case == "mla-factor-1":  # 1.0 would switch it to deepseek_llama_scaling
        write_draft(draft, mla_head_config())
        return (["--draft", str(draft), "--out", str(out), "--attention-factor", "1"],
            "deepseek_llama_scaling")
    if case == "both-dicts-differ":
        cfg = dflash_config()
        cfg["rope_parameters"] = {**cfg["rope_scaling"], "factor": 32.0}
        write_draft(draft, cfg)
        return (["--draft", str(draft), "--out", str(out)],
            "rope_scaling and rope_parameters both present and different in factor")
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
        return (["--draft", str(draft), "--out", str(out), "--attention-factor", "0"],
            "--attention-factor")
    if case == "factor-nan":
        return (["--draft", str(draft), "--out", str(out), "--attention-factor", "nan"],
            "--attention-factor")
    if case == "factor-prints-as-zero":
        return (["--draft", str(draft), "--out", str(out), "--attention-factor", "0.00004"],
            "prints as 0.0000")
    raise AssertionError(case)


BAD = ["missing-dir", "no-config", "bad-json", "no-rope", "not-yarn", "factor-bool",
       "mscale-negative", "mla-eagle3-head", "mla-kimi-k2-model-type", "mla-factor-1",
       "both-dicts-differ", "out-exists", "out-inside-draft", "out-parent-missing",
       "factor-zero", "factor-nan", "factor-prints-as-zero"]


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


def test_rope_parameters_only_and_both_dicts(tmp_path):
    # a YaRN dict under rope_parameters only (transformers 5's name) gets the factor
    cfg = dflash_config()
    cfg["rope_parameters"] = cfg.pop("rope_scaling")
    out = tmp_path / "params-copy"
    write_copy(write_draft(tmp_path / "params", cfg), out, 1.3)
    written = json.loads((out / "config.json").read_text())
    assert written["rope_parameters"]["attention_factor"] == 1.3
    assert "rope_scaling" not in written
    # two equal dicts: both carry it (whichever one a library reads)
    cfg = dflash_config()
    cfg["rope_parameters"] = dict(cfg["rope_scaling"])
    out = tmp_path / "both-copy"
    write_copy(write_draft(tmp_path / "both", cfg), out, 1.3)
    written = json.loads((out / "config.json").read_text())
    assert written["rope_scaling"]["attention_factor"] == 1.3
    assert written["rope_parameters"]["attention_factor"] == 1.3


def _doctor_codes(tmp_path: Path, draft: Path, method: str) -> list[str]:
    target = tmp_path / "target"
    if not target.exists():
        write_tiny_kimi_k25(target, TinyKimiSpec(num_hidden_layers=6))
    return diagnose(target, draft, method=method).codes()


#: draft kind -> (config, method, doctor warns W-ROPE-YARN-FACTOR, rope-config exit code)
KINDS = {
    "dflash, mscale = mscale_all_dim (z-lab's)": (dflash_config(), "dflash", True, 0),
    "dflash, mscale != mscale_all_dim": (dflash_config(mscale=2.0), "dflash", True, 0),
    "dflash, explicit factor 1.0 (the A/B's first arm)":
        (dflash_config(attention_factor=1.0), "dflash", False, 0),
    "dflash, explicit plain-YaRN factor": (dflash_config(attention_factor=PLAIN_YARN_64),
                                           "dflash", False, 0),
    "dflash, no mscale keys (plain YaRN already)": (
        {**dflash_config(), "rope_scaling": {"rope_type": "yarn", "factor": 64.0,
                                             "original_max_position_embeddings": 64}},
        "dflash", False, 0),
    "MLA EAGLE-3 head (lightseek -mla's kind)": (mla_head_config(), "eagle3", False, 2),
    "Llama-style EAGLE-3 head": (llama_head_config(), "eagle3", False, 0),
    "no YaRN": ({**dflash_config(), "rope_scaling": None}, "dflash", False, 2),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_doctor_and_rope_config_agree(tmp_path, capsys, kind):
    """Where doctor warns, rope-config writes the other arm and names the same vLLM 0.34.0
    factor; where rope-config refuses (MLA heads: the factor is ignored; no YaRN), doctor
    does not point at it; a copy with an explicit factor is never warned about."""
    cfg, method, warns, rc = KINDS[kind]
    draft = write_draft(tmp_path / "draft", cfg)
    codes = _doctor_codes(tmp_path, draft, method)
    assert ("W-ROPE-YARN-FACTOR" in codes) == warns, codes
    out = tmp_path / "copy"
    assert main(["draft", "rope-config", "--draft", str(draft), "--out", str(out)]) == rc
    printed = capsys.readouterr()
    if rc == 0:
        line = printed.out
        assert "not established" in line and not re.search(r"\bas trained\b", line)
        used = effective_attention_factor(rope_parameters(cfg))[0]
        assert f"runs the original at {used:.4f}" in line
        if warns:
            report = diagnose(tmp_path / "target", draft, method=method)
            msg = next(f.message for f in report.findings if f.code == "W-ROPE-YARN-FACTOR")
            assert f"at attention factor {used:.4f}" in msg
        # the copy carries an explicit factor: doctor has nothing left to say about it
        assert "W-ROPE-YARN-FACTOR" not in _doctor_codes(tmp_path, out, method)
        # and a copy at 1.0 (the other arm when the plain value is the default) neither
        one = tmp_path / "copy-1.0"
        write_copy(draft, one, 1.0)
        assert "W-ROPE-YARN-FACTOR" not in _doctor_codes(tmp_path, one, method)
    else:
        assert len(printed.err.strip().splitlines()) == 1 and not out.exists()
