"""Calibration of the cost model on public measurements, and its held-out validation.

The hardware profile lists every measured run it is calibrated on (``calibration.runs``),
each with its source (``calibration.sources``: repository, file, commit, date, topology)
and, per point, whether it is used for the fit (``split: calibration``) or held out
(``split: validation``). A point is one published throughput: batch, context, all-reduce
backend, KV-cache dtype and, for speculative runs, the draft, ``k`` and the run's measured
acceptance - so the fit never uses a model card's acceptance.

:func:`fit` finds the free parameters (:mod:`.params`) minimising the squared log error of
tokens/s over the calibration points (``scipy.optimize.least_squares`` within
:data:`~.params.BOUNDS`; scipy is needed only to fit). The result is committed in the
hardware profile as ``calibration.fitted``; the cost model reads it from there, and a test
refits and compares, so the committed numbers cannot drift from the data.

``python -m vllm_kimi_ext.costmodel.calibration --update-profile`` refits and rewrites
``calibration.fitted`` of the shipped profile; ``--check`` exits 1 when it is stale.
``vllm-kimi-ext plan --validate`` prints every point: measured, predicted, error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from importlib import resources
from typing import Any

from vllm_kimi_ext.costmodel.acceptance import Acceptance, from_spec
from vllm_kimi_ext.costmodel.catalog import (
    DEFAULT_HARDWARE,
    HardwareProfile,
    ProfileError,
    load_draft,
    load_hardware,
    require,
)
from vllm_kimi_ext.costmodel.model import CostModel, Plan, prior_params
from vllm_kimi_ext.costmodel.params import BOUNDS, FITTED, CalibParams

SPLITS = ("calibration", "validation")
#: Held-out points, split by how far they are from the fit: between fitted cells of the same
#: run (interpolation within a run the fit saw) or from a run with no fitted cell at all.
HELD_OUT = ("between fitted cells of the same run", "runs with no fitted cell")
#: Error within which a point counts as reproduced; a point beyond it must name, in its run's
#: ``model_lacks``, a concrete difference the profile records (:data:`DIFFERENCES`).
ERROR_BOUND = 0.10
#: What a run records and a miss may name: its software image (``engine``), its kernels
#: (``kernels``) and its host (its source's ``topology``). A miss is explained only when its
#: run's recorded value differs from that of at least one run with fitted cells.
DIFFERENCES = ("image", "kernels", "host")
#: Parameters fitted by default: all but the kernel gap, which at every measured point
#: trades off one for one against the bandwidth fraction and the fixed overheads.
FIT_DEFAULT = tuple(n for n in FITTED if n != "kernel_gap_us")
PROFILE = DEFAULT_HARDWARE


@dataclasses.dataclass(frozen=True)
class CalibrationPoint:
    id: str
    run: str
    split: str
    source_id: str
    source: dict[str, Any]
    where: str
    engine: str
    backend: str
    kv_cache_dtype_bytes: float
    draft: str | None
    k: int
    acceptance: Acceptance | None
    batch: int
    context: int
    tokens_per_s: float
    model_lacks: str = ""  # the mechanism the model lacks, in words
    difference: str = ""  # which recorded difference it names (one of DIFFERENCES)
    kernels: str = ""
    allreduce_policy: dict[str, Any] | None = None  # the run's custom all-reduce cutoffs

    def recorded(self, what: str) -> str:
        """The run's recorded image, kernels or host."""
        return {"image": self.engine, "kernels": self.kernels,
                "host": str(self.source.get("topology", ""))}[what]

    @property
    def label(self) -> str:
        spec = f"{self.draft} k={self.k}" if self.k else "no spec"
        return f"{self.run}: {spec}, B={self.batch}, ctx={self.context}, {self.backend}"


def _run_points(run: dict[str, Any], where: str, sources: dict[str, Any]
                ) -> list[CalibrationPoint]:
    rid = require(run, "id", str, where)
    where = f"{where}[{rid}]"
    sid = require(run, "source", str, where, "a key of calibration.sources")
    if sid not in sources:
        raise ProfileError(f"{where}: field 'source' names {sid!r}, not in calibration.sources")
    k = require(run, "k", int, where, "an integer >= 0")
    draft = run.get("draft")
    acc = None
    if k:
        if not isinstance(draft, str):
            raise ProfileError(f"{where}: field 'draft' must name a draft profile when k > 0")
        load_draft(draft)  # fails with the draft file's own message
        try:
            acc = from_spec(require(run, "acceptance", dict, where, "an acceptance object"),
                            f"{rid} (measured)")
        except ValueError as exc:
            raise ProfileError(f"{where}: field 'acceptance': {exc}") from None
    lacks, difference = _model_lacks(run.get("model_lacks"), where)
    out = []
    for i, p in enumerate(require(run, "points", list, where, "a list of points")):
        pw = f"{where}: field 'points[{i}]'"
        if not isinstance(p, dict):
            raise ProfileError(f"{pw} must be an object")
        split = p.get("split")
        if split not in SPLITS:
            raise ProfileError(f"{pw}: field 'split' must be one of {', '.join(SPLITS)}, "
                               f"got {split!r}")
        b = require(p, "batch", int, pw, positive=True)
        ctx = require(p, "context", int, pw, "an integer >= 0")
        if ctx < 0:
            raise ProfileError(f"{pw}: field 'context' must be >= 0, got {ctx}")
        tps = require(p, "tokens_per_s", (int, float), pw, positive=True)
        out.append(CalibrationPoint(
            id=f"{rid}/B{b}/ctx{ctx}", run=rid, split=split, source_id=sid,
            source=sources[sid], where=run.get("where", ""), engine=run.get("engine", ""),
            backend=require(run, "backend", str, where),
            kv_cache_dtype_bytes=require(run, "kv_cache_dtype_bytes", (int, float), where,
                                         positive=True),
            draft=draft if k else None, k=k, acceptance=acc, batch=b, context=ctx,
            tokens_per_s=float(tps), model_lacks=lacks, difference=difference,
            kernels=str(run.get("kernels", "")), allreduce_policy=run.get("allreduce_policy")))
    return out


def _model_lacks(value: Any, where: str) -> tuple[str, str]:
    """(why, difference) of a run's ``model_lacks``: an object naming one of
    :data:`DIFFERENCES` and saying why. A bare string is kept as text but explains nothing."""
    if value is None:
        return "", ""
    if isinstance(value, str):
        return value, ""
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: field 'model_lacks' must be an object "
                           "{\"difference\": ..., \"why\": ...}")
    diff, why = value.get("difference"), value.get("why")
    if diff not in DIFFERENCES:
        raise ProfileError(f"{where}: field 'model_lacks.difference' must be one of "
                           f"{', '.join(DIFFERENCES)}, got {diff!r}")
    if not isinstance(why, str) or not why.strip():
        raise ProfileError(f"{where}: field 'model_lacks.why' must be a non-empty string")
    return why, diff


def load_points(hw: HardwareProfile) -> list[CalibrationPoint]:
    """Every calibration and validation point of a hardware profile, validated."""
    where = f"hardware profile {hw.name!r}: field 'calibration.runs'"
    sources = hw.calibration.get("sources", {})
    out: list[CalibrationPoint] = []
    for run in hw.calibration.get("runs", []):
        if not isinstance(run, dict):
            raise ProfileError(f"{where}: every run must be an object")
        out += _run_points(run, where, sources)
    ids = [p.id for p in out]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ProfileError(f"{where}: point {dup!r} appears twice")
    return out


class _Predictor:
    """Caches the per-point plan pieces so a fit re-evaluates only the arithmetic."""

    def __init__(self, cm: CostModel):
        self.cm = cm
        self._drafts: dict[str, Any] = {}

    def model_for(self, cm: CostModel, p: CalibrationPoint) -> CostModel:
        if p.allreduce_policy:
            pol = p.allreduce_policy
            cm = cm.with_latency(cm.latency.with_policy(
                p.backend, pol.get("max_bytes"), bool(pol.get("auto_crossover", False))))
        if cm.model.kv_cache_dtype_bytes == p.kv_cache_dtype_bytes:
            return cm
        return cm.with_model(dataclasses.replace(cm.model,
                                                 kv_cache_dtype_bytes=p.kv_cache_dtype_bytes))

    def __call__(self, params: CalibParams, p: CalibrationPoint) -> float:
        cm = self.model_for(self.cm.with_params(params), p)
        draft = None
        if p.draft:
            draft = self._drafts.setdefault(p.draft, load_draft(p.draft))
        plan = Plan(k=p.k, draft=draft, batch=p.batch, context=p.context, backend=p.backend)
        return cm.estimate(plan, p.acceptance).tokens_per_s


def predict(cm: CostModel, point: CalibrationPoint) -> float:
    """The model's aggregate tokens/s at a point, with ``cm``'s parameters."""
    return _Predictor(cm)(cm.params, point)


def fit(cm: CostModel, points: list[CalibrationPoint], names: tuple[str, ...] = FIT_DEFAULT,
        start: CalibParams | None = None) -> CalibParams:
    """Least squares on log(predicted / measured) over ``points``, varying ``names`` within
    :data:`BOUNDS` (the others stay at ``start``, default the box's priors)."""
    from scipy.optimize import least_squares  # only fitting needs scipy

    start = start or prior_params(cm.hw)
    base = start.to_dict()
    lo = [BOUNDS[n][0] for n in names]
    hi = [BOUNDS[n][1] for n in names]
    x0 = [min(max(base[n], a), b) for n, a, b in zip(names, lo, hi)]
    pred = _Predictor(cm)

    def params_of(x) -> CalibParams:
        return CalibParams(**{**base, **dict(zip(names, (float(v) for v in x)))})

    def residuals(x):
        q = params_of(x)
        return [math.log(pred(q, p) / p.tokens_per_s) for p in points]

    res = least_squares(residuals, x0, bounds=(lo, hi), x_scale="jac", xtol=1e-10,
                        ftol=1e-10, gtol=1e-10, max_nfev=2000)
    best = params_of(res.x)
    return dataclasses.replace(best, calibrated=True,
                               note=f"fitted on {len(points)} calibration points")


@dataclasses.dataclass(frozen=True)
class Row:
    point: CalibrationPoint
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.point.tokens_per_s - 1.0

    @property
    def within_bound(self) -> bool:
        return abs(self.error) <= ERROR_BOUND


@dataclasses.dataclass(frozen=True)
class ValidationReport:
    hardware: str
    params: CalibParams
    rows: tuple[Row, ...]

    def split(self, name: str) -> list[Row]:
        return [r for r in self.rows if r.point.split == name]

    @property
    def fitted_runs(self) -> set[str]:
        """Runs with at least one calibration (fitted) point."""
        return {r.point.run for r in self.split("calibration")}

    def held_out(self, group: str) -> list[Row]:
        """Validation points of one :data:`HELD_OUT` group."""
        between = group == HELD_OUT[0]
        if group not in HELD_OUT:
            raise ValueError(f"group must be one of {HELD_OUT}, not {group!r}")
        return [r for r in self.split("validation")
                if (r.point.run in self.fitted_runs) == between]

    def groups(self) -> dict[str, list[Row]]:
        """Calibration points, then the two held-out groups."""
        return {"calibration": self.split("calibration"),
                **{f"held out, {g}": self.held_out(g) for g in HELD_OUT}}

    def max_error(self, split: str | None = None) -> float:
        rows = self.rows if split is None else self.split(split)
        return max((abs(r.error) for r in rows), default=0.0)

    def mean_abs_error(self, split: str) -> float:
        rows = self.split(split)
        return mean_abs(rows)

    @property
    def misses(self) -> list[Row]:
        return [r for r in self.rows if not r.within_bound]

    def why_unexplained(self, row: Row) -> str | None:
        """None when a miss names a recorded difference from the fitted runs; else why not."""
        p = row.point
        if not p.difference:
            return ("names no recorded difference (model_lacks.difference: one of "
                    f"{', '.join(DIFFERENCES)})" if p.model_lacks else "no mechanism named")
        mine = p.recorded(p.difference)
        if not mine:
            return f"names its {p.difference}, which the run does not record"
        others = {r.point.recorded(p.difference) for r in self.split("calibration")
                  if r.point.run != p.run}
        if others <= {mine}:
            return (f"names its {p.difference}, but every other fitted run recorded the same "
                    f"({mine})")
        return None

    @property
    def unexplained_misses(self) -> list[Row]:
        return [r for r in self.misses if self.why_unexplained(r) is not None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "hardware": self.hardware,
            "params": self.params.to_dict(),
            "error_bound": ERROR_BOUND,
            "rows": [{"id": r.point.id, "split": r.point.split,
                      "held_out_group": (None if r.point.split == "calibration" else
                                         HELD_OUT[r.point.run not in self.fitted_runs]),
                      "measured_tokens_per_s": r.point.tokens_per_s,
                      "predicted_tokens_per_s": r.predicted, "error": r.error,
                      "source": r.point.source_id,
                      "model_lacks": r.point.model_lacks or None,
                      "difference": r.point.difference or None,
                      "unexplained": (self.why_unexplained(r) if not r.within_bound
                                      else None)}
                     for r in self.rows],
            "max_error": {s: self.max_error(s) for s in SPLITS},
            "mean_abs_error": {s: self.mean_abs_error(s) for s in SPLITS},
            "groups": {g: {"points": len(rows), "mean_abs_error": mean_abs(rows),
                           "max_abs_error": max((abs(r.error) for r in rows), default=0.0)}
                       for g, rows in self.groups().items()},
        }


def mean_abs(rows: list[Row]) -> float:
    return sum(abs(r.error) for r in rows) / len(rows) if rows else 0.0


def validate(cm: CostModel, points: list[CalibrationPoint] | None = None) -> ValidationReport:
    """Measured against predicted at every point, with ``cm``'s (committed) parameters."""
    points = load_points(cm.hw) if points is None else points
    if not any(p.split == "calibration" for p in points):
        raise ProfileError(f"{cm.hw.where or f'hardware profile {cm.hw.name!r}'}: field "
                           "'calibration.runs' has no point with split 'calibration': nothing "
                           "to validate against")
    pred = _Predictor(cm)
    rows = tuple(Row(p, pred(cm.params, p)) for p in points)
    return ValidationReport(cm.hw.name, cm.params, rows)


def refit(hardware: str | HardwareProfile = PROFILE) -> CalibParams:
    """Fit the box's calibration points from its priors (what ``--update-profile`` commits)."""
    cm = CostModel.build(hardware, params="prior")
    pts = [p for p in load_points(cm.hw) if p.split == "calibration"]
    if not pts:
        raise ProfileError(f"hardware profile {cm.hw.name!r} has no calibration points")
    return fit(cm, pts)


def fitted_block(params: CalibParams, n_points: int) -> dict[str, Any]:
    return {**{n: round(v, 6) for n, v in params.to_dict().items()},
            "note": f"least squares on log(tokens/s) over {n_points} calibration points",
            "tool": "python -m vllm_kimi_ext.costmodel.calibration --update-profile"}


def _profile_path():
    return resources.files("vllm_kimi_ext.costmodel").joinpath("profiles", "hardware",
                                                               f"{PROFILE}.json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vllm_kimi_ext.costmodel.calibration",
                                 description="Refit the shipped PCIe profile's parameters.")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--update-profile", action="store_true",
                   help=f"refit and rewrite calibration.fitted of profiles/hardware/{PROFILE}.json")
    g.add_argument("--check", action="store_true",
                   help="exit 1 when the committed fit differs from a refit")
    args = ap.parse_args(argv)
    hw = load_hardware(PROFILE)
    n = sum(1 for p in load_points(hw) if p.split == "calibration")
    block = fitted_block(refit(hw), n)
    committed = hw.calibration.get("fitted") or {}
    if args.check:
        stale = any(not math.isclose(committed.get(k, math.nan), block[k], rel_tol=1e-3,
                                     abs_tol=1e-3) for k in FITTED)
        if stale:
            print(f"stale: calibration.fitted of {PROFILE} (run python -m "
                  "vllm_kimi_ext.costmodel.calibration --update-profile)", file=sys.stderr)
        return 1 if stale else 0
    path = _profile_path()
    doc = json.loads(path.read_text())
    doc["calibration"]["fitted"] = block
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote calibration.fitted of {path.name}: "
          + ", ".join(f"{k}={block[k]:g}" for k in FITTED))
    return 0


if __name__ == "__main__":
    sys.exit(main())
