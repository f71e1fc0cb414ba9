"""Per verification step, with both sharded verification and vLLM's batch-sharded sampling
on: which of the two verifies it.

Neither verifier is the faster one at every batch. Measured per rank on one H200 and priced
with the PCIe collective model (``costmodel.verify_cost``), the sharded step is shorter for
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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vllm_kimi_ext.verify.step_plan import StepPlan, _get

#: Measured top-p modes of the verify report and their temperatures
#: (``costmodel.verify_cost.MODE_TEMPERATURE``; a test keeps the two equal).
TOP_P_MODES = {"top_p_T1": 1.0, "top_p_T0.6": 0.6}
#: The modes of a step that cannot escalate: every row greedy, or a cut round 1 certifies.
GREEDY_MODE, CUT_MODE = "greedy", "topk_minp"
#: Every mode a step can be priced in.
MODES = (*TOP_P_MODES, GREEDY_MODE, CUT_MODE)
#: :meth:`VerifierChoice.priced`'s default: the packaged measured report.
PACKAGED_REPORT = object()


def step_mode(plan: StepPlan, params: Sequence[Any]) -> str:
    """The verify report's sampling mode whose measurements price this step.

    A step with escalation slots (a top-p or min-p row without top-k) is priced as top-p
    at the measured temperature nearest the highest temperature among its sampling rows
    (ties go to the higher, slower one); a step without is ``greedy`` when every row is
    greedy, else ``topk_minp``.
    """
    if plan.escalation_slots == 0:
        return GREEDY_MODE if plan.all_greedy else CUT_MODE
    # the plan's own reading of a request's temperature (None or 0: greedy)
    temps = [float(_get(p, "temperature", 1.0) or 0.0) for p in params]
    t = max((x for x in temps if x > 0), default=1.0)
    return min(TOP_P_MODES, key=lambda m: (abs(TOP_P_MODES[m] - t), -TOP_P_MODES[m]))


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
    def priced(cls, k: int, cm: Any = None, meas: Any = PACKAGED_REPORT) -> VerifierChoice:
        """The crossover batches the cost model prices from the measured verify report
        (``verify_cost.crossover``: the smallest batch from which batch-sharded sampling's
        step is shorter at every larger priced batch), on the 8x RTX PRO 6000 PCIe
        collective model. A mode with nothing priced at ``k`` (or ``meas=None``: no report)
        hands over every step."""
        from vllm_kimi_ext.costmodel import verify_cost as vc

        if cm is None:
            from vllm_kimi_ext.costmodel.model import CostModel
            from vllm_kimi_ext.costmodel.report import PCIE

            cm = CostModel.build(PCIE)
        if meas is PACKAGED_REPORT:
            try:
                meas = vc.measurements()
            except vc.VerifyReportError as e:  # an unreadable packaged report: fail closed
                return cls(k, dict.fromkeys(MODES, 1),
                           f"not priced ({e}): every step hands over")
        found = {mode: vc.handover(cm, meas, k, mode) for mode in MODES}
        out = {mode: start for mode, (start, _) in found.items()}
        unpriced = [mode for mode, (_, priced) in found.items() if not priced]
        how = ("forecast: measured per-rank steps "
               f"({vc.REPORT_NAME}) + the PCIe collective model")
        if unpriced:
            how += f"; not priced at k={k} for {', '.join(unpriced)}: every such step " \
                   "hands over"
        return cls(k, out, how)

    @classmethod
    def from_setting(cls, setting: str | int, k: int, **priced: Any) -> VerifierChoice:
        """``VLLM_KIMI_EXT_SHARDED_VERIFY_HANDOFF``'s value: ``"auto"`` (:meth:`priced`),
        0 (never) or a request count N (top-p / min-p steps of N or more requests; steps
        that cannot escalate stay sharded, as every priced batch says)."""
        if setting == "auto":
            return cls.priced(k, **priced)
        n = int(setting)
        top = None if n == 0 else n
        return cls(k, {**{m: top for m in TOP_P_MODES}, GREEDY_MODE: None, CUT_MODE: None},
                   "VLLM_KIMI_EXT_SHARDED_VERIFY_HANDOFF=" + ("off" if n == 0 else str(n)))
