"""How every command writes its outputs: with the user's umask, strict JSON, and a full
disk recognised whichever library reports it.

- **Modes.** A file written to a temporary name and renamed into place keeps the
  temporary file's mode. safetensors (0.7 and later) writes ``save_file`` through a
  private temporary file, so its outputs came out ``0600`` whatever the umask;
  :func:`save_safetensors` writes through it and then gives the file the mode a plain
  ``open()`` would (``0666 & ~umask``). Folders are made ``0777 & ~umask``
  (:func:`dir_mode`), as ``mkdir`` does without a mode.
- **A full disk.** safetensors reports ``ENOSPC`` as ``SafetensorError("... No space left
  on device (os error 28)")``, not an ``OSError``; :func:`save_safetensors` turns it
  into ``OSError(ENOSPC)`` naming the file, so that
  :func:`~vllm_kimi_ext.user_input.disk_full_refusal` names the path and the space.
- **Strict JSON** lives in :mod:`vllm_kimi_ext.jsonsafe` (``strict``).

Standard library only (safetensors is imported by :func:`save_safetensors` alone).
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

from vllm_kimi_ext.user_input import is_no_space

__all__ = ["apply_umask_tree", "dir_mode", "file_mode", "save_safetensors", "umask"]

_UMASK_LOCK = threading.Lock()


def umask() -> int:
    """The process's umask, read without changing it where the kernel says it
    (``/proc/self/status``), else set and restored under a lock."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file: ``0666 & ~umask``."""
    return 0o666 & ~umask()


def dir_mode() -> int:
    """The mode ``mkdir`` gives a new folder: ``0777 & ~umask``."""
    return 0o777 & ~umask()


def apply_umask_tree(root: str | Path) -> None:
    """Give ``root`` and everything under it the modes a fresh ``mkdir`` / ``open`` would
    under the current umask (an executable file keeps its execute bits, masked). For a
    folder written in a temporary place and renamed into place: copies (``copy2`` keeps
    the source's mode) and library writes (safetensors' 0600) alike."""
    mask = umask()
    for path in [Path(root), *Path(root).rglob("*")]:
        if path.is_symlink():
            continue
        if path.is_dir():
            os.chmod(path, 0o777 & ~mask)
        elif path.is_file():
            executable = path.stat().st_mode & 0o111
            os.chmod(path, (0o777 if executable else 0o666) & ~mask)


def save_safetensors(tensors: dict, path: str | Path, metadata: dict | None = None) -> None:
    """``safetensors.torch.save_file`` with the user's umask on the result and a full disk
    reported as ``OSError(ENOSPC)`` naming ``path``."""
    from safetensors.torch import save_file

    try:
        save_file(tensors, str(path), metadata=metadata)
    except OSError:
        raise
    except Exception as exc:
        if is_no_space(exc):
            code = errno.EDQUOT if "os error 122" in str(exc) else errno.ENOSPC
            raise OSError(code, os.strerror(code), str(path)) from exc
        raise
    os.chmod(path, file_mode())
