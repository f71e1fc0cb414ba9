"""Collective accounting: calls and bytes of vLLM's group collectives, per phase.

All tensor-parallel communication in vLLM goes through the methods of
``vllm.distributed.parallel_state.GroupCoordinator`` (``tensor_model_parallel_*``
in ``communication_op.py`` are thin wrappers over ``get_tp_group().<op>``).
:class:`CollectiveCounter` wraps those methods with a runtime patch
(``runtime/group_coordinator.py``, installed by the first ``start()`` through the
installer ``vllm_kimi_ext.runtime`` registers on import) and records,
for every call that really communicates (``world_size > 1``; vLLM bypasses a
1-rank group without communicating, and so do we), the group, the operation,
the phase label in force and the payload bytes this rank contributes
(``input.numel() * element_size``; for ``all_gather`` that is the local shard,
for ``all_reduce`` the whole buffer).

Phases are labels pushed with ``counter.phase("draft")``; unlabelled calls count
as ``"target"``. The counter is process-local: under tensor parallelism each
rank counts its own calls (they are identical by construction of SPMD code,
which the tests check).

In a serving process (``VLLM_KIMI_EXT_COUNT_COLLECTIVES=N``) :func:`start_live_counting`
runs one counter for the process's life; the model-runner patch labels the draft
phase (:func:`label_draft_phase`) and reports every N steps (:func:`live_step_done`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

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
        return (sum(t.numel() * t.element_size() for t in obj), tuple(obj[0].shape),
            str(obj[0].dtype))
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


def counted_call(group: Any, op: str, original: Any, args: tuple, kwargs: dict) -> Any:
    """Run ``original(group, *args, **kwargs)`` (a ``GroupCoordinator`` collective),
    recording it in the active counter; the body of
    :class:`~vllm_kimi_ext.runtime.group_coordinator.GroupCoordinatorCounting`.

    Only the outermost call counts: e.g. ``broadcast_tensor_dict`` may call
    ``broadcast`` internally, which is one collective to the caller."""
    counter = CollectiveCounter._active
    outermost = not getattr(_nesting, "depth", 0)
    if counter is not None and outermost and group.world_size > 1:
        counter.record(group.unique_name, op, args, kwargs)
    _nesting.depth = getattr(_nesting, "depth", 0) + 1
    try:
        return original(group, *args, **kwargs)
    finally:
        _nesting.depth -= 1


#: Installs the ``GroupCoordinator`` runtime patch that feeds :func:`counted_call`.
#: ``vllm_kimi_ext.runtime`` registers it when imported (runtime depends on this module,
#: never the reverse).
_group_patch_installer: Callable[[], object] | None = None


def register_group_patch_installer(install: Callable[[], object]) -> None:
    """Called by ``vllm_kimi_ext.runtime`` at import: how :meth:`CollectiveCounter.start`
    gets vLLM's collectives wrapped."""
    global _group_patch_installer
    _group_patch_installer = install


def _install_group_patch() -> None:
    """The wrappers are inert while no counter is active, so the patch stays installed.
    Fails closed: a counter with no patch to feed it would count nothing."""
    if _group_patch_installer is None:
        raise RuntimeError("CollectiveCounter.start(): no GroupCoordinator counting patch is "
                           "registered; import vllm_kimi_ext.runtime first (the plugin does)")
    _group_patch_installer()


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


# ---- live counting in a serving process (VLLM_KIMI_EXT_COUNT_COLLECTIVES=N) ----
_live: dict[str, StepReporter] = {}


def start_live_counting(every: int) -> StepReporter:
    """Count this process's collectives from now on and report every ``every``
    steps (re-entrant: the first call's reporter stays)."""
    if "reporter" not in _live:
        counter = CollectiveCounter._active or CollectiveCounter().start()
        _live["reporter"] = StepReporter(counter, every=every)
    return _live["reporter"]


def stop_live_counting() -> None:
    reporter = _live.pop("reporter", None)
    if reporter is not None:
        reporter.counter.stop()


def live_step_done() -> None:
    """One model-runner step finished (no-op unless live counting runs)."""
    reporter = _live.get("reporter")
    if reporter is not None:
        reporter.step_done()


def label_draft_phase(runner: Any) -> None:
    """Label the collectives of ``runner.speculator.propose`` as phase ``"draft"``
    (wraps the speculator instance's bound method once; vLLM's speculators are
    different classes, one instance per runner)."""
    spec = getattr(runner, "speculator", None)
    if spec is None or getattr(spec, "_kimi_ext_labelled", False):
        return
    inner = spec.propose

    @functools.wraps(inner)
    def propose(*args, **kwargs):
        with phase("draft"):
            return inner(*args, **kwargs)

    spec.propose = propose
    spec._kimi_ext_labelled = True
