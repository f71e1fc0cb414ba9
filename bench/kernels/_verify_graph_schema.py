"""The JSON report of ``bench_verify_graph.py`` as dataclasses, checked with
:func:`bench.harness.schema.validate` (not a benchmark itself: ``nox -s bench`` skips
``_``-prefixed files).

The cost model reads ``rows``, ``k``, ``mode``, ``temperature``, ``top_p``,
``ours_graph_us``, ``vllm_graph_us``, ``payload_bytes_per_row_per_rank`` and ``rounds``
(``vllm_kimi_ext.costmodel.verify_cost``); those keep their names and meaning. A dry run
(``--dry-run``: CPU, tiny vocabulary, nothing timed) writes the same shape with every
time ``null`` and ``dry_run: true``; :func:`problems` refuses null times otherwise.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from bench.harness.schema import validate

Mode = Literal["top_p_T1", "top_p_T0.6", "greedy", "topk_minp"]


@dataclasses.dataclass
class Timing:
    """One side of a case: the median over alternating rounds of per-step graph times."""

    median_us: float
    round_medians_us: list[float]
    min_us: float
    rounds: int
    steps_per_graph: int


@dataclasses.dataclass
class Reference:
    """Rank 0's output against the plain full-logits reference verifier."""

    requests: int
    identical: int
    certified_flips: int
    score_ties: int
    deferred_requests: int


@dataclasses.dataclass
class Traffic:
    """One verifier's collectives in one verify step, per rank (the busiest rank's
    ``received``, the most any rank ``sent``)."""

    collectives: int
    sent: int
    received: int
    detail: str


@dataclasses.dataclass
class BytesPerRank:
    ours: Traffic
    vllm_logits_gather: Traffic
    batch_sharded: Traffic


@dataclasses.dataclass
class Case:
    rows: int
    k: int
    mode: Mode
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    bytes_per_rank: BytesPerRank
    #: Rows the busiest rank verifies under vLLM's batch-sharded sampling.
    batch_sharded_rows: int
    payload_bytes_per_row_per_rank: float | None = None
    rounds: int | None = None
    plan: str | None = None
    uncertified_rows: int | None = None
    deferred_rows: int | None = None
    graph_equals_eager: bool | None = None
    reference: Reference | None = None
    ours_graph_us: float | None = None
    ours_graph: Timing | None = None
    #: Our step with the escalation kernel it had before the split one (null: not run).
    ours_old_escalation_us: float | None = None
    ours_old_escalation: Timing | None = None
    old_escalation_equals_new: bool | None = None
    vllm_graph_us: float | None = None
    vllm_graph: Timing | None = None
    #: vLLM's batch-sharded per-rank work for the same rows (busiest rank).
    batch_sharded_us: float | None = None
    batch_sharded_graph: Timing | None = None
    #: The busiest rank's batch-sharded tokens equal vLLM's full-batch step's for its requests.
    batch_sharded_equals_vllm: bool | None = None
    speedup_vs_vllm: float | None = None
    speedup_vs_batch_sharded: float | None = None
    ours_error: str | None = None
    vllm_error: str | None = None
    batch_sharded_error: str | None = None
    ours_old_escalation_error: str | None = None
    #: ``--escalation folded``: the whole-row step beside the folded one (ours).
    ours_rows_us: float | None = None
    ours_rows: Timing | None = None
    ours_rows_bytes_sent: int | None = None
    ours_rows_equals_ours: bool | None = None
    ours_rows_error: str | None = None


@dataclasses.dataclass
class Report:
    provenance: dict[str, Any]
    logits: str
    cases: list[Case]
    hardware: str
    setup: str
    versions: dict[str, Any]
    date: str
    timing_rounds: int
    steps_per_graph: int
    vocab_size: int
    tp: int
    dry_run: bool
    #: What the vLLM side runs, in words (which of vLLM's decisions it reproduces).
    vllm_method: str
    #: Why the old escalation was not measured (null when it was, or nothing needed it).
    old_escalation: str | None = None
    #: A dry run: which of vLLM's kernels ran (by Triton's interpreter) and which did not.
    dry_run_note: str | None = None
    #: Written only by a run whose report broke this schema (never accepted).
    schema_problems: list[str] | None = None


TIMED = ("ours_graph_us", "vllm_graph_us", "batch_sharded_us")


def problems(doc: Any) -> list[str]:
    """Everything wrong with a report (empty: valid): the field types, then per case the
    times a real run must have (a dry run must have none) and a consistent speed-up."""
    out = validate(doc, Report)
    if out:
        return out
    if doc.get("schema_problems"):
        out.append(f"$.schema_problems: the run found {len(doc['schema_problems'])} "
                   f"problem(s), first: {doc['schema_problems'][0]}")
    for i, c in enumerate(doc["cases"]):
        where = f"$.cases[{i}]"
        failed = any(c.get(e) for e in ("ours_error", "ours_old_escalation_error",
                                         "vllm_error", "batch_sharded_error",
                                         "ours_rows_error"))
        for field in TIMED:
            v = c.get(field)
            if doc["dry_run"] and v is not None:
                out.append(f"{where}.{field}: a dry run times nothing, got {v}")
            elif not doc["dry_run"] and not failed and (v is None or v <= 0):
                out.append(f"{where}.{field}: expected a positive time, got {v}")
        if (c.get("speedup_vs_vllm") is not None and c.get("ours_graph_us") and
                c.get("vllm_graph_us")):
            want = c["vllm_graph_us"] / c["ours_graph_us"]
            if abs(c["speedup_vs_vllm"] - want) > 1e-9 * max(1.0, want):
                out.append(f"{where}.speedup_vs_vllm: expected vllm_graph_us / ours_graph_us "
                           f"= {want}, got {c['speedup_vs_vllm']}")
        if c["rows"] % (c["k"] + 1):
            out.append(f"{where}: rows {c['rows']} is not a multiple of k + 1 = {c['k'] + 1}")
    return out


def as_measured(dry_doc: dict, ours_us: float = 10.0, other_us: float = 20.0) -> dict:
    """A copy of a dry-run report with made-up times in every case (``ours_us`` for ours,
    ``other_us`` for the rest): for tests of the report's readers, never for a report."""
    doc = json.loads(json.dumps(dry_doc))
    doc["dry_run"] = False
    for c in doc["cases"]:
        for f in TIMED:
            c[f] = other_us
        c["ours_graph_us"] = ours_us
        c["speedup_vs_vllm"] = other_us / ours_us
    return doc

