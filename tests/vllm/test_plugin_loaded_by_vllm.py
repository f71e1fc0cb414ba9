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
from vllm.config.logging import LoggingConfig
from vllm.logger import configure_logging
configure_logging(LoggingConfig())  # as every vLLM process does before loading plugins
from vllm.plugins import load_general_plugins
load_general_plugins()
load_general_plugins()  # vLLM may call it again in the same process
from vllm_kimi_ext.patching import applied_patches
print("APPLIED " + json.dumps(applied_patches()))
import vllm.envs
print("REGISTERED " + json.dumps(sorted(k for k in vllm.envs.environment_variables
                                        if k.startswith("VLLM_KIMI_EXT"))))
"""


def _run(env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_KIMI_EXT")}
    env.update({"VLLM_TARGET_DEVICE": "cpu", "VLLM_PLUGINS": "kimi_ext", **env_extra})
    return subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                          env=env, timeout=300)


def _status_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [x for x in (proc.stdout + proc.stderr).splitlines() if "vllm-kimi-ext " in x
            and " active (pid " in x]


def test_enabled_plugin_applies_its_runtime_patches_once_and_says_so_in_one_line():
    from vllm_kimi_ext import __version__, compat, envs

    proc = _run({"VLLM_KIMI_EXT": "1", "VLLM_LOGGING_LEVEL": "INFO"})  # vLLM's default level
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("APPLIED "))
    applied = json.loads(line[len("APPLIED "):])
    assert applied == {"VllmConfigDraftCheck": ["VllmConfig._limit_max_model_len_to_draft"],
                       "SpeculativeConfigKimiK25MTP": ["SpeculativeConfig.hf_config_override"],
                       "MTPSpeculatorConfigKimiK25MTP": [
                           "MTPSpeculatorConfig.draft_hf_overrides"]}
    status = _status_lines(proc)
    assert len(status) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = compat.applied_record()
    assert f"vllm-kimi-ext {__version__} active" in status[0]
    assert f"digest {record['digest'][:12]}" in status[0]
    assert f"({len(record['series'])} patches" in status[0]
    assert ("runtime patches: MTPSpeculatorConfigKimiK25MTP, SpeculativeConfigKimiK25MTP, "
            "VllmConfigDraftCheck;") in status[0]
    assert "INFO" in status[0]  # through vLLM's handler and format, not dropped
    registered = next(x for x in proc.stdout.splitlines() if x.startswith("REGISTERED "))
    assert json.loads(registered[len("REGISTERED "):]) == sorted(f.name for f in envs.FLAGS)


def test_disabled_plugin_changes_nothing():
    proc = _run({"VLLM_LOGGING_LEVEL": "INFO"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "APPLIED {}" in proc.stdout
    assert "REGISTERED []" in proc.stdout  # off: vLLM keeps warning, the variable is inert
    assert _status_lines(proc) == []


_CONFIG_PROBE = """
import sys
from testkit.checkpoints import TinyEagle3Spec, write_tiny_eagle3, write_tiny_kimi_k25
from testkit.vllm_cpu import make_vllm_config
root = sys.argv[1]
write_tiny_kimi_k25(root + "/target")
write_tiny_eagle3(root + "/draft", None, TinyEagle3Spec(draft_vocab_size=512, with_d2t=False))
try:
    make_vllm_config(root + "/target", speculative_config={
        "method": "eagle3", "model": root + "/draft", "num_speculative_tokens": 3})
except Exception as exc:
    print("REFUSED " + str(exc).replace("\\n", " "))
else:
    print("ACCEPTED")
"""


def test_enabled_plugin_refuses_a_bad_draft_while_vllm_builds_its_config(tmp_path):
    """`vllm serve` builds EngineArgs, which loads general plugins, then the config:
    with the plugin on, a reduced-vocab EAGLE-3 head without d2t is refused there,
    before any weight is loaded; with it off, vLLM 0.34.0 config accepts it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_KIMI_EXT")}
    env.update({"VLLM_TARGET_DEVICE": "cpu", "VLLM_PLUGINS": "kimi_ext", "VLLM_KIMI_EXT": "1"})
    on = subprocess.run([sys.executable, "-c", _CONFIG_PROBE, str(tmp_path / "on")],
                        capture_output=True, text=True, env=env, timeout=300)
    assert on.returncode == 0, on.stderr[-2000:]
    assert "REFUSED" in on.stdout and "E-D2T-MISSING" in on.stdout, on.stdout[-2000:]
    env.pop("VLLM_KIMI_EXT")
    off = subprocess.run([sys.executable, "-c", _CONFIG_PROBE, str(tmp_path / "off")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert off.returncode == 0, off.stderr[-2000:]
    assert "ACCEPTED" in off.stdout, off.stdout[-2000:]


_TLI_PROBE = """
import sys
from testkit.tli_scenarios import write_retokenized_draft, write_tli_target
from testkit.vllm_cpu import make_vllm_config
root = sys.argv[1]
target = write_tli_target(root + "/target")
draft = write_retokenized_draft(target, root + "/draft")
try:
    cfg = make_vllm_config(target, speculative_config={
        "method": "kimi_tli", "model": str(draft.path), "num_speculative_tokens": 3})
except Exception as exc:
    print("REFUSED " + str(exc).replace("\\n", " "))
else:
    print("ACCEPTED " + type(cfg.speculative_config.speculator_config).__name__)
"""


def test_kimi_tli_is_registered_through_vllms_plugin_loader(tmp_path):
    """With the plugin on, `method: kimi_tli` exists when vLLM builds its config
    (registered by vLLM's own plugin loader); off, vLLM does not know the method."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_KIMI_EXT")}
    env.update({"VLLM_TARGET_DEVICE": "cpu", "VLLM_PLUGINS": "kimi_ext", "VLLM_KIMI_EXT": "1"})
    on = subprocess.run([sys.executable, "-c", _TLI_PROBE, str(tmp_path / "on")],
                        capture_output=True, text=True, env=env, timeout=300)
    assert on.returncode == 0, on.stderr[-2000:]
    assert "ACCEPTED TLISpeculatorConfig" in on.stdout, on.stdout[-2000:]
    env.pop("VLLM_KIMI_EXT")
    off = subprocess.run([sys.executable, "-c", _TLI_PROBE, str(tmp_path / "off")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert off.returncode == 0, off.stderr[-2000:]
    assert "REFUSED" in off.stdout and "kimi_tli" in off.stdout, off.stdout[-2000:]
