"""One rank of a vocabulary-sharded tensor-parallel group and its ``all_gather``.

Each of the ``TP`` ranks holds only its slice ``z[:, r*S:(r+1)*S]`` of the target
logits (``S = ceil(V / TP)`` by default; columns ``>= V`` are padding and never win).
The verification step exchanges small per-row payloads through an injected
``all_gather(t: [rows, n]) -> [TP, rows, n]``; this module holds the shard geometry,
the adapters to ``torch.distributed`` and to vLLM's ``GroupCoordinator`` (duck-typed:
vLLM is not imported) and a counting wrapper. The rule that picks the Triton or the torch
implementation of a step is :func:`.backend.use_triton`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .backend import check_backend, use_triton
from .protocol import MAX_EXACT_FLOAT_ID

#: ``all_gather(t [rows, n]) -> [TP, rows, n]`` (rank order).
AllGather = Callable[[torch.Tensor], torch.Tensor]

def full_gather_bytes_per_row(vocab_size: int, dtype_bytes: int = 2) -> int:
    """Bytes each rank receives per row when gathering full logits (vLLM today)."""
    return vocab_size * dtype_bytes


class ShardedRank:
    """One rank of a vocabulary-sharded group: the vocabulary, the group size, this rank's
    shard (``shard_width`` columns from ``col_offset``), the ``all_gather`` of the group and
    the backend (``"auto"``, ``"torch"`` or ``"triton"``, see :func:`.backend.use_triton`)."""

    def __init__(self, vocab_size: int, tp_size: int, rank: int, all_gather: AllGather,
                 shard_width: int | None = None, backend: str = "auto"):
        if vocab_size >= MAX_EXACT_FLOAT_ID:
            raise ValueError("token ids are exchanged as float32: vocab must be < 2**24")
        self.vocab_size = int(vocab_size)
        self.tp_size = int(tp_size)
        self.rank = int(rank)
        self.all_gather = all_gather
        self.shard_width = int(shard_width) if shard_width else -(-self.vocab_size // self.tp_size)
        if self.shard_width * self.tp_size < self.vocab_size:
            raise ValueError("shards do not cover the vocabulary")
        self.col_offset = self.rank * self.shard_width
        self.backend = check_backend(backend)

    def shard_lengths(self) -> list[int]:
        """Valid (non-padding) columns of each rank's shard, in rank order."""
        S, V = self.shard_width, self.vocab_size
        return [max(0, min(S, V - r * S)) for r in range(self.tp_size)]

    def uses_triton(self, t: torch.Tensor) -> bool:
        """Whether this rank's step runs the Triton kernels on ``t`` (:func:`use_triton`)."""
        return use_triton(self.backend, t)


# ---------------------------------------------------------------------------
# communication back-ends
# ---------------------------------------------------------------------------
def torch_distributed_all_gather(group=None) -> AllGather:
    """``all_gather`` over a ``torch.distributed`` process group (gloo, NCCL, ...)."""
    import torch.distributed as dist

    def all_gather(t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous()
        ws = dist.get_world_size(group)
        out = torch.empty((ws, *t.shape), dtype=t.dtype, device=t.device)
        dist.all_gather(list(out.unbind(0)), t, group=group)
        return out

    return all_gather


def group_coordinator_all_gather(group) -> AllGather:
    """Adapter for a vLLM ``GroupCoordinator`` (e.g. ``get_tp_group()``), without importing vLLM.

    ``GroupCoordinator.all_gather(t, dim=0)`` concatenates along dim 0; this
    reshapes to ``[world_size, rows, n]``. It goes through vLLM's device
    communicator (NCCL, or a custom all-gather where configured).
    """

    def all_gather(t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous()
        return group.all_gather(t, dim=0).view(group.world_size, *t.shape)

    return all_gather


@dataclass
class CountingAllGather:
    """Wraps an ``all_gather`` and records the shape and bytes of every call."""

    inner: AllGather
    calls: list[tuple[tuple[int, ...], int]] = field(default_factory=list)

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        self.calls.append((tuple(t.shape), t.numel() * t.element_size()))
        return self.inner(t)

    @property
    def num_calls(self) -> int:
        return len(self.calls)

    @property
    def bytes_sent(self) -> int:
        return sum(b for _, b in self.calls)
