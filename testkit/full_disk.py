"""Stand-ins for the full-disk and file-mode tests of the training commands.

:class:`OnesCapture` is a ``draft capture`` backend writing constant hidden states through
the command's own shard writer; :func:`safetensors_full` is safetensors' ``save_file``
failing as it does on a full device: part of the file on disk, then a ``SafetensorError``
whose text ends in ``(os error 28)`` (not an ``OSError``).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

__all__ = ["OnesCapture", "safetensors_full"]


class OnesCapture:
    hidden_size, num_hidden_layers = 8, 3
    description = {"backend": "test", "target": "t", "tensor_parallel_size": 1}

    def capture(self, samples, layer_ids, paths, dtype):
        import torch

        from vllm_kimi_ext.train import capture

        for s, p in zip(samples, paths):
            hs = torch.ones(s.num_tokens, len(layer_ids), 8, dtype=torch.bfloat16)
            capture._save_shard(p, hs, torch.tensor(s.input_ids))


def safetensors_full(real, after: int = 0):
    """``save_file`` that writes ``after`` files whole, then fails as safetensors does on
    a full device, leaving a torn file."""
    from safetensors import SafetensorError

    calls = []

    def save_file(tensors, filename, metadata=None):
        calls.append(filename)
        real(tensors, filename, metadata=metadata)
        if len(calls) > after:
            Path(filename).write_bytes(Path(filename).read_bytes()[:40])
            raise SafetensorError("Error while serializing: I/O error: "
                                  f"{os.strerror(errno.ENOSPC)} (os error {errno.ENOSPC})")

    return save_file
