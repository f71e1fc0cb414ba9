"""vLLM's own plugin loader finds and runs the entry point (fresh process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.vllm

_PROBE = """
import json
from vllm.plugins import load_general_plugins
load_general_plugins()
load_general_plugins()  # vLLM may call it again in the same process
from vllm_kimi_ext.patching import applied_patches
print("APPLIED " + json.dumps(applied_patches()))
"""


def _run(env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_KIMI_EXT")}
    env.update({"VLLM_TARGET_DEVICE": "cpu", "VLLM_PLUGINS": "kimi_ext", **env_extra})
    return subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                          env=env, timeout=300)


def test_enabled_plugin_applies_its_runtime_patches_once():
    proc = _run({"VLLM_KIMI_EXT": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("APPLIED "))
    applied = json.loads(line[len("APPLIED "):])
    assert applied == {"CheckDraftAtConfigTime": ["VllmConfig._limit_max_model_len_to_draft"]}


def test_disabled_plugin_changes_nothing():
    proc = _run({})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "APPLIED {}" in proc.stdout
