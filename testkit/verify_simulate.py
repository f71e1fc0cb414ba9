"""In-process simulation of a tensor-parallel group (one thread per rank).

:class:`ThreadedGroup` gives each simulated rank an ``all_gather`` with real
collective semantics (every rank blocks until all have contributed, then all
receive the same ``[TP, ...]`` stack), so the sharded verifier runs unchanged
and any rank-divergent control flow deadlocks (reported as an error after a
timeout) instead of silently passing. It also records every collective, for
comparison with :func:`vllm_kimi_ext.verify.sharded.comm_plan`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from vllm_kimi_ext.verify.batch import VerifyBatch, VerifyOutput
from vllm_kimi_ext.verify.sharded import AllGather, VocabShardedVerifier


class ThreadedGroup:
    def __init__(self, world_size: int, timeout_s: float = 120.0):
        self.world_size = world_size
        self._barrier = threading.Barrier(world_size, timeout=timeout_s)
        self._slots: list[torch.Tensor | None] = [None] * world_size
        #: Per rank: list of (shape, bytes sent) per collective.
        self.calls: list[list[tuple[tuple[int, ...], int]]] = [[] for _ in range(world_size)]

    def all_gather_fn(self, rank: int) -> AllGather:
        def all_gather(t: torch.Tensor) -> torch.Tensor:
            self.calls[rank].append((tuple(t.shape), t.numel() * t.element_size()))
            self._slots[rank] = t
            self._barrier.wait()
            try:
                out = torch.stack([s.clone() for s in self._slots])  # type: ignore[union-attr]
            finally:
                self._barrier.wait()
            return out

        return all_gather

    def abort(self) -> None:
        self._barrier.abort()


def run_ranks(world_size: int, fn: Callable[[int, AllGather], Any],
              timeout_s: float = 120.0) -> tuple[list[Any], ThreadedGroup]:
    """Run ``fn(rank, all_gather)`` on ``world_size`` threads; return results by rank."""
    group = ThreadedGroup(world_size, timeout_s)
    results: list[Any] = [None] * world_size
    errors: list[BaseException | None] = [None] * world_size

    def body(rank: int) -> None:
        try:
            results[rank] = fn(rank, group.all_gather_fn(rank))
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors[rank] = e
            group.abort()

    if world_size == 1:
        body(0)
    else:
        threads = [threading.Thread(target=body, args=(r,), daemon=True)
                   for r in range(world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    real = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
    if real:
        raise real[0]
    if any(e is not None for e in errors):
        raise next(e for e in errors if e is not None)
    return results, group


def shard_columns(full: torch.Tensor, tp_size: int, vocab_size: int,
                  shard_width: int | None = None, pad_value: float = 0.0) -> list[torch.Tensor]:
    """Split ``[rows, V]`` into ``tp_size`` shards of width ``S`` (padding filled with
    ``pad_value``: it must never matter)."""
    S = shard_width or -(-vocab_size // tp_size)
    rows = full.shape[0]
    padded = torch.full((rows, S * tp_size), pad_value, dtype=full.dtype, device=full.device)
    padded[:, :vocab_size] = full[:, :vocab_size]
    return [padded[:, r * S:(r + 1) * S].contiguous() for r in range(tp_size)]


def simulate_sharded_verify(
    logits: torch.Tensor,
    batch: VerifyBatch,
    tp_size: int,
    vocab_size: int,
    draft_probs: torch.Tensor | None = None,
    *,
    shard_width: int | None = None,
    pad_value: float = 0.0,
    verifier_cls: type[VocabShardedVerifier] = VocabShardedVerifier,
    backend: str = "torch",
    **verifier_kwargs: Any,
) -> tuple[VerifyOutput, ThreadedGroup, list[VerifyOutput]]:
    """Run the sharded verifier on all ranks in-process.

    Returns rank 0's output, the group (collective log) and every rank's output
    (which must all be identical). ``verifier_kwargs`` go to the verifier
    (e.g. ``top_p_width``).
    """
    shards = shard_columns(logits, tp_size, vocab_size, shard_width, pad_value)
    qshards = (shard_columns(draft_probs, tp_size, vocab_size, shard_width, 0.0)
               if draft_probs is not None else None)

    def fn(rank: int, ag: AllGather) -> VerifyOutput:
        v = verifier_cls(vocab_size, tp_size, rank, ag, shard_width=shard_width,
                         backend=backend, **verifier_kwargs)
        return v.verify(shards[rank], batch, None if qshards is None else qshards[rank])

    outs, group = run_ranks(tp_size, fn)
    return outs[0], group, outs
