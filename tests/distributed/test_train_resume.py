"""``draft train`` as a 2-process data-parallel job (``torchrun``, gloo on CPU),
fine-tuning a public-style head: a run killed after a checkpoint and continued with
``--resume`` ends with the same head, bit for bit, as the run that was never
interrupted, and the same loss and validation record.

The kill is a SIGKILL of the launcher sent right after the first checkpoint is on
disk (a wrapper around :func:`vllm_kimi_ext.train.runstate.save_checkpoint` in the
launched script); the ranks must die with it (``PR_SET_PDEATHSIG``), leaving no
export behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed
pytest.importorskip("speculators", reason="training stack not installed")

REPO = Path(__file__).resolve().parents[2]

#: The launched script: records its pid, optionally kills the launcher after the first
#: checkpoint, then runs the real command line.
WORKER = """
import os, signal, sys, time
from pathlib import Path
Path(os.environ["PID_DIR"], os.environ["RANK"]).write_text(str(os.getpid()))
if os.environ.get("KILL_AFTER_CHECKPOINT"):
    from vllm_kimi_ext.train import runstate
    save = runstate.save_checkpoint
    def save_then_kill(*args, **kwargs):
        path = save(*args, **kwargs)
        os.kill(os.getppid(), signal.SIGKILL)  # the launcher
        time.sleep(120)  # this rank must die with it
        return path
    runstate.save_checkpoint = save_then_kill
from vllm_kimi_ext.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A tiny DeepSeek-V3 target, 12 captured samples and a public-style head."""
    import torch
    from transformers import AutoModelForCausalLM

    from testkit.checkpoints import (
        TinyEagle3Spec,
        TinyKimiSpec,
        write_tiny_deepseek_v3,
        write_tiny_eagle3,
    )
    from vllm_kimi_ext.train import capture, layout
    from vllm_kimi_ext.train.bridge import write_target_stub

    spec = TinyKimiSpec()
    root = tmp_path_factory.mktemp("train-dp")
    write_tiny_deepseek_v3(root / "dsv3", spec)
    model = AutoModelForCausalLM.from_pretrained(root / "dsv3", dtype=torch.float32).eval()
    write_target_stub(model, root / "target")
    gen = torch.Generator().manual_seed(1)
    samples = []
    for i in range(12):
        ids = torch.randint(0, spec.num_ranks, (24 + 4 * (i % 3),), generator=gen).tolist()
        samples.append(layout.Sample(i, f"c{i}", "synthetic", [], ids[:6], ids[6:]))
    layout.append_samples(root / "data", samples)
    layer_ids = [0, 1, 2, spec.num_hidden_layers]
    capture.capture(root / "data", capture.TransformersCapture(model), layer_ids=layer_ids,
                    progress=False, log=lambda _m: None)
    write_tiny_eagle3(root / "public", spec, TinyEagle3Spec(aux_layer_ids=tuple(layer_ids[:-1])))
    (root / "worker.py").write_text(WORKER)
    return root


def _launch(ws: Path, name: str, *extra: str, kill: bool = False) -> tuple[subprocess.Popen,
                                                                              Path]:
    run = ws / name
    (run / "pids").mkdir(parents=True, exist_ok=True)
    for old in (run / "pids").iterdir():
        old.unlink()
    env = {**os.environ, "PID_DIR": str(run / "pids"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("KILL_AFTER_CHECKPOINT", None)
    if kill:
        env["KILL_AFTER_CHECKPOINT"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
           "--nproc-per-node", "2", str(ws / "worker.py"), "draft", "train",
           "--data", str(ws / "data"), "--target", str(ws / "target"),
           "--init", str(ws / "public"), "--out", str(run / "head"),
           "--checkpoint-dir", str(run / "ckpt"), "--checkpoint-every", "2",
           "--max-steps", "7", "--max-len", "48", "--lr", "3e-3", "--seed", "3",
           "--val-fraction", "0.25", "--val-every", "3", *extra]
    log = open(run / "log.txt", "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ws)
    proc.log = log  # type: ignore[attr-defined]
    return proc, run


def _finish(proc: subprocess.Popen, run: Path, timeout: float = 240) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        proc.log.close()  # type: ignore[attr-defined]
        if proc.poll() is None:
            proc.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in \
        Path(f"/proc/{pid}/status").read_text().lower()


def _read_head(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def test_killed_and_resumed_run_equals_the_uninterrupted_one(workspace):
    import torch

    ws = workspace
    whole, whole_run = _launch(ws, "whole")
    killed, killed_run = _launch(ws, "killed", kill=True)
    assert _finish(whole, whole_run) == 0, (whole_run / "log.txt").read_text()[-3000:]
    rc = _finish(killed, killed_run)
    log = (killed_run / "log.txt").read_text()
    assert rc == -signal.SIGKILL, log[-3000:]
    # the ranks died with their launcher: nothing left running, nothing exported
    pids = [int(p.read_text()) for p in (killed_run / "pids").iterdir()]
    assert len(pids) == 2
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    leftover = [p for p in pids if _alive(p)]
    for p in leftover:
        os.kill(p, signal.SIGKILL)
    assert not leftover, "ranks outlived the killed launcher"
    assert not (killed_run / "head").exists()
    ckpts = sorted(p.name for p in (killed_run / "ckpt").iterdir())
    assert ckpts == ["step-000000002"], ckpts

    proc, _ = _launch(ws, "killed", "--resume")
    assert _finish(proc, killed_run) == 0, (killed_run / "log.txt").read_text()[-3000:]

    a, b = _read_head(whole_run / "head"), _read_head(killed_run / "head")
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, differ
    ra = json.loads((whole_run / "head" / "training.json").read_text())
    rb = json.loads((killed_run / "head" / "training.json").read_text())
    assert rb["resumed_from"].endswith("step-000000002")
    assert ra["world_size"] == rb["world_size"] == 2
    assert ra["steps"] == rb["steps"] == 7
    assert ra["losses"] == rb["losses"] and ra["validation"] == rb["validation"]
    assert ra["tokens"] == rb["tokens"] and ra["best_step"] == rb["best_step"]
    # the head moved away from the public head it started from
    public = _read_head(ws / "public")
    assert not torch.equal(a["fc.weight"], public["fc.weight"])
