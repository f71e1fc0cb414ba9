"""Write an output directory so that it appears whole or not at all.

:func:`write_directory_atomically` writes into ``.<name>.shrink-vocab-tmp-<pid>`` next
to the output (same filesystem, so the final ``rename`` is atomic) and renames it into
place at the end; a replaced output is first moved aside to
``.<name>.shrink-vocab-old-<pid>`` and put back if anything fails. An exception
(SIGTERM included, see :func:`terminate_as_interrupt`) removes the temporary
directory; a SIGKILL cannot be caught, so :func:`clean_stale` removes the temporary
directories of processes that no longer run (and restores an output whose
replacement was killed mid-rename) at the start of the next run. Only names of this
pattern whose process id is dead are ever touched.

Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["TMP_TAG", "clean_stale", "temp_name", "terminate_as_interrupt",
           "write_directory_atomically"]

TMP_TAG = "shrink-vocab-tmp"
OLD_TAG = "shrink-vocab-old"
_STALE_RE = re.compile(rf"^\.(?P<name>.+)\.(?P<tag>{TMP_TAG}|{OLD_TAG})-(?P<pid>\d+)$")


def temp_name(out_dir: Path, tag: str = TMP_TAG, pid: int | None = None) -> Path:
    return out_dir.parent / f".{out_dir.name}.{tag}-{os.getpid() if pid is None else pid}"


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


def clean_stale(parent: Path) -> list[str]:
    """Remove this tool's leftovers in ``parent`` whose process is dead; a moved-aside
    previous output whose final name is empty is renamed back. Returns what was done."""
    done: list[str] = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return done
    for entry in entries:
        m = _STALE_RE.match(entry.name)
        if m is None or not entry.is_dir() or _pid_alive(int(m["pid"])):
            continue
        final = parent / m["name"]
        if m["tag"] == OLD_TAG and not final.exists():
            os.rename(entry, final)
            done.append(f"restored {final} from {entry.name}")
        else:
            shutil.rmtree(entry, ignore_errors=True)
            done.append(f"removed {entry}")
    return done


def write_directory_atomically(out_dir: Path, write: Callable[[Path], None], *,
                               force: bool, exists_error: Callable[[Path], Exception]) -> None:
    """Run ``write(tmp)`` into a temporary sibling of ``out_dir``, then rename it into
    place; on any error nothing is left behind and a replaced ``out_dir`` is restored.
    ``exists_error`` builds the exception for an ``out_dir`` that appeared meanwhile
    without ``force``."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(out_dir)
    shutil.rmtree(tmp, ignore_errors=True)  # our own pid: a leftover of an earlier call
    tmp.mkdir(mode=0o755)
    old: Path | None = None
    try:
        write(tmp)
        if out_dir.exists():
            if not force:
                raise exists_error(out_dir)
            old = temp_name(out_dir, OLD_TAG)
            shutil.rmtree(old, ignore_errors=True)
            os.rename(out_dir, old)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and old.exists() and not out_dir.exists():
            os.rename(old, out_dir)  # put the previous output back
        raise
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
