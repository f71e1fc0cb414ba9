"""The real `vllm serve` with an invalid VLLM_KIMI_EXT* value: one line naming the
variable, exit 2, before any model is looked at (slow: vLLM's start-up imports)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_kimi_ext import envs

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_vllm_serve_stops_with_one_line_naming_the_variable(tmp_path):
    vllm = shutil.which("vllm") or str(Path(sys.executable).parent / "vllm")
    if not Path(vllm).exists():
        pytest.skip("no vllm executable next to this Python")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(envs.PREFIX)},
           envs.ENABLE.name: "1", envs.COUNT_COLLECTIVES.name: "often",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([vllm, "serve", str(tmp_path / "no-such-model")], env=env,
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    ours = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "vllm-kimi-ext" in ln]
    assert ours == [f"vllm-kimi-ext: error: {envs.COUNT_COLLECTIVES.name}='often': expected a "
                    "step interval N >= 0 (0 or off: disabled; on: every step)"], proc.stderr
    assert "Traceback" not in proc.stderr and "no-such-model" not in proc.stderr
