"""Write an output directory so that it appears whole or not at all.

:func:`write_directory_atomically` writes into ``.<name>.<tool>-tmp-<pid>`` next
to the output (same filesystem, so the final ``rename`` is atomic) and renames it into
place at the end; a replaced output is first moved aside to
``.<name>.<tool>-old-<pid>`` and put back if anything fails. An exception
(SIGTERM included, see :func:`terminate_as_interrupt`) removes the temporary
directory; a full disk becomes one line naming the output and the space needed
(:class:`~vllm_kimi_ext.user_input.DiskFullError`). A SIGKILL cannot be caught, so
:func:`clean_stale` removes the temporary directories no running writer holds (and
restores an output whose replacement was killed mid-rename, saying so) at the start of
the next run. A writer holds an ``flock`` on each of its folders while it runs, so a
folder whose process id was reused by another program is still recognised as stale.
Only names of this pattern are ever touched.

Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from vllm_kimi_ext.outputs import apply_umask_tree
from vllm_kimi_ext.user_input import UserInputError, disk_full_refusal, tree_bytes

__all__ = ["TMP_TAG", "TOOLS", "clean_stale", "temp_name", "terminate_as_interrupt",
           "write_directory_atomically"]

#: The tools writing through this module; each names its leftovers ``<tool>-tmp`` /
#: ``<tool>-old`` so that a reader sees whose they are.
TOOLS = ("shrink-vocab", "draft-train")
TMP_TAG = "shrink-vocab-tmp"
OLD_TAG = "shrink-vocab-old"
_TOOLS_RE = "|".join(re.escape(t) for t in TOOLS)
_STALE_RE = re.compile(
    rf"^\.(?P<name>.+)\.(?P<tag>(?:{_TOOLS_RE})-(?:tmp|old))-(?P<pid>\d+)$")


#: What a folder this user cannot write into says (a read-only mount included).
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def temp_name(out_dir: Path, tag: str = TMP_TAG, pid: int | None = None) -> Path:
    return out_dir.parent / f".{out_dir.name}.{tag}-{os.getpid() if pid is None else pid}"


def _tags(tool: str) -> tuple[str, str]:
    if tool not in TOOLS:
        raise ValueError(f"unknown tool {tool!r}; expected one of {', '.join(TOOLS)}")
    return f"{tool}-tmp", f"{tool}-old"


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    except OSError:
        return True  # cannot tell: keep it
    return True


def _lock(folder: Path) -> int:
    """An exclusive ``flock`` on ``folder`` held by the returned descriptor (released
    when it is closed, or when the process dies however it dies)."""
    fd = os.open(folder, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _held(folder: Path) -> bool:
    """Does a running writer hold ``folder``'s lock?"""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return True  # cannot tell: keep it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def clean_stale(parent: Path) -> list[str]:
    """Remove this tool's leftovers in ``parent`` that no running writer holds (its
    process is dead, or its process id now belongs to another program); a moved-aside
    previous output whose final name is empty is renamed back. Returns what was done,
    one line each, for the caller to print."""
    done: list[str] = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return done
    for entry in entries:
        m = _STALE_RE.match(entry.name)
        if m is None or not entry.is_dir() or int(m["pid"]) == os.getpid() or (
                _pid_alive(int(m["pid"])) and _held(entry)):
            continue
        final = parent / m["name"]
        if m["tag"].endswith("-old") and not final.exists():
            os.rename(entry, final)
            done.append(f"restored {final} from {entry.name} (an earlier run was killed "
                        "while replacing it)")
        else:
            shutil.rmtree(entry, ignore_errors=True)
            done.append(f"removed {entry} (left by a run that is no longer running)")
    return done


def write_directory_atomically(out_dir: Path, write: Callable[[Path], None], *,
                               force: bool, exists_error: Callable[[Path], Exception],
                               tool: str = "shrink-vocab", needed: int | None = None) -> None:
    """Run ``write(tmp)`` into a temporary sibling of ``out_dir``, then rename it into
    place; on any error nothing is left behind and a replaced ``out_dir`` is restored.
    ``exists_error`` builds the exception for an ``out_dir`` that appeared meanwhile
    without ``force``; ``tool`` (one of :data:`TOOLS`) names the temporary folders;
    ``needed`` (bytes, an estimate) is what a full-disk refusal names (default: at
    least what was written before the disk filled)."""
    tmp_tag, old_tag = _tags(tool)
    tmp = temp_name(out_dir, tmp_tag)
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # our own pid: a leftover of an earlier call
        tmp.mkdir()  # 0777 & ~umask, as the renamed output keeps it
    except OSError as exc:  # the output's folder, not our hidden temporary name
        if exc.errno not in _NOT_WRITABLE:
            raise
        raise UserInputError(
            f"{out_dir}: cannot be written: its folder {out_dir.parent} is not writable "
            f"({exc.strerror}); choose another folder", file=str(out_dir),
            expected="a folder this user can write") from None
    locks = [_lock(tmp)]
    old: Path | None = None
    try:
        with disk_full_refusal(out_dir, None, what=f"writing {out_dir.name}") as need:
            try:
                write(tmp)
                apply_umask_tree(tmp)  # copies and library writes: the user's umask
                if out_dir.exists():
                    if not force:
                        raise exists_error(out_dir)
                    old = temp_name(out_dir, old_tag)
                    shutil.rmtree(old, ignore_errors=True)
                    os.rename(out_dir, old)
                    locks.append(_lock(old))
                os.rename(tmp, out_dir)
            except BaseException:
                need.needed = needed if needed is not None else (tree_bytes(tmp) or None)
                shutil.rmtree(tmp, ignore_errors=True)
                if old is not None and old.exists() and not out_dir.exists():
                    os.rename(old, out_dir)  # put the previous output back
                raise
    finally:
        for fd in locks:
            os.close(fd)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises ``KeyboardInterrupt`` (so cleanup handlers run)
    instead of ending the process on the spot. Main thread only; a no-op elsewhere."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
