"""The forecast's interval: calibrated on the model's own out-of-sample errors.

A forecast of tokens/s is the model's point estimate; its interval is where a measurement of
the same configuration is expected to fall with the stated :data:`COVERAGE`. It is built by
split-conformal prediction on the held-out public runs the fit never saw (``plan
--validate``'s points of runs with no fitted cell, :data:`~.calibration.HELD_OUT`):

* each held-out point gives a log error ``|ln(predicted / measured)|``;
* the half-width ``q`` is the ``ceil(COVERAGE x (n + 1))``-th smallest of the ``n`` errors
  (the largest one when that rank exceeds ``n``): for exchangeable runs a new run's error is
  at most ``q`` with probability at least :data:`COVERAGE`;
* the interval is ``point x exp(-q) .. point x exp(+q)``: the point estimate inside, the
  measured/predicted ratios the held-out runs showed on both sides.

The same interval applies to runs without speculation (most held-out runs are such runs).
The acceptance band of a draft (its low and high acceptance) is a separate spread, reported
beside it, not folded into it. ``tests/unit/test_costmodel_interval.py`` checks the stated
coverage on the project's own held-out runs (leave-one-out over the calibrating group, and
the other held-out group, which the interval never saw).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from functools import lru_cache

#: The share of measurements the interval aims to contain.
COVERAGE = 0.8
#: The hardware profile whose held-out runs calibrate the interval (the only box class with
#: held-out public runs).
PCIE = "rtx-pro-6000-pcie-x8"


def log_error(predicted: float, measured: float) -> float:
    return abs(math.log(predicted / measured))


def conformal_half_width(errors: Sequence[float], coverage: float = COVERAGE) -> float:
    """The split-conformal half-width of ``errors`` (absolute log errors) at ``coverage``:
    the ``ceil(coverage (n + 1))``-th smallest, capped at the largest."""
    if not errors:
        raise ValueError("no held-out errors to calibrate an interval on")
    if not 0.0 < coverage < 1.0:
        raise ValueError(f"coverage must be within (0, 1), got {coverage!r}")
    ranked = sorted(errors)
    rank = min(math.ceil(coverage * (len(ranked) + 1)), len(ranked))
    return ranked[rank - 1]


@dataclasses.dataclass(frozen=True)
class Calibrated:
    """A half-width in log space, with what it rests on."""

    half_width: float  # q: the interval is point x exp(-q) .. point x exp(q)
    coverage: float
    points: int  # held-out points it was calibrated on
    group: str

    def around(self, point: float) -> tuple[float, float]:
        """(low, high) around ``point``; the point lies inside."""
        return point * math.exp(-self.half_width), point * math.exp(self.half_width)

    @property
    def low_factor(self) -> float:
        return math.exp(-self.half_width)

    @property
    def high_factor(self) -> float:
        return math.exp(self.half_width)

    def words(self) -> str:
        """How it was made, in one clause (the docs and ``plan`` print it)."""
        return (f"{self.coverage:.0%} interval: x{self.low_factor:.2f}..x{self.high_factor:.2f}"
                f" the point, from the model's errors on {self.points} held-out public runs "
                f"({self.group}; split-conformal, `vllm-kimi-ext plan --validate`)")

    def to_dict(self) -> dict:
        return {"coverage": self.coverage, "method": "split-conformal on |ln(predicted / "
                "measured)| of held-out public runs", "held_out_points": self.points,
                "held_out_group": self.group, "half_width_log": self.half_width,
                "low_factor": self.low_factor, "high_factor": self.high_factor}


def held_out_errors(hardware: str = PCIE) -> dict[str, list[float]]:
    """{held-out group: absolute log errors of its points} of ``plan --validate``."""
    from vllm_kimi_ext.costmodel.calibration import HELD_OUT, validate
    from vllm_kimi_ext.costmodel.model import CostModel

    rep = validate(CostModel.build(hardware))
    return {g: [log_error(r.predicted, r.point.tokens_per_s) for r in rep.held_out(g)]
            for g in HELD_OUT}


@lru_cache(maxsize=8)
def calibrated(hardware: str = PCIE, coverage: float = COVERAGE) -> Calibrated:
    """The interval of every forecast: calibrated on the held-out runs with no fitted cell
    (a configuration, image or host the fit never saw, like the forecasts it is used for)."""
    from vllm_kimi_ext.costmodel.calibration import HELD_OUT

    group = HELD_OUT[1]
    errors = held_out_errors(hardware)[group]
    return Calibrated(conformal_half_width(errors, coverage), coverage, len(errors), group)


def covered(errors: Sequence[float], half_width: float) -> float:
    """The share of ``errors`` within ``half_width``."""
    return sum(e <= half_width + 1e-12 for e in errors) / len(errors)


def leave_one_out_coverage(errors: Sequence[float], coverage: float = COVERAGE,
                           half_width=conformal_half_width) -> float:
    """The share of ``errors`` covered by an interval calibrated on the others."""
    hits = 0
    for i, e in enumerate(errors):
        rest = [x for j, x in enumerate(errors) if j != i]
        hits += e <= half_width(rest, coverage) + 1e-12
    return hits / len(errors)
