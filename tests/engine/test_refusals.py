"""vLLM's engine refuses, at start, what our patches and the plugin refuse, with the same
one-line messages the in-process checks give (``vllm-kimi-ext doctor`` names the same
problems: E-MTP-NO-LAYERS, E-D2T-MISSING):

* patch 0001: ``method: "mtp"`` on a target without MTP layers;
* patch 0003: an EAGLE-3 head with a reduced vocabulary and no ``d2t`` map;
* the plugin's pin check: a package whose recorded patch series differs from the one
  applied to the installed vLLM (a copy of the package with one patch's digest changed).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from testkit.engine import PLUGIN_DIR, ROOT, Engine, EngineSpec
from testkit.engine_models import TinyLlamaSpec

pytestmark = [pytest.mark.vllm, pytest.mark.engine]


def test_mtp_without_mtp_layers_refused(llama):
    err = Engine.start_error(EngineSpec(llama["target"], speculative_config={
        "method": "mtp", "num_speculative_tokens": 1}))
    assert err.message.startswith(
        f"Speculative method 'mtp' needs MTP layers, but {llama['target']!r} "
        "(LlamaForCausalLM, model_type 'llama') has none (num_nextn_predict_layers=None)."), \
        err
    assert "Traceback" not in err.message


def test_reduced_vocab_eagle3_without_d2t_refused(llama, tmp_path):
    from safetensors.torch import load_file, save_file

    head = tmp_path / "eagle3-v256"
    shutil.copytree(llama["eagle3"], head)
    cfg = json.loads((head / "config.json").read_text())
    cfg["draft_vocab_size"] = 256
    (head / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(str(head / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["lm_head.weight"][:256].contiguous()
    save_file(tensors, str(head / "model.safetensors"))
    err = Engine.start_error(EngineSpec(llama["target"], speculative_config={
        "method": "eagle3", "model": str(head), "num_speculative_tokens": 2}))
    vocab = TinyLlamaSpec().vocab_size
    assert err.message == (
        f"The EAGLE-3 draft has a reduced vocabulary (draft_vocab_size=256 < target "
        f"vocab_size={vocab}) but its checkpoint has no 'd2t' tensor mapping draft ids to "
        "target ids. Without it every draft id i would be read as target id i and nearly "
        "all draft tokens would be rejected. Export the head with its 'd2t' map, or use a "
        "full-vocabulary head."), err


def test_plugin_pin_refusal(llama, tmp_path):
    """The engine stops with the plugin's one line, the same the in-process check raises."""
    from vllm_kimi_ext import compat

    pkg = tmp_path / "pkg"
    shutil.copytree(ROOT / "vllm_kimi_ext", pkg / "vllm_kimi_ext",
                    ignore=shutil.ignore_patterns("__pycache__"))
    series = pkg / "vllm_kimi_ext" / "series.json"
    record = json.loads(series.read_text())
    record["series"][0]["sha256"] = "0" * 64
    record["digest"] = "f" * 64
    series.write_text(json.dumps(record))
    with pytest.raises(compat.CompatError) as expected:
        compat.check_compat(expected=record)
    path = os.pathsep.join([str(pkg), str(ROOT), str(PLUGIN_DIR)])
    err = Engine.start_error(EngineSpec(llama["target"], plugin=True, fresh_interpreter=True,
                                        env={"PYTHONPATH": path}))
    assert err.message == str(expected.value), err
    assert str(pkg) in err.detail  # the copy's plugin ran (its traceback)
    first = record["series"][0]["name"]
    assert f"different content: {first}" in err.message
