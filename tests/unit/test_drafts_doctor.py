"""`vllm-kimi-ext doctor`: every finding path, on tiny Kimi-shaped checkpoints.

The draft directories are written by the same writers the vLLM tests load
(`testkit.checkpoints`), then edited (config fields, tensors)
to reproduce one trap each. Messages must name the values involved.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from testkit.checkpoints import (
    TinyEagle3Spec,
    TinyKimiSpec,
    write_tiny_eagle3,
    write_tiny_kimi_k25,
)
from vllm_kimi_ext.drafts import cli as drafts_cli
from vllm_kimi_ext.drafts.doctor.diagnosis import diagnose, effective_aux_layer_ids

TARGET = TinyKimiSpec(num_hidden_layers=6)  # default taps (2, 3, 3) are in range
VOCAB = TARGET.vocab_size


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("doctor-target")
    write_tiny_kimi_k25(path, TARGET)
    return path


def _edit_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is _DROP:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg))


def _edit_tensors(path: Path, drop=(), replace=None) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(path / "model.safetensors")
    for name in drop:
        del tensors[name]
    tensors.update(replace or {})
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


_DROP = object()


def _eagle(tmp_path: Path, name="draft", **spec) -> Path:
    path = tmp_path / name
    write_tiny_eagle3(path, TARGET, TinyEagle3Spec(**spec))
    return path


def _only(report, code):
    hits = [f for f in report.findings if f.code == code]
    assert hits, f"{code} not in {report.codes()}"
    return hits[0]


def test_clean_full_vocab_head_has_no_findings(target_dir, tmp_path):
    report = diagnose(target_dir, _eagle(tmp_path))
    assert report.method == "eagle3"
    assert report.findings == [] and report.ok


def test_clean_reduced_vocab_head_with_d2t(target_dir, tmp_path):
    report = diagnose(target_dir, _eagle(tmp_path, draft_vocab_size=300))
    assert report.findings == []


def test_deepseek_v3_model_type_mla_head(target_dir, tmp_path):
    draft = _eagle(tmp_path, style="mla", mla_model_type="deepseek_v3")
    stock = diagnose(target_dir, draft, vllm_keeps_eagle3_deepseek_heads=False)
    f = _only(stock, "E-ARCH-MTP-REWRITE")
    assert f.severity == "error"
    assert "'deepseek_v3'" in f.message and "Eagle3DeepseekV2ForCausalLM" in f.message
    assert "Eagle3DeepSeekMTPModel" in f.message
    fixed = diagnose(target_dir, draft, vllm_keeps_eagle3_deepseek_heads=True)
    assert "E-ARCH-MTP-REWRITE" not in fixed.codes()
    # a plain DeepseekV3ForCausalLM architecture is rewritten even with the fix
    _edit_config(draft, architectures=["DeepseekV3ForCausalLM"])
    plain = diagnose(target_dir, draft, method="eagle3", vllm_keeps_eagle3_deepseek_heads=True)
    assert "name an EAGLE-3 architecture" in _only(plain, "E-ARCH-MTP-REWRITE").message


def test_short_yarn_context_caps_served_length(target_dir, tmp_path):
    draft = _eagle(tmp_path, max_position_embeddings=8192)
    f = _only(diagnose(target_dir, draft), "W-CONTEXT-CAP")
    assert f.severity == "warning"
    assert "max_position_embeddings=8192" in f.message and "yarn" in f.message
    assert f"from {TARGET.max_position_embeddings} to 8192" in f.message
    # served shorter than the draft's limit: nothing to cap
    assert "W-CONTEXT-CAP" not in diagnose(target_dir, draft, served_max_model_len=4096).codes()
    # a cache-only RoPE draft is raised to the target's length by vLLM, not capped
    cfg = json.loads((draft / "config.json").read_text())
    _edit_config(draft, rope_scaling=None, rope_theta=cfg["rope_theta"])
    assert "W-CONTEXT-CAP" not in diagnose(target_dir, draft).codes()


def test_yarn_factor_and_theta_mismatch(target_dir, tmp_path):
    draft = _eagle(tmp_path, max_position_embeddings=8192)
    _edit_config(draft, rope_theta=10000.0)
    report = diagnose(target_dir, draft)
    assert "rope_theta=10000.0" in _only(report, "W-ROPE-THETA").message
    msg = _only(report, "W-ROPE-SCALING").message
    assert "factor 2.0 vs 64.0" in msg


def test_aux_ids_vs_num_aux_vs_fc_width(target_dir, tmp_path):
    draft = _eagle(tmp_path, aux_layer_ids=(1, 3, 4))
    cfg = json.loads((draft / "config.json").read_text())
    _edit_config(draft, eagle_aux_hidden_state_layer_ids=[1, 3], eagle_config=cfg["eagle_config"])
    report = diagnose(target_dir, draft)
    f = _only(report, "E-AUX-COUNT")
    assert "num_aux_hidden_states=3" in f.message and "[1, 3]" in f.message
    # fc built for 3 taps, ids say 3, fc tensor says 2
    import torch

    h = TARGET.hidden_size
    draft2 = _eagle(tmp_path, name="fc")
    _edit_tensors(draft2, replace={"fc.weight": torch.zeros(h, 2 * h, dtype=torch.bfloat16)})
    f = _only(diagnose(target_dir, draft2), "E-FC-WIDTH")
    assert f"input width {2 * h}" in f.message and f"for {3 * h}" in f.message


def test_aux_id_outside_target_layers(target_dir, tmp_path):
    draft = _eagle(tmp_path)
    _edit_config(draft, eagle_aux_hidden_state_layer_ids=[2, 30, 58])  # real K2.5 taps
    f = _only(diagnose(target_dir, draft), "E-AUX-RANGE")
    assert "[30, 58]" in f.message and "6 layers" in f.message


def test_aux_ids_only_in_eagle_config_are_ignored_by_vllm(target_dir, tmp_path):
    draft = _eagle(tmp_path, aux_layer_ids=(1, 2, 4))
    ids, source = effective_aux_layer_ids(json.loads((draft / "config.json").read_text()))
    assert ids is None and source == "defaults"
    f = _only(diagnose(target_dir, draft), "E-AUX-IDS-IGNORED")
    assert "[1, 2, 4]" in f.message and "[2, 3, 3]" in f.message
    agree = _eagle(tmp_path, name="agree", aux_layer_ids=(2, 3, 3))
    assert _only(diagnose(target_dir, agree), "W-AUX-IDS-IGNORED").severity == "warning"


def test_reduced_vocab_without_d2t(target_dir, tmp_path):
    draft = _eagle(tmp_path, draft_vocab_size=300, with_d2t=False)
    f = _only(diagnose(target_dir, draft), "E-D2T-MISSING")
    assert "draft_vocab_size=300" in f.message and f"vocab_size={VOCAB}" in f.message
    assert "all-zero" in f.message


def test_d2t_out_of_range_and_wrong_length(target_dir, tmp_path):
    import torch
    from safetensors.torch import load_file

    draft = _eagle(tmp_path, draft_vocab_size=300)
    d2t = load_file(draft / "model.safetensors")["d2t"].clone()
    d2t[5] = VOCAB  # target id 5 + VOCAB >= VOCAB
    d2t[7] = -100  # target id -93 < 0
    _edit_tensors(draft, replace={"d2t": d2t})
    f = _only(diagnose(target_dir, draft), "E-D2T-RANGE")
    assert "2 draft id(s)" in f.message and f"draft id 5 -> {5 + VOCAB}" in f.message
    _edit_tensors(draft, replace={"d2t": torch.zeros(299, dtype=torch.int64)})
    f = _only(diagnose(target_dir, draft), "E-D2T-SHAPE")
    assert "(299,)" in f.message and "(300,)" in f.message


def test_lm_head_rows_and_vocab_mismatch(target_dir, tmp_path):
    draft = _eagle(tmp_path, draft_vocab_size=300)
    _edit_config(draft, draft_vocab_size=400, vocab_size=VOCAB + 2)
    report = diagnose(target_dir, draft)
    assert "has 300 rows but draft_vocab_size is 400" in _only(report, "E-LM-HEAD-ROWS").message
    assert f"vocab_size={VOCAB + 2}" in _only(report, "E-VOCAB-MISMATCH").message


def test_hidden_size_mismatch(target_dir, tmp_path):
    draft = _eagle(tmp_path)
    _edit_config(draft, target_hidden_size=128)
    f = _only(diagnose(target_dir, draft), "E-HIDDEN-MISMATCH")
    assert "target_hidden_size=128" in f.message and f"{TARGET.hidden_size}" in f.message
    _edit_config(draft, target_hidden_size=_DROP, hidden_size=96)
    assert "hidden_size=96" in _only(diagnose(target_dir, draft), "E-HIDDEN-MISMATCH").message


def test_special_ids_outside_vocab(target_dir, tmp_path):
    draft = _eagle(tmp_path)
    _edit_config(draft, eos_token_id=[TARGET.eos_token_id, VOCAB + 5], pad_token_id=VOCAB)
    report = diagnose(target_dir, draft)
    f = _only(report, "E-SPECIAL-ID")
    assert "eos_token_id" in f.message and str(VOCAB + 5) in f.message
    assert _only(report, "W-PAD-ID").severity == "warning"


def test_mtp_paths(tmp_path):
    spec = dataclasses.replace(TARGET, num_hidden_layers=2)
    none = tmp_path / "none"
    write_tiny_kimi_k25(none, spec)
    f = _only(diagnose(none, none, method="mtp"), "E-MTP-NO-LAYERS")
    assert "num_nextn_predict_layers=0" in f.message and "'kimi_k25'" in f.message
    with_mtp = tmp_path / "mtp"
    write_tiny_kimi_k25(with_mtp, spec, with_mtp=True)
    assert diagnose(with_mtp, with_mtp, method="mtp").findings == []
    import torch

    h = spec.hidden_size
    _edit_tensors(with_mtp, drop=["language_model.model.layers.2.hnorm.weight"], replace={
        "language_model.model.layers.2.eh_proj.weight": torch.zeros(h, h, dtype=torch.bfloat16)})
    report = diagnose(with_mtp, with_mtp, method="mtp")
    assert "language_model.model.layers.2.hnorm.weight" in _only(
        report, "E-MTP-TENSORS-MISSING").message
    # declared but absent entirely
    _edit_config(none, text_config=dict(
        json.loads((none / "config.json").read_text())["text_config"], num_nextn_predict_layers=1))
    f = _only(diagnose(none, none, method="mtp"), "E-MTP-TENSORS-MISSING")
    assert "no tensor of the layer at all" in f.message
    # wrong shape with everything present
    write_tiny_kimi_k25(with_mtp, spec, with_mtp=True)
    _edit_tensors(with_mtp, replace={
        "language_model.model.layers.2.eh_proj.weight": torch.zeros(h, h, dtype=torch.bfloat16)})
    f = _only(diagnose(with_mtp, with_mtp, method="mtp"), "E-MTP-SHAPE")
    assert f"({h}, {h})" in f.message and f"expected ({h}, {2 * h})" in f.message


def test_unreadable_input(tmp_path, target_dir):
    report = diagnose(target_dir, tmp_path / "missing")
    assert report.codes() == ["E-CONFIG"] and "no config.json" in report.errors[0].message


def test_cli_exit_codes_and_json(target_dir, tmp_path, capsys):
    from vllm_kimi_ext.cli import main

    good = _eagle(tmp_path, name="good")
    assert main(["doctor", "--target", str(target_dir), "--draft", str(good)]) == 0
    assert "no findings" in capsys.readouterr().out
    bad = _eagle(tmp_path, name="bad", draft_vocab_size=300, with_d2t=False)
    assert main(["doctor", "--target", str(target_dir), "--draft", str(bad), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False
    assert [f["code"] for f in out["findings"]] == ["E-D2T-MISSING"]
    assert main(["doctor", "--target", str(target_dir), "--draft", str(tmp_path / "nope")]) == 2
    assert drafts_cli.EXIT_ERRORS == 1


def test_separate_mtp_dir_with_text_only_config_on_kimi_target_is_accepted(tmp_path):
    """A DeepSeek-typed MTP directory on a Kimi-K2.5 target: stock vLLM would crash
    mid-load (its DeepSeekMTPModel reads the target's nested config); with the
    plugin it loads as KimiK25MTPModel (runtime patch R11,
    tests/vllm/test_runtime_kimi_mtp_deepseek_dir.py), so no finding."""
    from testkit.checkpoints import write_tiny_deepseek_v3

    spec = dataclasses.replace(TARGET, num_hidden_layers=2)
    target = tmp_path / "target"
    write_tiny_kimi_k25(target, spec)
    mtp_dir = tmp_path / "mtp-deepseek"
    write_tiny_deepseek_v3(mtp_dir, spec, with_mtp=True)
    # a DeepSeek-typed MTP directory on a kimi_k25 target loads (runtime patch R11)
    assert diagnose(target, mtp_dir, method="mtp").findings == []
    kimi_mtp = tmp_path / "mtp-kimi"
    write_tiny_kimi_k25(kimi_mtp, spec, with_mtp=True)
    assert diagnose(target, kimi_mtp, method="mtp").findings == []
