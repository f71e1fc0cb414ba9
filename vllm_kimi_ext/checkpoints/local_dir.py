"""A model name as vLLM is given it (a directory or a hub id), resolved to a local directory.

The configuration-time checks and ``kimi_tli`` read files of the target's and the draft's
checkpoints before vLLM loads them; they never download. :func:`local_dir` returns the
directory itself, or the snapshot of a hub id already in the local Hugging Face cache, or
``None`` (the caller then skips its check or refuses, and says which).
"""

from __future__ import annotations

from pathlib import Path


def local_dir(name: str | None) -> Path | None:
    """``name`` as a local directory: itself, a cached hub snapshot, or ``None``."""
    if not name:
        return None
    path = Path(name)
    if path.is_dir():
        return path
    try:  # a hub id already in the local cache; never downloads
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached / no hub client: the caller skips or refuses
        return None
