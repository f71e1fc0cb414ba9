"""``draft train`` as a 2-process data-parallel job (``torchrun``, gloo on CPU),
fine-tuning a public-style head: a run killed after a checkpoint, or stopped by a full
disk in the middle of writing one, and continued with ``--resume`` ends with the same
head, bit for bit, as the run that was never interrupted, and the same loss and
validation record.

The kill is a SIGKILL of the launcher sent right after the first checkpoint is on
disk (a wrapper around :func:`vllm_kimi_ext.train.runstate.save_checkpoint` in the
launched script); the ranks must die with it (``PR_SET_PDEATHSIG``), leaving no
export behind. The full disk is ``torch.save`` writing half of the second checkpoint
and then failing with ``ENOSPC``, as a full device does.

What the equal heads cannot show is traced by the launched script: the sample indices
of every batch each rank trains on (the ranks must draw different batches: with every
rank drawing rank 0's, the two runs compared above would still agree), and whether the
RNG state a resumed rank continues with is the one its checkpoint recorded.
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
import errno, hashlib, json, os, pickle, signal, sys, time
from pathlib import Path
Path(os.environ["PID_DIR"], os.environ["RANK"]).write_text(str(os.getpid()))
from vllm_kimi_ext.train import runstate
TRACE = Path(os.environ["TRACE"] + "-" + os.environ["RANK"] + ".jsonl")

def trace(**rec):
    with open(TRACE, "a") as fh:
        fh.write(json.dumps(rec) + "\\n")

def fingerprint(state):
    return hashlib.sha256(pickle.dumps([state["torch"].tolist(), state["python"],
                                        state["numpy"]])).hexdigest()

skip_iter = runstate.SkipBatches.__iter__
def traced_iter(self):
    for batch in skip_iter(self):
        trace(batch=sorted(int(i) for i in batch))
        yield batch
runstate.SkipBatches.__iter__ = traced_iter

load_latest, wrap = runstate.load_latest, runstate.wrap_data_parallel
saved = {}
def traced_load(root):
    found = load_latest(root)
    if found:
        saved["rng"] = found[1]["rng"][int(os.environ["RANK"])]
    return found
def traced_wrap(model, ranks):  # right after a resume restored its state
    if saved:
        trace(rng_restored=fingerprint(runstate.rng_state()) == fingerprint(saved["rng"]))
    return wrap(model, ranks)
runstate.load_latest, runstate.wrap_data_parallel = traced_load, traced_wrap

if os.environ.get("KILL_AFTER_CHECKPOINT"):
    save = runstate.save_checkpoint
    def save_then_kill(*args, **kwargs):
        path = save(*args, **kwargs)
        os.kill(os.getppid(), signal.SIGKILL)  # the launcher
        time.sleep(120)  # this rank must die with it
        return path
    runstate.save_checkpoint = save_then_kill
if os.environ.get("FULL_DISK_AT"):
    import torch
    real_save = torch.save
    def full_disk(obj, fh, *args, **kwargs):
        if os.environ["FULL_DISK_AT"] not in getattr(fh, "name", ""):
            return real_save(obj, fh, *args, **kwargs)
        real_save(obj, fh, *args, **kwargs)
        fh.flush()
        fh.truncate(fh.tell() // 2)  # half of it landed, then the device was full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    torch.save = full_disk
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


def _launch(ws: Path, name: str, *extra: str, kill: bool = False, full_disk: str = "",
            trace: str = "") -> tuple[subprocess.Popen, Path]:
    run = ws / name
    (run / "pids").mkdir(parents=True, exist_ok=True)
    for old in (run / "pids").iterdir():
        old.unlink()
    env = {**os.environ, "PID_DIR": str(run / "pids"), "OMP_NUM_THREADS": "1",
           "TRACE": str(run / f"trace-{trace or 'run'}"),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    for var in ("KILL_AFTER_CHECKPOINT", "FULL_DISK_AT", "WORLD_SIZE", "RANK", "LOCAL_RANK",
                "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    if kill:
        env["KILL_AFTER_CHECKPOINT"] = "1"
    if full_disk:
        env["FULL_DISK_AT"] = full_disk
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
    return (Path(f"/proc/{pid}").exists() and "zombie" not in
        Path(f"/proc/{pid}/status").read_text().lower())


def _read_head(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def _trace(run: Path, name: str, rank: int) -> list[dict]:
    path = run / f"trace-{name}-{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _batches(run: Path, name: str, rank: int) -> list[list[int]]:
    return [r["batch"] for r in _trace(run, name, rank) if "batch" in r]


@pytest.fixture(scope="module")
def whole(workspace):
    """The uninterrupted run: its folder (head, training.json, traces)."""
    proc, run = _launch(workspace, "whole")
    assert _finish(proc, run) == 0, (run / "log.txt").read_text()[-3000:]
    return run


def _same_head(whole_run: Path, run: Path, resumed_from: str) -> None:
    import torch

    a, b = _read_head(whole_run / "head"), _read_head(run / "head")
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, differ
    ra = json.loads((whole_run / "head" / "training.json").read_text())
    rb = json.loads((run / "head" / "training.json").read_text())
    assert rb["resumed_from"].endswith(resumed_from)
    assert ra["world_size"] == rb["world_size"] == 2
    assert ra["steps"] == rb["steps"] == 7
    assert ra["losses"] == rb["losses"] and ra["validation"] == rb["validation"]
    assert ra["tokens"] == rb["tokens"] and ra["best_step"] == rb["best_step"]


def test_every_rank_trains_on_batches_of_its_own(whole):
    """Per step the two ranks' batches share no sample, and together cover the
    training samples of the epoch (planted bug: every rank drawing rank 0's batches)."""
    r0, r1 = _batches(whole, "run", 0), _batches(whole, "run", 1)
    assert len(r0) == len(r1) == 7, (r0, r1)
    for step, (a, b) in enumerate(zip(r0, r1), 1):
        assert a and b and not set(a) & set(b), f"step {step}: ranks share {set(a) & set(b)}"
    record = json.loads((whole / "head" / "training.json").read_text())
    per_epoch = len(r0) if record["steps"] <= len(r0) else None
    seen = {i for batch in r0 + r1 for i in batch}
    assert per_epoch is None or len(seen) <= record["samples"]
    assert len(seen) > max(len(set().union(*map(set, r0))), len(set().union(*map(set, r1))))


def test_a_full_disk_during_a_checkpoint_write_and_a_resume(workspace, whole):
    """The second checkpoint's write fails half-way with ENOSPC on rank 0: both ranks
    stop with one line each (rank 0's names the checkpoint and the space needed), the
    temporary folder is gone, the first checkpoint stays and nothing is exported;
    ``--resume`` continues from the first checkpoint to the uninterrupted run's head,
    every rank with the RNG state its checkpoint recorded."""
    proc, run = _launch(workspace, "full-disk", full_disk="step-000000004", trace="full")
    rc = _finish(proc, run)
    log = (run / "log.txt").read_text()
    assert rc != 0, log[-3000:]
    # torchrun itself prints its ChildFailedError traceback; none comes from the ranks
    assert "vllm_kimi_ext" not in log and "internal error" not in log, log[-3000:]
    assert log.count("draft train: error: ") == 2, log[-3000:]
    assert ("step-000000004: no space left on the device while writing a checkpoint (about "
        in log and " needed, " in log), log[-3000:]
    assert "rank 1: stopped because rank 0 could not write the checkpoint of step 4" in log
    assert sorted(p.name for p in (run / "ckpt").iterdir()) == ["step-000000002"]
    assert not (run / "head").exists()
    assert len(_batches(run, "full", 0)) == 4  # stopped at the failed checkpoint

    proc, _ = _launch(workspace, "full-disk", "--resume", trace="resumed")
    assert _finish(proc, run) == 0, (run / "log.txt").read_text()[-3000:]
    _same_head(whole, run, "step-000000002")
    for rank in (0, 1):
        restored = [r["rng_restored"] for r in _trace(run, "resumed", rank)
                    if "rng_restored" in r]
        assert restored == [True], f"rank {rank}: {restored}"
        # the resumed rank draws the batches the uninterrupted one drew from step 3 on
        assert _batches(run, "resumed", rank) == _batches(whole, "run", rank)[2:]


def test_killed_and_resumed_run_equals_the_uninterrupted_one(workspace, whole):
    import torch

    ws = workspace
    killed, killed_run = _launch(ws, "killed", kill=True)
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

    proc, _ = _launch(ws, "killed", "--resume", trace="resumed")
    assert _finish(proc, killed_run) == 0, (killed_run / "log.txt").read_text()[-3000:]
    _same_head(whole, killed_run, "step-000000002")
    for rank in (0, 1):
        assert [r["rng_restored"] for r in _trace(killed_run, "resumed", rank)
                if "rng_restored" in r] == [True]
    # the head moved away from the public head it started from
    public = _read_head(ws / "public")
    assert not torch.equal(_read_head(whole / "head")["fc.weight"], public["fc.weight"])
