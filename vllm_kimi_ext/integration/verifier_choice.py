"""Per verification step, with both sharded verification and vLLM's batch-sharded sampling
on: which of the two verifies it.

Neither verifier is the faster one at every batch. Measured per rank on one H200 and priced
with the PCIe collective model (``costmodel.verify_cost``, run by ``nox -s docs``, which writes
the thresholds into :data:`HANDOVER_DATA`: serving reads them and never imports the cost
model), the sharded step is shorter for
greedy, temperature and top-k / min-p steps at every priced batch, and for top-p steps up
to a crossover batch (k = 3: from batch 3 at T = 1.0 and batch 4 at T = 0.6 batch-sharded
sampling is shorter; k = 7: from 5 and 6), because each top-p request whose cut round 1
cannot certify gathers a whole vocabulary shard row. With both switched on
(``VLLM_KIMI_EXT_SHARDED_VERIFY=1`` and ``--enable-batch-sharded-sampling``) the gate asks
:meth:`VerifierChoice.batch_sharded` for every step it would verify over vocabulary shards;
a step it hands over runs vLLM's own ``GPUModelRunner.sample`` with its batch sharder, as
if the plugin were off. Both are exact, so the choice changes time, never tokens.

The choice reads only host facts every rank shares (the step's :class:`StepPlan` and the
requests' ``SamplingParams``), so all ranks take the same path and issue the same
collectives. ``VLLM_KIMI_EXT_SHARDED_VERIFY_HANDOFF`` overrides the priced crossover (a
request count, or ``off``); where the report has no measurement for the runner's k, every
step goes to batch-sharded sampling (what the user enabled), logged once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from vllm_kimi_ext.verify.protocol import (
    CUT_MODE,
    GREEDY_MODE,
    STEP_MODES,
    TOP_P_MODES,
    StepPlan,
    step_mode,
)

#: Every mode a step can be priced in.
MODES = STEP_MODES
#: The per-k, per-mode handover thresholds, package data written by ``nox -s docs`` from the
#: measured verify report (``costmodel/verify_report.py``); a stale copy fails
#: ``nox -s docs -- --check``.
HANDOVER_DATA = Path(str(resources.files("vllm_kimi_ext.integration").joinpath(
    "handover.json")))


class HandoverDataError(ValueError):
    """The handover thresholds file cannot be used; the message names the file and field."""


def load_handover(path: Path = HANDOVER_DATA) -> dict:
    """:data:`HANDOVER_DATA`, checked: ``{"source": str, "k": {k: {mode: {"from": int >= 1
    or null, "priced": bool}}}}``."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise HandoverDataError(f"{path.name}: unreadable ({type(e).__name__})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("k"), dict):
        raise HandoverDataError(f"{path.name}: k: expected an object of k -> modes")
    for k, modes in doc["k"].items():
        for mode in MODES:
            cell = modes.get(mode) if isinstance(modes, dict) else None
            start = cell.get("from", 0) if isinstance(cell, dict) else 0
            ok = (isinstance(cell, dict) and isinstance(cell.get("priced"), bool)
                  and (start is None or (type(start) is int and start >= 1)))
            if not ok:
                raise HandoverDataError(f"{path.name}: k.{k}.{mode}: expected "
                                        '{"from": a request count >= 1 or null, "priced": '
                                        "true/false}")
    return doc


@dataclass(frozen=True)
class VerifierChoice:
    """From which request count each sampling mode's steps go to batch-sharded sampling.

    ``from_reqs[mode]``: the smallest request count handed over (every larger one too), or
    None for never. ``how``: where the thresholds come from, for the log line.
    """

    k: int
    from_reqs: Mapping[str, int | None]
    how: str

    def batch_sharded(self, plan: StepPlan, params: Sequence[Any]) -> bool:
        start = self.from_reqs.get(step_mode(plan, params), 1)
        return start is not None and plan.num_reqs >= start

    def describe(self) -> str:
        parts = [f"{m}: {'never' if n is None else f'from {n} requests'}"
                 for m, n in self.from_reqs.items()]
        return f"k={self.k}; " + ", ".join(parts) + f" ({self.how})"

    @classmethod
    def priced(cls, k: int, table: Mapping[str, Any] | None = None) -> VerifierChoice:
        """The crossover batches priced from the measured verify report, read from
        :data:`HANDOVER_DATA` (``table``: its parsed content instead). The file is written
        by ``nox -s docs`` with the cost model (``verify_cost.handover_table``: the smallest
        batch from which batch-sharded sampling's step is shorter at every larger priced
        batch, on the 8x RTX PRO 6000 PCIe collective model); serving only reads it. A mode
        with nothing priced at ``k``, or an unreadable file, hands over every step."""
        if table is None:
            try:
                table = load_handover()
            except HandoverDataError as e:  # fail closed: what the user enabled runs
                return cls(k, dict.fromkeys(MODES, 1), f"not priced ({e}): every step hands over")
        at_k = table.get("k", {}).get(str(k), {})
        out = {m: at_k[m]["from"] if m in at_k else 1 for m in MODES}
        unpriced = [m for m in MODES if not (m in at_k and at_k[m]["priced"])]
        how = f"forecast: {table.get('source', HANDOVER_DATA.name)}"
        if unpriced:
            how += (f"; not priced at k={k} for {', '.join(unpriced)}: every such step "
                    "hands over")
        return cls(k, out, how)

    @classmethod
    def from_setting(cls, setting: str | int, k: int,
                     table: Mapping[str, Any] | None = None) -> VerifierChoice:
        """``VLLM_KIMI_EXT_SHARDED_VERIFY_HANDOFF``'s value: ``"auto"`` (:meth:`priced`),
        0 (never) or a request count N (top-p / min-p steps of N or more requests; steps
        that cannot escalate stay sharded, as every priced batch says)."""
        if setting == "auto":
            return cls.priced(k, table)
        n = int(setting)
        top = None if n == 0 else n
        return cls(k, {**{m: top for m in TOP_P_MODES}, GREEDY_MODE: None, CUT_MODE: None},
                   "VLLM_KIMI_EXT_SHARDED_VERIFY_HANDOFF=" + ("off" if n == 0 else str(n)))


class VerifierChoices:
    """One runner's :class:`VerifierChoice` per ``k`` drafts per step, made on first use
    (``VLLM_KIMI_EXT_SHARDED_VERIFY_HANDOFF`` is read then) and logged once."""

    def __init__(self, log: logging.Logger | None = None):
        self._by_k: dict[int, VerifierChoice] = {}
        self._log = log or logging.getLogger("vllm_kimi_ext.verify")

    def for_k(self, k: int) -> VerifierChoice:
        if k not in self._by_k:
            from vllm_kimi_ext import envs

            self._by_k[k] = VerifierChoice.from_setting(envs.SHARDED_VERIFY_HANDOFF.get(), k)
            self._log.info("vllm-kimi-ext sharded verification with "
                           "--enable-batch-sharded-sampling: steps go to batch-sharded "
                           "sampling per sampling mode, %s", self._by_k[k].describe())
        return self._by_k[k]
