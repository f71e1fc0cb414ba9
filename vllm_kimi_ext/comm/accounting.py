"""Collective accounting: calls and bytes of vLLM's group collectives, per phase.

All tensor-parallel communication in vLLM goes through the methods of
``vllm.distributed.parallel_state.GroupCoordinator`` (``tensor_model_parallel_*``
in ``communication_op.py`` are thin wrappers over ``get_tp_group().<op>``).
:class:`CollectiveCounter` wraps those methods with a runtime patch and records,
for every call that really communicates (``world_size > 1``; vLLM bypasses a
1-rank group without communicating, and so do we), the group, the operation,
the phase label in force and the payload bytes this rank contributes
(``input.numel() * element_size``; for ``all_gather`` that is the local shard,
for ``all_reduce`` the whole buffer).

Phases are labels pushed with ``counter.phase("draft")``; unlabelled calls count
as ``"target"``. The counter is process-local: under tensor parallelism each
rank counts its own calls (they are identical by construction of SPMD code,
which the tests check).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

from vllm_kimi_ext.patching import Patch

logger = logging.getLogger("vllm_kimi_ext.comm")

#: GroupCoordinator methods that move data between ranks.
COLLECTIVE_METHODS = (
    "all_reduce",
    "all_gather",
    "all_gatherv",
    "gather",
    "reduce_scatter",
    "reduce_scatterv",
    "broadcast",
    "broadcast_tensor_dict",
    "dispatch",
    "combine",
)
DEFAULT_PHASE = "target"


@dataclasses.dataclass(frozen=True)
class CollectiveCall:
    group: str  # "tp", "pp", "dp", "ep", ... (vLLM's group name without its suffix)
    op: str
    phase: str
    nbytes: int
    shape: tuple[int, ...]
    dtype: str


def _payload(args: tuple, kwargs: dict) -> tuple[int, tuple[int, ...], str]:
    import torch

    obj = args[0] if args else next(iter(kwargs.values()), None)
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size(), tuple(obj.shape), str(obj.dtype)
    if isinstance(obj, (list, tuple)) and obj and all(isinstance(t, torch.Tensor) for t in obj):
        return sum(t.numel() * t.element_size() for t in obj), tuple(obj[0].shape), \
            str(obj[0].dtype)
    if isinstance(obj, dict):
        ts = [v for v in obj.values() if isinstance(v, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in ts), (len(ts),), "dict"
    return 0, (), type(obj).__name__


def _group_kind(unique_name: str) -> str:
    return unique_name.split(":")[0]


class CollectiveCounter:
    """Records collectives while active. Use as a context manager::

        with CollectiveCounter() as cc:
            with cc.phase("verify"):
                ...
        cc.count(op="all_reduce", phase="target")
    """

    _active: CollectiveCounter | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.calls: list[CollectiveCall] = []
        self._phases: list[str] = []

    # ---- phases ----------------------------------------------------------
    @property
    def current_phase(self) -> str:
        return self._phases[-1] if self._phases else DEFAULT_PHASE

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._phases.append(name)
        try:
            yield
        finally:
            self._phases.pop()

    # ---- activation ------------------------------------------------------
    def start(self) -> CollectiveCounter:
        with CollectiveCounter._lock:
            if CollectiveCounter._active is not None and CollectiveCounter._active is not self:
                raise RuntimeError("another CollectiveCounter is already active")
            CollectiveCounter._active = self
        _install_group_patch()
        return self

    def stop(self) -> None:
        with CollectiveCounter._lock:
            if CollectiveCounter._active is self:
                CollectiveCounter._active = None

    def __enter__(self) -> CollectiveCounter:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def record(self, group: str, op: str, args: tuple, kwargs: dict) -> None:
        nbytes, shape, dtype = _payload(args, kwargs)
        self.calls.append(CollectiveCall(_group_kind(group), op, self.current_phase,
                                         nbytes, shape, dtype))

    # ---- queries ---------------------------------------------------------
    def select(self, *, op: str | None = None, phase: str | None = None,
               group: str | None = "tp") -> list[CollectiveCall]:
        return [c for c in self.calls
                if (op is None or c.op == op) and (phase is None or c.phase == phase)
                and (group is None or c.group == group)]

    def count(self, **kw: Any) -> int:
        return len(self.select(**kw))

    def nbytes(self, **kw: Any) -> int:
        return sum(c.nbytes for c in self.select(**kw))

    def summary(self) -> dict[tuple[str, str, str], tuple[int, int]]:
        """``{(group, phase, op): (calls, bytes)}``."""
        calls: Counter = Counter()
        nbytes: Counter = Counter()
        for c in self.calls:
            key = (c.group, c.phase, c.op)
            calls[key] += 1
            nbytes[key] += c.nbytes
        return {k: (calls[k], nbytes[k]) for k in sorted(calls)}

    def format_summary(self) -> str:
        rows = [f"{g:>4} {p:<8} {o:<22} {n:>6} calls {b:>12,d} B"
                for (g, p, o), (n, b) in self.summary().items()]
        return "\n".join(rows) if rows else "(no collectives)"

    def clear(self) -> None:
        self.calls.clear()


def active_counter() -> CollectiveCounter | None:
    return CollectiveCounter._active


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Label collectives of the active counter (no-op when none is active)."""
    counter = CollectiveCounter._active
    if counter is None:
        yield
        return
    with counter.phase(name):
        yield


_nesting = threading.local()


def _make_wrapper(op: str):
    def wrapper(self, *args, **kwargs):
        counter = CollectiveCounter._active
        outermost = not getattr(_nesting, "depth", 0)
        if counter is not None and outermost and self.world_size > 1:
            # only the outermost call counts: e.g. broadcast_tensor_dict may
            # call broadcast internally, which is one collective to the caller
            counter.record(self.unique_name, op, args, kwargs)
        _nesting.depth = getattr(_nesting, "depth", 0) + 1
        try:
            return GroupCoordinatorCounting.original(op)(self, *args, **kwargs)
        finally:
            _nesting.depth -= 1

    wrapper.__name__ = op
    wrapper.__qualname__ = f"GroupCoordinatorCounting.{op}"
    return wrapper


_PATCH_CLASS: type | None = None


def _install_group_patch() -> None:
    """Patch GroupCoordinator once per process; the wrappers are inert while
    no counter is active, so the patch can stay installed."""
    global _PATCH_CLASS, GroupCoordinatorCounting
    if _PATCH_CLASS is None:
        from vllm.distributed.parallel_state import GroupCoordinator

        methods = {op: _make_wrapper(op) for op in COLLECTIVE_METHODS
                   if hasattr(GroupCoordinator, op)}
        _PATCH_CLASS = type("GroupCoordinatorCounting", (Patch,),
                            {"_target": GroupCoordinator, **methods})
        GroupCoordinatorCounting = _PATCH_CLASS
    _PATCH_CLASS.apply()


GroupCoordinatorCounting: Any = None  # set by _install_group_patch


class StepReporter:
    """Logs the counter's per-step collectives every ``every`` steps (live server)."""

    def __init__(self, counter: CollectiveCounter, every: int = 100) -> None:
        self.counter = counter
        self.every = max(1, every)
        self.steps = 0
        self._mark = 0

    def step_done(self) -> None:
        self.steps += 1
        if self.steps % self.every:
            return
        window = self.counter.calls[self._mark:]
        self._mark = len(self.counter.calls)
        by_phase: Counter = Counter()
        by_phase_bytes: Counter = Counter()
        for c in window:
            by_phase[c.phase] += 1
            by_phase_bytes[c.phase] += c.nbytes
        per_step = ", ".join(
            f"{p}: {by_phase[p] / self.every:.1f} calls {by_phase_bytes[p] / self.every:,.0f} B"
            for p in sorted(by_phase)) or "none"
        logger.info("vllm-kimi-ext collectives per step (last %d steps): %s", self.every, per_step)
        # keep memory bounded on a long-running server
        if len(self.counter.calls) > 1_000_000:
            self.counter.calls = self.counter.calls[self._mark:]
            self._mark = 0
