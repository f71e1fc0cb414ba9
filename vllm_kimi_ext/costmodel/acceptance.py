"""Acceptance of drafted tokens, and consistent conversions between its usual forms.

Three forms are in use, and this module converts between them:

* **per-position rates** ``r_i`` (what vLLM logs as "per-position acceptance rate"): the
  fraction of steps in which draft position ``i`` was accepted. Acceptance stops at the
  first rejection, so ``r_1 >= r_2 >= ...``.
* **conditional rates** ``a_i = r_i / r_{i-1}`` (``r_0 = 1``): the probability that position
  ``i`` is accepted given that all before it were. The internal representation.
* **acceptance length** ``tau(k) = 1 + sum_{i<=k} r_i``: tokens emitted per step with ``k``
  draft tokens, the bonus token included (``1 <= tau <= k + 1``).
* **draft acceptance rate** ``(tau(k) - 1) / k`` (vLLM's "draft acceptance rate").

When only ``tau`` at one ``k`` is known, a constant conditional rate ``a`` is solved from
``tau = (1 - a^(k+1)) / (1 - a)``. Positions beyond the data repeat the last conditional
rate (a geometric tail); :attr:`Acceptance.measured_positions` says where data ends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


def tau_from_constant_rate(a: float, k: int) -> float:
    """Acceptance length for constant conditional rate ``a`` and ``k`` draft tokens."""
    if k < 0:
        raise ValueError("k must be >= 0")
    return float(sum(a**i for i in range(k + 1)))


def rate_from_tau(tau: float, k: int) -> float:
    """The constant conditional rate that gives acceptance length ``tau`` at ``k``."""
    if k < 1:
        raise ValueError("k must be >= 1 to infer a rate from an acceptance length")
    if not 1.0 <= tau <= k + 1.0:
        raise ValueError(f"acceptance length {tau} impossible with {k} draft tokens "
                         f"(must be within [1, {k + 1}])")
    lo, hi = 0.0, 1.0
    for _ in range(80):  # tau is increasing in a: bisection to machine precision
        mid = 0.5 * (lo + hi)
        if tau_from_constant_rate(mid, k) < tau:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@dataclasses.dataclass(frozen=True)
class Acceptance:
    """Conditional per-position acceptance rates with a geometric tail."""

    conditional: tuple[float, ...]
    source: str = ""

    def __post_init__(self) -> None:
        if not self.conditional:
            raise ValueError("need at least one acceptance rate")
        for a in self.conditional:
            if not 0.0 <= a <= 1.0:
                raise ValueError(f"acceptance rates must be within [0, 1], got {a}")

    # -- constructors ---------------------------------------------------------------------
    @classmethod
    def from_per_position(cls, rates: Sequence[float], source: str = "") -> Acceptance:
        """From vLLM-style per-position rates ``r_i`` (non-increasing)."""
        rates = [float(r) for r in rates]
        if not rates:
            raise ValueError("need at least one per-position rate")
        prev = 1.0
        cond = []
        for i, r in enumerate(rates, start=1):
            if not 0.0 <= r <= 1.0:
                raise ValueError(f"per-position rate {r} outside [0, 1]")
            if r > prev + 1e-12:
                raise ValueError(
                    f"per-position rates must not increase (position {i}: {r} > {prev}); "
                    "position i can only be accepted when position i-1 was"
                )
            cond.append(r / prev if prev > 0 else 0.0)
            prev = r
        return cls(tuple(cond), source or "per-position rates")

    @classmethod
    def from_conditional(cls, rates: Sequence[float], source: str = "") -> Acceptance:
        return cls(tuple(float(a) for a in rates), source or "conditional rates")

    @classmethod
    def from_tau(cls, tau: float, k: int, source: str = "") -> Acceptance:
        """From a mean acceptance length measured with ``k`` draft tokens."""
        a = rate_from_tau(tau, k)
        return cls((a,) * k, source or f"acceptance length {tau:g} at k={k}")

    @classmethod
    def from_draft_acceptance_rate(cls, rate: float, k: int, source: str = "") -> Acceptance:
        """From accepted draft tokens / drafted tokens measured with ``k`` draft tokens."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError("draft acceptance rate must be within [0, 1]")
        return cls.from_tau(1.0 + rate * k, k, source or f"draft acceptance rate {rate:g} at k={k}")

    @classmethod
    def none(cls) -> Acceptance:
        """A draft that is never accepted."""
        return cls((0.0,), "never accepted")

    # -- views ------------------------------------------------------------------------------
    @property
    def measured_positions(self) -> int:
        return len(self.conditional)

    def conditional_at(self, i: int) -> float:
        """Conditional rate of position ``i`` (1-based); the tail repeats the last one."""
        if i < 1:
            raise ValueError("positions are 1-based")
        return self.conditional[min(i, len(self.conditional)) - 1]

    def per_position(self, k: int) -> list[float]:
        out, prod = [], 1.0
        for i in range(1, k + 1):
            prod *= self.conditional_at(i)
            out.append(prod)
        return out

    def tau(self, k: int) -> float:
        """Expected tokens emitted per step with ``k`` draft tokens (bonus included)."""
        if k < 0:
            raise ValueError("k must be >= 0")
        return 1.0 + sum(self.per_position(k))

    def draft_acceptance_rate(self, k: int) -> float:
        return (self.tau(k) - 1.0) / k if k else 0.0

    def scaled(self, factor: float, source_note: str = "") -> Acceptance:
        """Every conditional rate multiplied by ``factor`` (e.g. reduced-vocab coverage)."""
        if not 0.0 <= factor <= 1.0:
            raise ValueError("scale factor must be within [0, 1]")
        src = f"{self.source} x {factor:g}" + (f" ({source_note})" if source_note else "")
        return Acceptance(tuple(a * factor for a in self.conditional), src)


def from_draft_profile(acceptance: dict | None, dataset: str | None = None) -> Acceptance | None:
    """The reported acceptance of a draft profile (``None`` when it publishes none)."""
    if not acceptance:
        return None
    values = acceptance.get("values", {})
    if not values:
        return None
    ds = dataset or acceptance.get("default_dataset") or sorted(values)[0]
    if ds not in values:
        raise KeyError(f"no reported acceptance for dataset {ds!r}; available: "
                       f"{', '.join(sorted(values))}")
    value, k_ref, metric = values[ds], int(acceptance["k_ref"]), acceptance["metric"]
    source = f"{ds}: {acceptance.get('source', '')}".strip()
    if metric == "acceptance_length":
        return Acceptance.from_tau(float(value), k_ref, source)
    if metric == "draft_acceptance_rate":
        return Acceptance.from_draft_acceptance_rate(float(value), k_ref, source)
    if metric == "per_position":
        return Acceptance.from_per_position(value, source)
    raise ValueError(f"unknown acceptance metric {metric!r}")
