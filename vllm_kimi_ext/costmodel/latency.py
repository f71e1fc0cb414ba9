"""Collective latency tables: ``latency(op, bytes, backend)`` interpolated from measurements.

A table file (``profiles/latency/<name>.json``) lists, per backend and operation, measured
points ``[bytes, microseconds, source_id]``; ``sources`` maps each id to where the number
was published (repository, file, commit, date, box topology). ``bench/allreduce_bench.py``
writes the same schema with two-element points and a table-level ``provenance`` line, so a
measured table of the real box replaces a shipped one with one command.

Message size is the whole buffer for an all-reduce and the gathered output (all ranks
together) for an all-gather.

Interpolation is linear in log(bytes)-log(latency) between points; below the smallest size
the smallest latency is used; above the largest the last segment is extended at constant
bandwidth. Measurements are kept exactly as published; where one dips below a smaller
message's latency (protocol switch-over noise) the curve uses the running maximum - a
collective is never modelled as getting faster with more bytes - and the lifted points are
listed (:attr:`Curve.lifted`).

Two rules stand in for curves nobody measured, and are not data:

* an **all-gather** without its own curve: NCCL's ring all-gather of ``S`` bytes moves
  ``(n-1)/n * S`` per rank, half the traffic of a ring all-reduce of ``S``, so it is costed
  as an all-reduce of ``S / 2``; any other backend carries it as a zero-padded all-reduce of
  ``S`` (one-shot kernels have no cheaper all-gather);
* a backend marked ``auto_crossover`` (a custom kernel that benchmarks itself against NCCL
  at startup, as the public one-shot kernels do) costs ``min(own curve, NCCL)``; a
  ``max_bytes`` limit (IPC buffer) sends larger messages to NCCL.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from pathlib import Path
from typing import Any

from vllm_kimi_ext.costmodel.catalog import ProfileError, load_raw

OPS = ("allreduce", "allgather")
FALLBACK_BACKEND = "nccl"
SOURCE_FIELDS = ("repo", "file", "commit", "date", "topology")


@dataclasses.dataclass(frozen=True)
class Curve:
    sizes: tuple[float, ...]
    latencies_us: tuple[float, ...]  # running maximum of the measured values
    measured_us: tuple[float, ...] = ()  # as published
    sources: tuple[str, ...] = ()

    @property
    def lifted(self) -> list[tuple[float, float, float]]:
        """(bytes, measured us, curve us) of points the running maximum raised."""
        return [(x, m, y) for x, m, y in zip(self.sizes, self.measured_us, self.latencies_us)
                if y > m]

    def __call__(self, nbytes: float) -> float:
        xs, ys = self.sizes, self.latencies_us
        if nbytes <= xs[0]:
            return ys[0]
        if nbytes >= xs[-1]:
            if len(xs) == 1:
                return ys[0]
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            return ys[-1] + max(slope, 0.0) * (nbytes - xs[-1])
        i = bisect.bisect_right(xs, nbytes)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        t = (math.log(nbytes) - math.log(x0)) / (math.log(x1) - math.log(x0))
        y = math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))
        return min(max(y, y0), y1)


def curve_from_points(points: list, where: str) -> Curve:
    """A curve from ``[[bytes, us(, source)], ...]``; one-line errors name ``where``."""
    rows = []
    for i, p in enumerate(points):
        if not isinstance(p, (list, tuple)) or len(p) not in (2, 3):
            raise ProfileError(f"{where}[{i}]: expected [bytes, us] or [bytes, us, source], "
                               f"got {p!r}")
        try:
            x, y = float(p[0]), float(p[1])
        except (TypeError, ValueError):
            raise ProfileError(f"{where}[{i}]: bytes and us must be numbers, got {p!r}") from None
        if not (math.isfinite(x) and math.isfinite(y)) or x <= 0 or y <= 0:
            raise ProfileError(f"{where}[{i}]: bytes and us must be positive and finite, "
                               f"got {p!r}")
        rows.append((x, y, str(p[2]) if len(p) == 3 else ""))
    if len(rows) < 2:
        raise ProfileError(f"{where}: needs at least two points")
    if any(b[0] <= a[0] for a, b in zip(rows, rows[1:])):
        raise ProfileError(f"{where}: sizes must be strictly increasing")
    env, hi = [], 0.0
    for _, y, _ in rows:
        hi = max(hi, y)
        env.append(hi)
    return Curve(tuple(r[0] for r in rows), tuple(env), tuple(r[1] for r in rows),
                 tuple(r[2] for r in rows))


@dataclasses.dataclass(frozen=True)
class LatencyTable:
    name: str
    curves: dict[str, dict[str, Curve]]  # backend -> op -> curve
    max_bytes: dict[str, float | None]
    descriptions: dict[str, str]
    provenance: tuple[str, ...] = ()
    sources: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    auto_crossover: frozenset[str] = frozenset()
    topology: str = ""
    scale: float = 1.0  # what-if multiplier on every latency (tests: a faster link)

    @property
    def backends(self) -> list[str]:
        return list(self.curves)

    def scaled(self, factor: float) -> LatencyTable:
        if not factor > 0:
            raise ValueError("latency scale must be positive")
        return dataclasses.replace(self, scale=self.scale * factor)

    def with_policy(self, backend: str, max_bytes: float | None, auto_crossover: bool
                    ) -> LatencyTable:
        """A copy where ``backend`` is used up to ``max_bytes`` (NCCL above), choosing by
        size rather than by measured speed when ``auto_crossover`` is off - how a
        deployment's cutoff settings select a custom kernel."""
        if backend not in self.curves:
            raise KeyError(f"backend {backend!r} not in latency table {self.name!r}")
        auto = set(self.auto_crossover) - {backend}
        if auto_crossover:
            auto.add(backend)
        return dataclasses.replace(self, max_bytes={**self.max_bytes, backend: max_bytes},
                                   auto_crossover=frozenset(auto))

    def latency_us(self, op: str, nbytes: float, backend: str) -> float:
        """Latency of one collective on an idle system, in microseconds."""
        if op not in OPS:
            raise ValueError(f"op must be one of {OPS}, not {op!r}")
        if backend not in self.curves:
            raise KeyError(f"backend {backend!r} not in latency table {self.name!r}; "
                           f"valid: {', '.join(self.curves)}")
        nbytes = max(float(nbytes), 1.0)
        fallback = backend != FALLBACK_BACKEND and FALLBACK_BACKEND in self.curves
        limit = self.max_bytes.get(backend)
        if fallback and limit is not None and nbytes > limit:
            return self.latency_us(op, nbytes, FALLBACK_BACKEND)
        own = self._own_us(op, nbytes, backend)
        if fallback and backend in self.auto_crossover:
            return min(own, self.latency_us(op, nbytes, FALLBACK_BACKEND))
        return own

    def _own_us(self, op: str, nbytes: float, backend: str) -> float:
        ops = self.curves[backend]
        if op in ops:
            return ops[op](nbytes) * self.scale
        if op == "allgather" and "allreduce" in ops:
            size = nbytes / 2 if backend == FALLBACK_BACKEND else nbytes
            return ops["allreduce"](size) * self.scale
        return self.latency_us(op, nbytes, FALLBACK_BACKEND)

    def unsourced_points(self) -> list[str]:
        """``backend:op@bytes`` of every point whose source id is missing or incomplete."""
        bad = []
        for backend, ops in self.curves.items():
            for op, c in ops.items():
                for x, s in zip(c.sizes, c.sources):
                    src = self.sources.get(s)
                    if not s or src is None or any(not src.get(f) for f in SOURCE_FIELDS):
                        bad.append(f"{backend}:{op}@{int(x)}")
        return bad


def table_from_dict(d: dict[str, Any], where: str | None = None) -> LatencyTable:
    where = where or f"latency table {d.get('name', '?')!r}"
    if not isinstance(d.get("backends"), dict) or not d["backends"]:
        raise ProfileError(f"{where}: field 'backends' must be a non-empty object")
    curves: dict[str, dict[str, Curve]] = {}
    max_bytes: dict[str, float | None] = {}
    descriptions: dict[str, str] = {}
    auto = set()
    for backend, spec in d["backends"].items():
        if not isinstance(spec, dict) or not isinstance(spec.get("ops"), dict):
            raise ProfileError(f"{where}: field 'backends.{backend}.ops' must be an object")
        ops = {}
        for op, points in spec["ops"].items():
            if op not in OPS:
                raise ProfileError(f"{where}: field 'backends.{backend}.ops.{op}': unknown op "
                                   f"(expected one of {', '.join(OPS)})")
            if not isinstance(points, list):
                raise ProfileError(f"{where}: field 'backends.{backend}.ops.{op}' must be a "
                                   "list of points")
            ops[op] = curve_from_points(points, f"{where}: field 'backends.{backend}.ops.{op}'")
        curves[backend] = ops
        max_bytes[backend] = spec.get("max_bytes")
        descriptions[backend] = spec.get("description", "")
        if spec.get("auto_crossover"):
            auto.add(backend)
    if FALLBACK_BACKEND not in curves:
        raise ProfileError(f"{where}: field 'backends.{FALLBACK_BACKEND}' is required "
                           "(the fallback of every other backend)")
    return LatencyTable(
        name=d.get("name", "?"), curves=curves, max_bytes=max_bytes, descriptions=descriptions,
        provenance=tuple(d.get("provenance", ())), sources=dict(d.get("sources", {})),
        auto_crossover=frozenset(auto), topology=d.get("topology", ""))


def load_latency_table(name_or_path: str | Path) -> LatencyTable:
    raw, where = load_raw("latency", name_or_path, with_location=True)
    return table_from_dict(raw, where)
