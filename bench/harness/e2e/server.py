"""One ``vllm serve`` launch: the software probe of its Python environment, the process
(own process group, log file), readiness and shutdown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.harness.common import first_line, last_error_line
from bench.harness.e2e.load import http_get

SOFTWARE_PROBE = r"""
import importlib.metadata as m, importlib.util, json, pathlib, sys
def v(n):
    try:
        return m.version(n)
    except Exception:
        return None
out = {"python": sys.version.split()[0]}
for n in ("vllm", "torch", "vllm-kimi-ext", "flashinfer-python", "triton"):
    out[n] = v(n)
rec = None
s = importlib.util.find_spec("vllm")
if s is not None and s.origin:
    p = pathlib.Path(s.origin).resolve().parent / "_kimi_ext_series.json"
    if p.is_file():
        rec = [x["name"] for x in json.loads(p.read_text()).get("series", [])]
out["patch_series"] = rec
print(json.dumps(out))
"""


def probe_software(python: str, timeout: float = 60.0) -> dict[str, Any]:
    """Versions and applied patch series of a python environment (without importing vLLM)."""
    try:
        proc = subprocess.run([python, "-c", SOFTWARE_PROBE], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": first_line(exc)}
    if proc.returncode != 0:
        return {"error": last_error_line(proc.stderr) or f"exit {proc.returncode}"}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": "unreadable probe output"}


class Server:
    """A ``vllm serve`` process in its own process group, logging to a file."""

    def __init__(self, cmd: list[str], env: dict[str, str], log_path: Path, port: int):
        self.cmd, self.env, self.log_path, self.port = cmd, env, log_path, port
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self._log.write("$ " + " ".join(self.cmd) + "\n")
        self._log.flush()
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)

    def wait_ready(self, timeout_s: float) -> tuple[bool, str | None]:
        """(ready, reason if not)."""
        deadline = time.monotonic() + timeout_s
        pause = 0.25
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False, (f"vllm serve exited with code {self.proc.returncode}: "
                               f"{last_error_line(self.log_text()) or 'no output'}")
            try:
                status, _ = http_get(self.port, "/health", timeout=5)
                if status == 200:
                    return True, None
            except OSError:
                pass
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
        return False, f"vllm serve not ready within {timeout_s:.0f} s"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def stop(self, grace_s: float = 60.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGTERM, 15.0),
                              (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self._log is not None:
            self._log.close()
            self._log = None


def served_model_id(port: int, fallback: str) -> str:
    try:
        status, body = http_get(port, "/v1/models", timeout=10)
        if status == 200:
            data = json.loads(body).get("data") or []
            if data:
                return data[0]["id"]
    except (OSError, ValueError, KeyError):
        pass
    return fallback

