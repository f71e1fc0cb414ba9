"""A command stopped in the middle of a write, for the SIGKILL / SIGTERM tests.

:func:`run_until_mid_write` starts the real CLI (``vllm_kimi_ext.cli.main``) in a
subprocess whose safetensors ``save_file`` writes half of the first weight file, names
it in a marker file and waits: the caller then signals the process mid-write and checks
what the interrupted command left on disk.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["run_until_mid_write"]

REPO = Path(__file__).resolve().parents[1]

_CHILD = """
import sys, time
import safetensors.torch as st
real = st.save_file
def half_then_wait(tensors, filename, metadata=None):
    real(tensors, filename, metadata=metadata)
    data = open(filename, "rb").read()
    open(filename, "wb").write(data[: len(data) // 2])
    open(sys.argv[1], "w").write(filename)
    time.sleep(600)
st.save_file = half_then_wait
from vllm_kimi_ext.cli import main
sys.exit(main(sys.argv[2:]))
"""


def run_until_mid_write(argv: list[str], marker: Path, *, timeout: float = 300
                        ) -> tuple[subprocess.Popen, Path]:
    """Start ``vllm-kimi-ext argv`` in a subprocess; return it and the half-written file
    once it is half-way through its first safetensors file (``marker`` names that file)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(marker), *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while not marker.exists() or not marker.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"child never reached the write: {proc.communicate()}")
        time.sleep(0.1)
    return proc, Path(marker.read_text())
