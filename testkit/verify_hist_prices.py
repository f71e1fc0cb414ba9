"""The histogram escalation's prices (not shipped: see ``testkit/verify_hist_step.py``): its
all-gathers per escalated row on the PCIe collective model next to the whole-row
escalation's, and the sharded top-p step with each escalation, its compute from the
measured reports (``bench/reports/verify_hist_h200.json`` for the histogram step). The table
``docs/sharded-verification.md`` shows is :func:`escalation_markdown`'s at :data:`DOC_BATCHES`:

    python -m testkit.verify_hist_prices --write-docs docs/   # (``nox -s docs`` runs it)
    python -m testkit.verify_hist_prices --check-docs docs/   # exit 1 when it is stale
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from testkit.verify_hist_step import DEFAULT_ROW_FALLBACK_SLOTS, hist_round_bytes
from vllm_kimi_ext.costmodel.verify_cost import (
    DEFAULT_MODE,
    NOT_PRICED,
    VerifyPrice,
    _allgather_us,
    price_batch_sharded,
)
from vllm_kimi_ext.costmodel.verify_measured import VerifyMeasurements, measurements
from vllm_kimi_ext.verify import protocol

#: The escalations priced side by side: the package's and the test kit's.
#: The whole-row escalation (the package's default) and the test kit's histogram one.
ESCALATIONS = (protocol.ESCALATIONS[0], "hist")
#: The graph-captured benchmark run with ``--escalation hist`` (k = 3, Kimi's two top-p
#: modes): the step with the histogram escalation.
HIST_REPORT_NAME = "bench/reports/verify_hist_h200.json"
HIST_REPORT = Path(__file__).resolve().parents[1] / HIST_REPORT_NAME
#: The batches of the table in ``docs/sharded-verification.md``.
DOC_BATCHES = (1, 8, 16, 32, 64)
DOC = "sharded-verification.md"


def hist_measurements(path: str | Path | None = None) -> VerifyMeasurements | None:
    """The histogram escalation's measured report (default :data:`HIST_REPORT`), or None."""
    return measurements(path if path is not None else HIST_REPORT)

#: What the escalation's price is made of.
ESCALATION_TIME_NOTE = ("modelled, not measured: its all-gathers priced on the PCIe model; "
                        "no GPU timing of the histogram escalation at these rows, so the step's "
                        "compute is the measured step with the whole-row escalation")
#: ... and where the histogram step itself was measured.
ESCALATION_MEASURED_NOTE = (f"its compute measured on one H200 ({HIST_REPORT_NAME}, CUDA graph), "
                            "its all-gathers priced on the PCIe model")


@dataclasses.dataclass(frozen=True)
class EscalationPrice:
    """The escalation rounds of one sharded top-p step (every request's first row escalated:
    ``slots = B``), per rank, on the PCIe collective model."""

    escalation: str
    batch: int
    slots: int
    rounds: tuple[tuple[str, int], ...]  # (name, bytes sent per rank)
    comm_us: float

    @property
    def bytes_per_rank(self) -> int:
        return sum(b for _, b in self.rounds)

    @property
    def bytes_per_escalated_row_per_rank(self) -> float:
        return self.bytes_per_rank / max(self.slots, 1)


def price_escalation(cm, batch: int, escalation: str, slots: int | None = None
                     ) -> EscalationPrice:
    """The escalation's all-gathers at ``batch`` requests (``slots``: escalation slots,
    default one per request), each priced as the existing rounds are (one NCCL all-gather
    of ``TP x`` the bytes one rank sends)."""
    if escalation not in ESCALATIONS:
        raise ValueError(f"escalation must be one of {ESCALATIONS}, not {escalation!r}")
    tp, v, b = cm.tp, cm.model.vocab_size, cm.model.dtype_bytes
    E = batch if slots is None else slots
    row = math.ceil(v / tp) * b
    if escalation == "rows":
        rounds = (("escalation", E * row),)
    else:
        F = min(DEFAULT_ROW_FALLBACK_SLOTS, E)
        rounds = tuple((name, E * w + (F * row if name.endswith("+rows") else 0))
                       for name, w in hist_round_bytes())
    return EscalationPrice(escalation, batch, E, rounds,
                           sum(_allgather_us(cm, nb * tp) for _, nb in rounds))


def price_sharded_escalation(cm, meas: VerifyMeasurements | None, batch: int, k: int,
                             mode: str, escalation: str,
                             hist_meas: VerifyMeasurements | None = None) -> VerifyPrice:
    """The sharded top-p step with the given escalation: round 1 (statistics + candidates)
    and the escalation's rounds on the PCIe model; compute: the measured step (``meas``, the
    whole-row escalation; for ``"hist"`` the step measured with it, ``hist_meas``, where that
    report has these rows, else the whole-row step's as a model, see
    :data:`ESCALATION_TIME_NOTE`). Not priced where the step is not measured."""
    tp = cm.tp
    rows = batch * (k + 1)
    esc = price_escalation(cm, batch, escalation, min(batch, rows))
    compute = None if meas is None else meas.at(k, mode, rows, "ours_graph_us")
    hist_us = None
    if escalation == "hist" and compute is not None and hist_meas is not None:
        hist_us = hist_meas.at(k, mode, rows, "ours_graph_us")
        compute = compute if hist_us is None else hist_us
    if compute is None:
        return VerifyPrice(f"sharded_{escalation}", batch, k, mode, rows, rows, None, 0.0, 0,
                           0.0, 0.0, NOT_PRICED)
    r1 = rows * protocol.round1_bytes_per_row()
    sent = r1 + esc.bytes_per_rank
    note = (f"{1 + len(esc.rounds)} NCCL all-gathers ({esc.bytes_per_escalated_row_per_rank:,.0f}"
            f" B per escalated row per rank)")
    if escalation == "hist":
        note += "; escalation " + (ESCALATION_TIME_NOTE if hist_us is None
                                   else ESCALATION_MEASURED_NOTE)
    return VerifyPrice(f"sharded_{escalation}", batch, k, mode, rows, rows, compute,
                       _allgather_us(cm, r1 * tp) + esc.comm_us, 1 + len(esc.rounds),
                       sent, sent * (tp - 1), note)


def escalation_markdown(cm, meas: VerifyMeasurements | None = None, k: int = 3,
                        mode: str = DEFAULT_MODE,
                        batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64),
                        hist_meas: VerifyMeasurements | None = None) -> list[str]:
    """The table ``docs/sharded-verification.md`` shows: bytes per escalated row per rank and
    the priced step with each escalation against batch-sharded sampling; a hist cell marked
    ``*`` is modelled (no measured histogram step at its rows)."""
    meas = meas if meas is not None else measurements()
    hist_meas = hist_meas if hist_meas is not None else hist_measurements()
    out = ["| batch | rows: B/escalated row/rank | hist: B/escalated row/rank | rows: comm µs "
           "| hist: comm µs | sharded step, rows µs | sharded step, hist µs "
           "| batch-sharded µs |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for B in batches:
        er, eh = price_escalation(cm, B, "rows"), price_escalation(cm, B, "hist")
        pr, ph = (price_sharded_escalation(cm, meas, B, k, mode, e, hist_meas)
                  for e in ESCALATIONS)
        bs = price_batch_sharded(cm, meas, B, k, mode)

        def us(p: VerifyPrice) -> str:
            if p.total_us is None:
                return "not priced"
            return f"{p.total_us:,.0f}" + ("*" if ESCALATION_TIME_NOTE in p.note else "")

        out.append(f"| {B} | {er.bytes_per_escalated_row_per_rank:,.0f} | "
                   f"{eh.bytes_per_escalated_row_per_rank:,.0f} | {er.comm_us:,.0f} | "
                   f"{eh.comm_us:,.0f} | {us(pr)} | {us(ph)} | {us(bs)} |")
    src = "no report" if hist_meas is None else f"{hist_meas.hardware_text()}, {hist_meas.date}"
    return out + ["", f"k = {k}, {mode}, one escalated row per request, {cm.tp} ranks, "
                  f"V = {cm.model.vocab_size}. The histogram step's compute is "
                  f"{ESCALATION_MEASURED_NOTE} ({src}); a cell marked * is "
                  f"{ESCALATION_TIME_NOTE}.", ""]


def update_doc(text: str, path: str) -> str:
    """``text`` (``docs/sharded-verification.md``) with its escalation table and the note
    under it priced afresh (from the header through the note; ValueError without it)."""
    from vllm_kimi_ext.costmodel.model import CostModel

    md = escalation_markdown(CostModel.build(), batches=DOC_BATCHES)
    start = text.find(md[0] + "\n")
    if start < 0:
        raise ValueError("no escalation table (its header row) to update")
    blocks = text[start:].split("\n\n", 2)  # the table, the note, the rest
    if len(blocks) < 2:
        raise ValueError("the escalation table has no note under it")
    old = blocks[0] + "\n\n" + blocks[1]
    return text[:start] + "\n".join(md[:-1]) + text[start + len(old):]


def main(argv: list[str] | None = None) -> int:
    from bench.harness.generated_docs import in_place_main

    return in_place_main("python -m testkit.verify_hist_prices",
                         "the histogram escalation's price table in " + DOC, DOC, update_doc,
                         argv)


if __name__ == "__main__":
    import sys

    sys.exit(main())
