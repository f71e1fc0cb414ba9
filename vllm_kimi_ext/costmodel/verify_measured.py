"""The measured verify-step report the cost model prices from: its schema, its loading (one
line naming the file and field for a bad one) and the rows-interpolated reading of its
per-rank step times (:class:`VerifyMeasurements`). ``bench/reports/verify_graph_vs_vllm_h200.json``
in a checkout; the package reads its copy under ``profiles/verify/`` (refreshed by
``nox -s docs``). Pricing is :mod:`.verify_cost`."""

from __future__ import annotations

import dataclasses
import functools
import json
from importlib import resources
from pathlib import Path
from typing import Any

from vllm_kimi_ext.costmodel.catalog import ProfileError, require
from vllm_kimi_ext.verify import protocol

#: Where the graph-captured verify benchmark writes its report in a source checkout.
REPORT_NAME = "bench/reports/verify_graph_vs_vllm_h200.json"
#: The package's copy of that report (package data: the installed cost model reads nothing
#: outside itself). ``nox -s docs`` refreshes it from :data:`REPORT_NAME`
#: (:mod:`.verify_report`); a test keeps the two equal.
DEFAULT_REPORT = Path(str(resources.files("vllm_kimi_ext.costmodel").joinpath(
    "profiles", "verify", "verify_graph_vs_vllm_h200.json")))
#: The step's sampling modes (:data:`.protocol.STEP_MODES`).
MODES = protocol.STEP_MODES
#: Kimi's own API: temperature 1.0 with top_p 0.95 (0.6 / 0.95 in instant mode).
KIMI_MODES = tuple(protocol.TOP_P_MODES)
class VerifyReportError(ProfileError):
    """A verify-step report that cannot be used; the message names the file and the field."""


@dataclasses.dataclass(frozen=True)
class VerifyCase:
    rows: int
    k: int
    mode: str
    temperature: float
    top_p: float | None
    ours_graph_us: float
    vllm_graph_us: float
    payload_bytes_per_row_per_rank: float
    rounds: int
    #: vLLM's batch-sharded sampling, the busiest rank's graph-captured work for these
    #: ``rows`` (shard plan, permute, verify on its owned rows, packed output); None in a
    #: report measured before the benchmark had the column.
    batch_sharded_us: float | None = None


@dataclasses.dataclass(frozen=True)
class VerifyMeasurements:
    """The measured report: per-rank verify-step times on one GPU, with its provenance."""

    cases: tuple[VerifyCase, ...]
    hardware: Any
    versions: Any
    date: str
    source: str

    def hardware_text(self) -> str:
        h = self.hardware
        if isinstance(h, dict):
            return str(h.get("gpu") or h.get("name") or json.dumps(h, sort_keys=True))
        return str(h)

    def series(self, k: int, mode: str) -> list[VerifyCase]:
        return sorted((c for c in self.cases if c.k == k and c.mode == mode),
                      key=lambda c: c.rows)

    def at(self, k: int, mode: str, rows: float, field: str) -> float | None:
        """``field`` at ``rows``: measured, or linear between the two nearest measured row
        counts; None outside the measured range (or where the field was not measured)."""
        pts = [(c.rows, float(getattr(c, field))) for c in self.series(k, mode)
               if getattr(c, field) is not None]
        for (r0, y0), (r1, y1) in zip(pts, pts[1:] + pts[-1:]):
            if rows == r0:
                return y0
            if r0 < rows < r1:
                return y0 + (y1 - y0) * (rows - r0) / (r1 - r0)
        return None

    def sharded_comm(self, k: int, mode: str, rows: float) -> tuple[float, int] | None:
        """(payload bytes per row per rank per round, rounds) of the measured row counts
        around ``rows`` (the larger of each), or None outside the measured range."""
        if self.at(k, mode, rows, "ours_graph_us") is None:
            return None
        near = self.series(k, mode)
        lo = max((c for c in near if c.rows <= rows), key=lambda c: c.rows)
        hi = min((c for c in near if c.rows >= rows), key=lambda c: c.rows)
        return (max(lo.payload_bytes_per_row_per_rank, hi.payload_bytes_per_row_per_rank),
                max(lo.rounds, hi.rounds))


# ---------------------------------------------------------------------------------------------
# Loading and the schema check
# ---------------------------------------------------------------------------------------------


def _positive_int(doc: dict, field: str, where: str) -> int:
    v = require(doc, field, int, where, "a positive integer", positive=True)
    return int(v)


def _case(doc: Any, where: str) -> VerifyCase:
    if not isinstance(doc, dict):
        raise VerifyReportError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    mode = require(doc, "mode", str, where, f"one of {', '.join(MODES)}")
    if mode not in MODES:
        raise VerifyReportError(f"{where}: field 'mode' must be one of {', '.join(MODES)}, "
                                f"got {mode!r}")
    temperature = float(require(doc, "temperature", (int, float), where, "a number >= 0"))
    if temperature < 0:
        raise VerifyReportError(f"{where}: field 'temperature' must be >= 0, got {temperature}")
    if "top_p" not in doc:
        raise VerifyReportError(f"{where}: field 'top_p' is missing (expected a number in "
                                "(0, 1], or null when off)")
    top_p = doc["top_p"]
    if top_p is not None:
        top_p = float(require(doc, "top_p", (int, float), where, "a number in (0, 1] or null"))
        if not 0.0 < top_p <= 1.0:
            raise VerifyReportError(f"{where}: field 'top_p' must be in (0, 1] or null, "
                                    f"got {top_p}")
    if mode in protocol.TOP_P_MODES:
        if abs(temperature - protocol.TOP_P_MODES[mode]) > 1e-9:
            raise VerifyReportError(f"{where}: mode {mode!r} needs temperature "
                                    f"{protocol.TOP_P_MODES[mode]:g}, got {temperature:g}")
        if top_p is None or top_p >= 1.0:
            raise VerifyReportError(f"{where}: mode {mode!r} needs a top_p below 1, "
                                    f"got {top_p!r}")
    return VerifyCase(
        rows=_positive_int(doc, "rows", where),
        k=_positive_int(doc, "k", where),
        mode=mode, temperature=temperature, top_p=top_p,
        ours_graph_us=float(require(doc, "ours_graph_us", (int, float), where,
                                    "a positive number of microseconds", positive=True)),
        vllm_graph_us=float(require(doc, "vllm_graph_us", (int, float), where,
                                    "a positive number of microseconds", positive=True)),
        payload_bytes_per_row_per_rank=float(require(
            doc, "payload_bytes_per_row_per_rank", (int, float), where,
            "a positive number of bytes", positive=True)),
        rounds=_positive_int(doc, "rounds", where),
        batch_sharded_us=_optional_us(doc, "batch_sharded_us", where),
    )


def _optional_us(doc: dict, field: str, where: str) -> float | None:
    """An optional timed column: absent or null is None, else a positive number."""
    if doc.get(field) is None:
        return None
    return float(require(doc, field, (int, float), where,
                         "a positive number of microseconds, or null", positive=True))


def parse_report(doc: Any, where: str) -> VerifyMeasurements:
    """The report's JSON checked field by field; :class:`VerifyReportError` names the first
    problem (file, field, what was expected) in one line."""
    try:
        return _parse_report(doc, where)
    except VerifyReportError:
        raise
    except ProfileError as exc:  # from catalog.require
        raise VerifyReportError(str(exc)) from None


def _parse_report(doc: Any, where: str) -> VerifyMeasurements:
    if not isinstance(doc, dict):
        raise VerifyReportError(f"{where}: expected a JSON object at the top level, "
                                f"got {type(doc).__name__}")
    for field in ("hardware", "versions"):
        if field not in doc:
            raise VerifyReportError(f"{where}: field {field!r} is missing (expected a "
                                    "non-empty string or object)")
        if not isinstance(doc[field], (str, dict)) or not doc[field]:
            raise VerifyReportError(f"{where}: field {field!r} must be a non-empty string or "
                                    f"object, got {doc[field]!r}")
    date = require(doc, "date", str, where, "a non-empty string (when it was measured)")
    if not date.strip():
        raise VerifyReportError(f"{where}: field 'date' must be a non-empty string, got ''")
    cases = require(doc, "cases", list, where, "a non-empty list of measured cases")
    if not cases:
        raise VerifyReportError(f"{where}: field 'cases' must be a non-empty list, got []")
    parsed, seen = [], {}
    for i, c in enumerate(cases):
        case = _case(c, f"{where}: cases[{i}]")
        key = (case.k, case.mode, case.rows)
        if key in seen:
            raise VerifyReportError(f"{where}: cases[{i}] repeats k={case.k}, mode "
                                    f"{case.mode!r}, rows={case.rows} of cases[{seen[key]}] "
                                    "(expected one measurement per case)")
        seen[key] = i
        parsed.append(case)
    return VerifyMeasurements(tuple(parsed), doc["hardware"], doc["versions"], date, where)


def load_report(path: str | Path) -> VerifyMeasurements:
    """Read and check a report; every problem is one :class:`VerifyReportError` line."""
    path = Path(path)
    if not path.is_file():
        raise VerifyReportError(f"{path}: no such verify-step report (expected the JSON "
                                "written by the graph-captured verify benchmark)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise VerifyReportError(f"{path}: cannot read ({exc.__class__.__name__}: {exc})"
                                ) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise VerifyReportError(f"{path}: not valid JSON (line {exc.lineno}, column "
                                f"{exc.colno}: {exc.msg})") from None
    return parse_report(doc, str(path))


@functools.lru_cache(maxsize=8)
def _cached(path: str, mtime_ns: int) -> VerifyMeasurements:
    return load_report(path)


def measurements(path: str | Path | None = None) -> VerifyMeasurements | None:
    """The measured report (default: :data:`DEFAULT_REPORT`), or None when it does not
    exist. A report that exists but is malformed raises :class:`VerifyReportError`."""
    p = Path(path) if path is not None else DEFAULT_REPORT
    if not p.is_file():
        return None
    return _cached(str(p), p.stat().st_mtime_ns)
