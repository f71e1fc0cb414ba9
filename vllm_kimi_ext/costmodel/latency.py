"""Collective latency tables: ``latency(op, bytes, backend)`` interpolated from data.

A table file (``profiles/latency/<name>.json``) lists, per backend and operation, points
``[bytes, microseconds]``. Message size is the whole buffer for an all-reduce and the
gathered output (all ranks together) for an all-gather.

Interpolation is linear in log(bytes)-log(latency) between points; below the smallest size
the smallest latency is used; above the largest the last segment is extended at constant
bandwidth (latency proportional to bytes). Both keep the interpolant monotone whenever the
points are, which :meth:`LatencyTable.validate` checks.

A backend may have a ``max_bytes`` limit (a custom all-reduce's IPC buffer): larger
messages fall back to NCCL. A backend without an all-gather table implements small
all-gathers as a zero-padded all-reduce of the gathered size, which is how a one-shot
kernel would carry the sharded verifier's few bytes per row.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from pathlib import Path
from typing import Any

from vllm_kimi_ext.costmodel.catalog import load_raw

OPS = ("allreduce", "allgather")
FALLBACK_BACKEND = "nccl"


@dataclasses.dataclass(frozen=True)
class Curve:
    sizes: tuple[float, ...]
    latencies_us: tuple[float, ...]

    def __call__(self, nbytes: float) -> float:
        xs, ys = self.sizes, self.latencies_us
        if nbytes <= xs[0]:
            return ys[0]
        if nbytes >= xs[-1]:
            if len(xs) == 1:
                return ys[0]
            # constant bandwidth beyond the last point, never below the last latency
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            return ys[-1] + max(slope, 0.0) * (nbytes - xs[-1])
        i = bisect.bisect_right(xs, nbytes)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        t = (math.log(nbytes) - math.log(x0)) / (math.log(x1) - math.log(x0))
        y = math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))
        return min(max(y, y0), y1)  # no rounding below or above the bracketing points


@dataclasses.dataclass(frozen=True)
class LatencyTable:
    name: str
    curves: dict[str, dict[str, Curve]]  # backend -> op -> curve
    max_bytes: dict[str, float | None]
    descriptions: dict[str, str]
    provenance: tuple[str, ...] = ()
    scale: float = 1.0  # what-if multiplier on every latency (tests: a faster link)

    @property
    def backends(self) -> list[str]:
        return list(self.curves)

    def scaled(self, factor: float) -> LatencyTable:
        if factor <= 0:
            raise ValueError("latency scale must be positive")
        return dataclasses.replace(self, scale=self.scale * factor)

    def latency_us(self, op: str, nbytes: float, backend: str) -> float:
        """Latency of one collective on an idle system, in microseconds."""
        if op not in OPS:
            raise ValueError(f"op must be one of {OPS}, not {op!r}")
        if backend not in self.curves:
            raise KeyError(
                f"backend {backend!r} not in latency table {self.name!r}; "
                f"valid: {', '.join(self.curves)}"
            )
        nbytes = max(float(nbytes), 1.0)
        limit = self.max_bytes.get(backend)
        if limit is not None and nbytes > limit and backend != FALLBACK_BACKEND:
            return self.latency_us(op, nbytes, FALLBACK_BACKEND)
        ops = self.curves[backend]
        if op in ops:
            return ops[op](nbytes) * self.scale
        if op == "allgather" and "allreduce" in ops:
            return ops["allreduce"](nbytes) * self.scale  # zero-padded all-reduce
        return self.latency_us(op, nbytes, FALLBACK_BACKEND)

    def validate(self) -> None:
        """Raise ``ValueError`` unless every curve is strictly increasing in bytes and
        non-decreasing in latency, with positive values."""
        for backend, ops in self.curves.items():
            for op, c in ops.items():
                where = f"{self.name}:{backend}:{op}"
                if len(c.sizes) < 2:
                    raise ValueError(f"{where}: needs at least two points")
                if any(x <= 0 for x in c.sizes) or any(y <= 0 for y in c.latencies_us):
                    raise ValueError(f"{where}: sizes and latencies must be positive")
                if any(b <= a for a, b in zip(c.sizes, c.sizes[1:])):
                    raise ValueError(f"{where}: sizes must be strictly increasing")
                if any(b < a for a, b in zip(c.latencies_us, c.latencies_us[1:])):
                    raise ValueError(f"{where}: latency must not decrease with bytes")
        if FALLBACK_BACKEND not in self.curves:
            raise ValueError(f"{self.name}: the {FALLBACK_BACKEND!r} fallback is required")
        if "allgather" not in self.curves[FALLBACK_BACKEND]:
            raise ValueError(f"{self.name}: {FALLBACK_BACKEND} needs an allgather curve")


def table_from_dict(d: dict[str, Any]) -> LatencyTable:
    curves: dict[str, dict[str, Curve]] = {}
    max_bytes: dict[str, float | None] = {}
    descriptions: dict[str, str] = {}
    for backend, spec in d["backends"].items():
        ops = {}
        for op, points in spec["ops"].items():
            if op not in OPS:
                raise ValueError(f"{d.get('name')}: unknown op {op!r} for {backend}")
            pts = sorted((float(x), float(y)) for x, y in points)
            ops[op] = Curve(tuple(p[0] for p in pts), tuple(p[1] for p in pts))
        curves[backend] = ops
        max_bytes[backend] = spec.get("max_bytes")
        descriptions[backend] = spec.get("description", "")
    table = LatencyTable(
        name=d.get("name", "?"),
        curves=curves,
        max_bytes=max_bytes,
        descriptions=descriptions,
        provenance=tuple(d.get("provenance", ())),
    )
    table.validate()
    return table


def load_latency_table(name_or_path: str | Path) -> LatencyTable:
    return table_from_dict(load_raw("latency", name_or_path))
