"""The sharded verify step with the folded escalation, priced as the other verifiers are
(:mod:`.verify_cost`): measured per-rank compute plus each all-gather on the PCIe collective
model, bytes from the plan's own buffer shapes.

The folded escalation (``verify/escalate/folded.py``, ``StepPlan.escalation == "folded"``)
replaces the whole-row round of a top-p step (``E x S x 2`` bytes per rank, one shard row per
request) by one all-gather of ``E x W2 x 4 + F x S x 2`` bytes per rank: ``W2`` further
candidates per picked row as int32 keys and ``F`` whole-row slots. Its report
(:data:`FOLDED_REPORT_NAME`, the graph-captured benchmark with ``--escalation folded``) times,
in one run on one card, the folded step (``ours_graph_us``), the whole-row step beside it
(``ours_rows_us``), vLLM's graph-captured verify step and batch-sharded sampling's busiest
rank, so all four are priced from the same card.

The round sizes are the step contract's (:mod:`vllm_kimi_ext.verify.protocol`, torch-free):
the first ``F`` escalated requests ship a whole shard row, every further one
``FOLDED_CANDIDATES`` int32 keys; at batch ``B <= F`` the folded plan is the whole-row plan.
Without the report (:data:`DEFAULT_FOLDED_REPORT`, copied in by
``bench/gpu/release_runs.py install``) nothing is priced.
"""

from __future__ import annotations

import dataclasses
import json
import math
from importlib import resources
from pathlib import Path

from vllm_kimi_ext.costmodel import verify_cost as vc
from vllm_kimi_ext.costmodel import verify_measured as vm
from vllm_kimi_ext.verify import protocol

#: Round 1 per row and rank by mode (greedy sends ``(max, argmax)``; a cut sends the
#: statistics and the default candidates as (value, id) float32).
ROUND1_BYTES = {protocol.GREEDY_MODE: protocol.GREEDY_COLUMNS * protocol.FLOAT_BYTES,
                **{m: protocol.round1_bytes_per_row()
                   for m in (*protocol.TOP_P_MODES, protocol.CUT_MODE)}}
#: Modes whose step has an escalation round (top-p without top-k).
ESCALATING = vm.KIMI_MODES
FOLDED_REPORT_NAME = "bench/reports/verify_folded.json"
DEFAULT_FOLDED_REPORT = Path(str(resources.files("vllm_kimi_ext.costmodel").joinpath(
    "profiles", "verify", "verify_folded.json")))


def folded_round_bytes(cm, slots: int, folded: int = protocol.FOLDED_CANDIDATES,
                       row_slots: int = protocol.DEFAULT_FOLDED_ROW_SLOTS) -> int:
    """Bytes one rank sends in the folded escalation's all-gather
    (:func:`vllm_kimi_ext.verify.protocol.folded_round_bytes` at the model's shard width)."""
    row = math.ceil(cm.model.vocab_size / cm.tp)
    return protocol.folded_round_bytes(slots, folded, row_slots, row, cm.model.dtype_bytes)


@dataclasses.dataclass(frozen=True)
class FoldedMeasurements:
    """The folded report: its cases as :class:`.verify_cost.VerifyMeasurements` (ours = the
    folded step) and the whole-row step measured beside it, per ``(k, mode, rows)``."""

    meas: vm.VerifyMeasurements
    rows_us: dict

    def rows_at(self, k: int, mode: str, rows: float) -> float | None:
        pts = sorted((r, us) for (kk, m, r), us in self.rows_us.items() if kk == k and m == mode)
        for (r0, y0), (r1, y1) in zip(pts, pts[1:] + pts[-1:]):
            if rows == r0:
                return y0
            if r0 < rows < r1:
                return y0 + (y1 - y0) * (rows - r0) / (r1 - r0)
        return None


def load_folded(path: str | Path | None = None) -> FoldedMeasurements | None:
    """The folded report (default: the package's copy), or None when it does not exist; a
    broken one is a one-line :class:`.verify_measured.VerifyReportError`."""
    path = Path(path) if path is not None else DEFAULT_FOLDED_REPORT
    if not path.is_file():
        return None
    meas = vm.load_report(path)
    return parse_folded(json.loads(path.read_text(encoding="utf-8")), meas, str(path))


def parse_folded(doc: dict, meas: vm.VerifyMeasurements, path: str) -> FoldedMeasurements:
    """The whole-row step's times beside the folded one (``ours_rows_us``), checked."""
    rows_us = {}
    for i, c in enumerate(doc["cases"]):
        us = c.get("ours_rows_us")
        if us is not None:
            if not isinstance(us, (int, float)) or us <= 0:
                raise vm.VerifyReportError(f"{path}: cases[{i}]: field 'ours_rows_us' must be "
                                           f"a positive number of microseconds, got {us!r}")
            rows_us[(c["k"], c["mode"], c["rows"])] = float(us)
    return FoldedMeasurements(meas, rows_us)


def _price(cm, name: str, batch: int, k: int, mode: str, compute: float | None,
           rounds: tuple[int, ...], note: str) -> vc.VerifyPrice:
    rows = batch * (k + 1)
    if compute is None:
        return vc.VerifyPrice(name, batch, k, mode, rows, rows, None, 0.0, 0, 0.0, 0.0,
                              vc.NOT_PRICED)
    sent = sum(rounds)
    comm = sum(vc._allgather_us(cm, b * cm.tp) for b in rounds)
    return vc.VerifyPrice(name, batch, k, mode, rows, rows, compute, comm, len(rounds), sent,
                          sent * (cm.tp - 1), note)


def price_folded(cm, fm: FoldedMeasurements | None, batch: int, k: int,
                 mode: str) -> vc.VerifyPrice:
    """The sharded step with the folded escalation: round 1 and (top-p modes) the folded
    round, one NCCL all-gather each; compute measured (the report's ``ours_graph_us``)."""
    rows = batch * (k + 1)
    compute = None if fm is None else fm.meas.at(k, mode, rows, "ours_graph_us")
    r = [rows * ROUND1_BYTES[mode]]
    if mode in ESCALATING:
        r.append(folded_round_bytes(cm, batch))
    return _price(cm, "sharded_folded", batch, k, mode, compute, tuple(r),
                  f"{len(r)} NCCL all-gather(s), folded escalation "
                  f"({protocol.FOLDED_CANDIDATES} further candidates per escalated row "
                  f"after the first {protocol.DEFAULT_FOLDED_ROW_SLOTS}, whole rows for those)")


def price_rows(cm, fm: FoldedMeasurements | None, batch: int, k: int,
               mode: str) -> vc.VerifyPrice:
    """The sharded step with the whole-row escalation measured beside it (top-p modes; the
    other modes have no escalation, so their step is the folded report's own)."""
    rows = batch * (k + 1)
    if mode not in ESCALATING:
        p = price_folded(cm, fm, batch, k, mode)
        return dataclasses.replace(p, verifier="sharded_rows")
    compute = None if fm is None else fm.rows_at(k, mode, rows)
    row = math.ceil(cm.model.vocab_size / cm.tp) * cm.model.dtype_bytes
    return _price(cm, "sharded_rows", batch, k, mode, compute,
                  (rows * ROUND1_BYTES[mode], batch * row),
                  "2 NCCL all-gathers, whole-row escalation (one shard row per request)")


#: The four verify steps of the goal table, in its column order.
GOAL_COLUMNS = ("sharded_folded", "sharded_rows", "stock", "batch_sharded")


def goal_prices(cm, fm: FoldedMeasurements, batch: int, k: int, mode: str) -> dict:
    """The four verify steps priced at ``batch`` (stock and batch-sharded from the same
    report, so the same card)."""
    return {"sharded_folded": price_folded(cm, fm, batch, k, mode),
            "sharded_rows": price_rows(cm, fm, batch, k, mode),
            "stock": vc.price_stock(cm, fm.meas, batch, k, mode),
            "batch_sharded": vc.price_batch_sharded(cm, fm.meas, batch, k, mode)}


def best_sharded(cm, fm: FoldedMeasurements, batch: int, k: int, mode: str) -> vc.VerifyPrice:
    """The faster priced of the two sharded steps at this batch (what a plan should pick)."""
    p = goal_prices(cm, fm, batch, k, mode)
    a, b = p["sharded_folded"], p["sharded_rows"]
    if a.total_us is None or (b.total_us is not None and b.total_us < a.total_us):
        return b
    return a


def goal(cm, fm: FoldedMeasurements, batches=range(1, 65)) -> dict:
    """The issue's goal, checked: (1) the measured sharded step (the faster of folded and
    whole rows per cell) at least 2x vLLM's graph-captured step in every measured cell;
    (2) the priced sharded step (the faster of the two) ahead of batch-sharded sampling at
    every priced batch under both of Kimi's top-p settings. Returns the cells that miss."""
    slow_cells, behind = [], []
    for c in fm.meas.cases:
        ours = c.ours_graph_us
        rows_us = fm.rows_us.get((c.k, c.mode, c.rows))
        best = min(ours, rows_us) if rows_us else ours
        if c.vllm_graph_us / best < 2.0:
            slow_cells.append(f"k={c.k} rows={c.rows} {c.mode}: {c.vllm_graph_us / best:.2f}x")
    for k in sorted({c.k for c in fm.meas.cases}):
        for mode in ESCALATING:
            for b in batches:
                s = best_sharded(cm, fm, b, k, mode)
                bs = vc.price_batch_sharded(cm, fm.meas, b, k, mode)
                if s.priced and bs.priced and s.total_us >= bs.total_us:
                    behind.append(f"k={k} {mode} batch {b}: {s.total_us:.0f} vs "
                                  f"{bs.total_us:.0f} us")
    return {"below_2x_vllm": slow_cells, "behind_batch_sharded": behind,
            "reached": not slow_cells and not behind}


def goal_markdown(cm, fm: FoldedMeasurements | None,
                  batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)) -> list[str]:
    """Per k, Kimi mode and batch: the four verify steps priced (µs per rank: measured compute
    + PCIe all-gathers) and the bytes each rank sends."""
    if fm is None:
        return [f"{vc.NOT_PRICED}: no folded-escalation report ({FOLDED_REPORT_NAME})."]
    out = ["| k | sampling | batch | folded µs | whole rows µs | stock µs | batch-sharded µs "
           "| folded B/rank sent | whole rows B/rank sent | batch-sharded B/rank recv |",
           "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for k in sorted({c.k for c in fm.meas.cases}):
        for mode in ESCALATING:
            for b in batches:
                p = goal_prices(cm, fm, b, k, mode)
                if not all(x.priced for x in p.values()):
                    continue
                out.append(f"| {k} | {mode} | {b} | "
                           + " | ".join(f"{p[v].total_us:,.0f}" for v in GOAL_COLUMNS)
                           + f" | {p['sharded_folded'].sent_bytes_per_rank:,.0f} | "
                           f"{p['sharded_rows'].sent_bytes_per_rank:,.0f} | "
                           f"{p['batch_sharded'].received_bytes_per_rank:,.0f} |")
    g = goal(cm, fm)
    out += ["", f"Measured on {fm.meas.hardware_text()} ({fm.meas.date}, {FOLDED_REPORT_NAME}); "
            "communication: the PCIe model's NCCL all-gather per round. Goal "
            + ("reached." if g["reached"] else
               f"not reached: {len(g['below_2x_vllm'])} measured cell(s) below 2x vLLM's graph "
               f"step, {len(g['behind_batch_sharded'])} priced batch(es) behind batch-sharded "
               "sampling.")]
    return out


DOCS_BEGIN = "<!-- BEGIN GENERATED: verify-folded (bench/gpu/release_runs.py install) -->"
DOCS_END = "<!-- END GENERATED: verify-folded -->"


def docs_text(text: str, cm, fm: FoldedMeasurements | None) -> str:
    """``text`` (docs/sharded-verification.md) with its generated folded-escalation block
    replaced by :func:`goal_markdown`; ValueError when the markers are missing."""
    try:
        a = text.index(DOCS_BEGIN) + len(DOCS_BEGIN)
        b = text.index(DOCS_END, a)
    except ValueError:
        raise ValueError(f"no {DOCS_BEGIN!r} ... {DOCS_END!r} block") from None
    return text[:a] + "\n" + "\n".join(goal_markdown(cm, fm)) + "\n" + text[b:]
