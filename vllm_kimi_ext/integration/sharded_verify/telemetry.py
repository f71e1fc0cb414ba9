"""What one runner's sharded verification counts: steps verified over shards, steps handed
to batch-sharded sampling, fallbacks per reason (debug-logged each), missing vLLM
attributes (warned once each), escalated rows and deferred requests (accumulated on the
device: no host read per step), and a summary line every 1000 steps."""

from __future__ import annotations

import logging
from typing import Any

from vllm_kimi_ext.verify.protocol import Fallback, FallbackCounter, StepPlan

from .gate import HANDED_OVER, NOT_FALLBACKS, UNKNOWN_VLLM_STATE

#: Steps (sharded or handed over) between two summary lines.
LOG_EVERY = 1000


class Telemetry:
    """The counters of one :class:`~.sampler.ShardedSampler`."""

    def __init__(self, log: logging.Logger):
        self.log = log
        self.fallbacks = FallbackCounter(log)
        self.steps = 0
        self.handed = 0
        self._warned: set[str] = set()
        self._device: Any = None  # int64 [2] on the logits' device

    def record(self, decision: StepPlan | Fallback) -> bool:
        """Count the gate's answer; True when a summary line is due."""
        if isinstance(decision, StepPlan):
            self.steps += 1
        elif decision.reason == HANDED_OVER:
            self.handed += 1
        else:
            if decision.reason == UNKNOWN_VLLM_STATE and decision.detail not in self._warned:
                self._warned.add(decision.detail)
                self.log.warning("vllm-kimi-ext sharded verification: vLLM has no %s; every "
                                 "such step falls back to the full logits gather "
                                 "(reason unknown_vllm_state)", decision.detail)
            if decision.reason not in NOT_FALLBACKS:
                self.fallbacks.record(decision)
            return False
        return (self.steps + self.handed) % LOG_EVERY == 0

    def count_on_device(self, out: Any) -> None:
        """Rows that needed the escalation round and requests stopped at a deferred row,
        accumulated on the device (:meth:`device_counts` reads them)."""
        dev = out.uncertified.device
        if self._device is None or self._device.device != dev:
            import torch

            self._device = torch.zeros(2, dtype=torch.int64, device=dev)
        self._device[0] += out.uncertified.sum()
        self._device[1] += out.stopped.sum()

    def device_counts(self) -> dict[str, int]:
        """``{"escalated_rows": n, "deferred_requests": n}`` so far (one host read)."""
        if self._device is None:
            return {"escalated_rows": 0, "deferred_requests": 0}
        a, b = self._device.tolist()
        return {"escalated_rows": a, "deferred_requests": b}

    def summary(self, graphs: dict[str, int]) -> None:
        self.log.info("vllm-kimi-ext sharded verification: %d steps, %d handed to "
                      "batch-sharded sampling, fallbacks %s, %s, graphs %s", self.steps,
                      self.handed, self.fallbacks.as_dict(), self.device_counts(), graphs)
