"""What a long ``draft train`` run needs besides the loop: ranks, checkpoints, the
validation split and resumable data order.

* **Ranks.** Launched by ``torchrun`` (``WORLD_SIZE`` > 1) the run is data parallel:
  on CUDA the process group and device come from speculators' own
  ``speculators.train.distributed.maybe_setup_distributed`` (NCCL, one GPU per local
  rank); on CPU (tests, no accelerator, where that function refuses) a gloo group.
  Every rank draws its own packed batches from speculators'
  ``MultipackDistributedBatchSamplerV2`` (``num_replicas`` = world size) and the
  gradients are averaged by ``torch.nn.parallel.DistributedDataParallel``, the
  wrapper speculators' trainer uses for its non-FSDP path. A rank whose launcher dies
  dies with it (Linux ``PR_SET_PDEATHSIG``), so a killed job leaves no rank writing.
* **Checkpoints** (``--checkpoint-every N`` steps): the trainable weights and
  buffers, the AdamW state, the schedule, every rank's RNG state and the data
  position (epoch, batches consumed in it, global step), the loss record and the
  early-stopping state, written by rank 0 to a temporary folder and renamed into
  place; the newest two are kept. ``--resume`` continues from the newest complete one
  and reproduces the uninterrupted run exactly (same batches in the same order, same
  optimiser state), refusing a checkpoint whose run settings differ.
  speculators' own checkpointer writes into its epoch folder in place and keeps no
  RNG state or batch position inside an epoch, hence this small format.
* **Validation split** (``--val-fraction``): whole conversations (samples sharing a
  conversation id or, failing that, a prompt hash) are held out by a seeded hash, so
  no conversation is on both sides.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .layout import DataError, Sample


def resolve_device(device: str | None):
    """``device`` as a torch device; CUDA when available and none is given."""
    import torch

    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


CKPT_PREFIX = "step-"
STATE_FILE = "state.pt"
KEEP_CHECKPOINTS = 2


# --------------------------------------------------------------------------- ranks


@dataclasses.dataclass
class Ranks:
    rank: int
    world: int
    local_rank: int
    device: Any  # torch.device
    distributed: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over ranks (float64)."""
        if not self.distributed:
            return [float(v) for v in values]
        import torch
        import torch.distributed as dist

        t = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return [float(x) for x in t.cpu()]

    def gather(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        if not self.distributed:
            return
        import torch

        if self.device.type == "cuda":
            from speculators.train.distributed import maybe_destroy_distributed

            maybe_destroy_distributed()
        else:
            torch.distributed.destroy_process_group()


#: What torchrun sets for every rank besides ``WORLD_SIZE`` (torch.distributed's env://).
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def world_size_from_env() -> int:
    """``WORLD_SIZE`` (1 when unset); refuses a value that is not a count, or a world
    size set without the rest of a torchrun launch (:func:`check_launch_env`)."""
    raw = os.environ.get("WORLD_SIZE", "1").strip() or "1"
    if not raw.isdigit() or int(raw) < 1:
        raise DataError(f"WORLD_SIZE={raw!r}: expected a process count >= 1 (torchrun sets "
                        "it); unset it for a single-process run", field="WORLD_SIZE")
    world = int(raw)
    if world > 1:
        check_launch_env(world)
    return world


def check_launch_env(world: int) -> None:
    missing = [v for v in LAUNCH_VARIABLES if not os.environ.get(v)]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise DataError(
            f"WORLD_SIZE={world} is set but {', '.join(missing)} {verb} not: launch "
            f"data-parallel runs with `torchrun --nproc-per-node {world} "
            "$(which vllm-kimi-ext) draft train ...`, or unset WORLD_SIZE for one process",
            field="WORLD_SIZE")


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the launcher that started it dies."""
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != parent:  # the launcher died before prctl took effect
        os._exit(1)


def setup_ranks(device: str | None) -> Ranks:
    """The process's place in a ``torchrun`` job (or a single process)."""
    import torch

    world = world_size_from_env()
    if world <= 1:

        return Ranks(0, 1, 0, resolve_device(device), False)
    _die_with_parent()
    use_cuda = device.startswith("cuda") if device else torch.cuda.is_available()
    if use_cuda:
        from speculators.train import distributed as sdist

        sdist.maybe_setup_distributed()
        local = sdist.get_local_rank()
        return Ranks(sdist.get_rank(), sdist.get_world_size(), local,
                     torch.device("cuda", local), True)
    if device not in (None, "cpu"):
        raise DataError(f"--device {device}: a multi-process run uses cuda (one GPU per "
                        "rank) or cpu")
    import torch.distributed as dist

    dist.init_process_group("gloo")
    return Ranks(dist.get_rank(), dist.get_world_size(),
                 int(os.environ.get("LOCAL_RANK", "0")), torch.device("cpu"), True)


def wrap_data_parallel(model, ranks: Ranks):
    """DistributedDataParallel around ``model`` (itself when single-process)."""
    if not ranks.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [ranks.device.index] if ranks.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


# --------------------------------------------------------------------------- data order


class SkipBatches:
    """A batch sampler that leaves out the first ``skip`` batches of ``inner`` (the
    batches a resumed run already trained on); the indices are skipped, no sample is
    loaded for them."""

    def __init__(self, inner, skip: int = 0):
        self.inner, self.skip = inner, skip

    def __iter__(self) -> Iterator:
        for i, batch in enumerate(self.inner):
            if i >= self.skip:
                yield batch

    def __len__(self) -> int:
        return max(0, len(self.inner) - self.skip)


def conversation_id(s: Sample) -> str:
    return getattr(s, "conversation", None) or s.prompt_hash


def split_validation(samples: Sequence[Sample], fraction: float, seed: int
                     ) -> tuple[list[Sample], list[Sample]]:
    """``(train, val)``: whole conversations to ``val`` with probability ``fraction``
    (a seeded hash of the conversation id, so the split is stable across runs and
    resumes and independent of the sample order)."""
    if not fraction:
        return list(samples), []
    train, val = [], []
    for s in samples:
        h = hashlib.sha256(f"{seed}:{conversation_id(s)}".encode()).digest()
        (val if int.from_bytes(h[:8], "big") / 2**64 < fraction else train).append(s)
    return train, val


# --------------------------------------------------------------------------- RNG


def rng_state() -> dict:
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# --------------------------------------------------------------------------- checkpoints


def trainable_state(model) -> dict:
    """The tensors a checkpoint needs: trainable parameters and buffers (the frozen
    embedding and verifier head are rebuilt from the target on resume)."""
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    names |= {n for n, _ in model.named_buffers()}
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if k in names}


def load_trainable_state(model, state: dict, where: str) -> None:
    own = trainable_state(model)
    if set(own) != set(state):
        diff = sorted(set(own) ^ set(state))
        raise DataError(f"{where}: tensors differ from the model being trained "
                        f"({', '.join(diff[:3])}{' ...' if len(diff) > 3 else ''})")
    model.load_state_dict(state, strict=False)


def checkpoint_dirs(root: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for d in root.iterdir():
        if d.name.startswith(CKPT_PREFIX) and (d / STATE_FILE).is_file():
            try:
                out.append((int(d.name[len(CKPT_PREFIX):]), d))
            except ValueError:
                continue
    return sorted(out)


def payload_bytes(obj: Any) -> int:
    """Bytes of the tensors in a (nested) checkpoint payload: what writing it needs,
    give or take the pickled structure."""
    if hasattr(obj, "element_size") and hasattr(obj, "numel"):
        return int(obj.numel() * obj.element_size())
    if isinstance(obj, dict):
        return sum(payload_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(payload_bytes(v) for v in obj)
    return 0


def foreign_entries(root: str | Path) -> list[str]:
    """Names in a checkpoint folder that this module did not write (a folder holding
    any is not a checkpoint folder: pruning old checkpoints there would be wrong)."""
    ours = re.compile(rf"^(?:{CKPT_PREFIX}\d+|\.{CKPT_PREFIX}\d+\.tmp)$")
    return sorted(p.name for p in Path(root).iterdir() if not ours.match(p.name))


def save_checkpoint(root: str | Path, step: int, payload: dict) -> Path:
    """Write ``payload`` as checkpoint ``step`` (temporary folder, then rename) and drop
    all but the newest :data:`KEEP_CHECKPOINTS`. Rank 0 only."""
    import torch

    from vllm_kimi_ext.user_input import check_free_space, disk_full_refusal

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{CKPT_PREFIX}{step:09d}"
    tmp = root / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    needed = payload_bytes(payload)
    check_free_space(final, needed, "a checkpoint")
    # a full disk mid-write: the temporary folder goes, the older checkpoints stay
    with disk_full_refusal(final, needed, what="writing a checkpoint"):
        try:
            tmp.mkdir()
            with open(tmp / STATE_FILE, "wb") as fh:
                torch.save(payload, fh)
                fh.flush()
                os.fsync(fh.fileno())
            (tmp / "run.json").write_text(json.dumps(payload["run"], indent=1, default=str)
                                          + "\n")
        except BaseException:  # a full disk, an interrupt: no torn temporary folder stays
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for _, old in checkpoint_dirs(root)[:-KEEP_CHECKPOINTS]:
        shutil.rmtree(old, ignore_errors=True)
    return final


#: What :func:`save_checkpoint` puts in ``state.pt`` (a file without them is another
#: program's checkpoint).
PAYLOAD_KEYS = ("run", "model", "optimizer", "scheduler", "loop", "best", "rng")


def load_latest(root: str | Path) -> tuple[Path, dict] | None:
    """The newest complete checkpoint under ``root`` (torn temporary folders of a
    killed run are ignored), or None. A file that is not a ``draft train`` checkpoint
    is refused, naming it."""
    import torch

    found = checkpoint_dirs(root)
    if not found:
        return None
    path = found[-1][1]
    try:
        payload = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable checkpoint is refused
        raise DataError(f"{path / STATE_FILE}: unreadable checkpoint ({exc})") from None
    missing = [k for k in PAYLOAD_KEYS if not isinstance(payload, dict) or k not in payload]
    if missing:
        raise DataError(f"{path / STATE_FILE}: not a `draft train` checkpoint (no "
                        f"{', '.join(missing)}); choose another --checkpoint-dir",
                        file=str(path / STATE_FILE))
    return path, payload


def saved_run(path: Path) -> dict:
    """The run settings a checkpoint folder records in its ``run.json``."""
    where = path / "run.json"
    try:
        saved = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DataError(f"{where}: not a `draft train` checkpoint's run record ({exc}); "
                        "choose another --checkpoint-dir", file=str(where)) from None
    if not isinstance(saved, dict):
        raise DataError(f"{where}: holds a JSON {type(saved).__name__}, expected the run "
                        "record of a `draft train` checkpoint", file=str(where))
    return saved


def check_resume_identity(root: str | Path, now: dict) -> None:
    """Compare the newest checkpoint's ``run.json`` with ``now`` (the settings known
    before any model is built) so a mismatch is refused before the model and data load;
    no checkpoint: nothing to compare."""
    found = checkpoint_dirs(root)
    if found:
        path = found[-1][1]
        check_same_run(saved_run(path), now, str(path), keys=now)


#: Run settings that are content digests, and what a change of one means.
_CONTENT_KEYS = {
    "train_data": " (the training samples or their shards differ: rewritten, re-captured "
                  "or another split)",
    "val_data": " (the validation samples or their shards differ)",
    "target_content": " (--target's config.json or files differ)",
    "init_content": " (--init's config.json or files differ)",
}


def check_same_run(saved: dict, now: dict, where: str, keys=None) -> None:
    """Refuse to resume a checkpoint of a run with other settings (the continuation
    would not be the run it claims to be); ``keys``: compare only these."""
    for key in sorted(keys if keys is not None else set(saved) | set(now)):
        if saved.get(key) != now.get(key):
            why = _CONTENT_KEYS.get(key, "")
            raise DataError(f"{where}: run setting {key!r} was {saved.get(key)!r}, now "
                            f"{now.get(key)!r}{why}; resume with the same settings or start a "
                            "new --checkpoint-dir")
