"""The cost model's free parameters and where their values come from.

Ten numbers are not known from the hardware's data sheet or the model's config; they are
fitted to public measurements (:mod:`.calibration`) and committed in the hardware profile
(``calibration.fitted``), with the hardware profile's ``calibration.priors`` as the values
used before any fit:

``bandwidth_efficiency``      fraction of peak memory bandwidth achieved streaming weights
``collective_overhead_us``    time added to every collective in situ on top of the idle
                              latency table (rank skew: a collective ends with its slowest rank)
``kv_read_factor``            attention's time per MLA-latent KV byte relative to streaming
                              weights (1 = as fast as a weight read; the context cost)
``kv_query_share``            extra KV read per additional token of a sequence verified in the
                              same pass (0 = the k+1 tokens share one read, 1 = each re-reads)
``routing_skew``              s in "the q tokens of one sequence verified together touch as many
                              experts as 1 + (q-1)/s independent tokens" (1 = independent)
``expert_popularity``         Zipf exponent of how often each expert is chosen by independent
                              tokens (0 = uniform): how fast a batch's distinct experts saturate
``spec_step_overhead_us``     fixed cost of a speculative step beyond its passes (rejection
                              sampling, draft input preparation, bookkeeping)
``draft_forward_overhead_us`` fixed cost of each draft forward beyond its weights and
                              collectives (launches and host work between draft steps)
``compute_efficiency``        fraction of peak BF16 tensor throughput reached where a pass is
                              compute-bound (large batch x verified tokens)
``kernel_gap_us``             idle gap per kernel launch inside a CUDA-graph replay
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from vllm_kimi_ext.costmodel.catalog import ProfileError

#: Parameters the calibration fits, in the order of its parameter vector.
FITTED = ("bandwidth_efficiency", "collective_overhead_us", "kv_read_factor", "kv_query_share",
          "routing_skew", "expert_popularity", "spec_step_overhead_us", "draft_forward_overhead_us",
          "compute_efficiency", "kernel_gap_us")

#: Physical limits of each parameter (what the fit may explore).
BOUNDS = {
    "bandwidth_efficiency": (0.2, 1.0),
    "collective_overhead_us": (0.0, 200.0),
    "kv_read_factor": (0.5, 20.0),
    "kv_query_share": (0.0, 1.0),
    "routing_skew": (1.0, 16.0),
    "expert_popularity": (0.0, 1.2),
    "spec_step_overhead_us": (0.0, 10000.0),
    "draft_forward_overhead_us": (0.0, 5000.0),
    "compute_efficiency": (0.05, 1.0),
    "kernel_gap_us": (0.0, 10.0),
}


@dataclasses.dataclass(frozen=True)
class CalibParams:
    """Values of the free parameters (see the module docstring)."""

    bandwidth_efficiency: float
    collective_overhead_us: float
    kv_read_factor: float = 1.0
    kv_query_share: float = 0.0
    routing_skew: float = 1.0
    expert_popularity: float = 0.0
    spec_step_overhead_us: float = 100.0
    draft_forward_overhead_us: float = 0.0
    compute_efficiency: float = 0.5
    kernel_gap_us: float = 1.0
    calibrated: bool = False
    note: str = ""

    def __post_init__(self) -> None:
        # Only what would make the arithmetic meaningless is refused here: a fit may explore
        # points outside the physical bounds before it is clamped to them.
        for name in FITTED:
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        for name in ("bandwidth_efficiency", "kv_read_factor", "routing_skew",
                     "compute_efficiency"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")

    @property
    def physical(self) -> bool:
        """Every parameter within :data:`BOUNDS`."""
        return all(lo <= getattr(self, n) <= hi for n, (lo, hi) in BOUNDS.items())

    def to_dict(self) -> dict[str, Any]:
        return {n: getattr(self, n) for n in FITTED}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "parameters", **extra: Any
                  ) -> CalibParams:
        """From a profile's ``priors``/``fitted`` object; unknown or missing names are
        errors naming ``where``."""
        unknown = sorted(set(d) - set(FITTED) - {"fitted_on", "tool", "note"})
        if unknown:
            raise ProfileError(f"{where}: unknown parameter {unknown[0]!r} "
                               f"(expected {', '.join(FITTED)})")
        values = {}
        for n in FITTED:
            if n not in d:
                raise ProfileError(f"{where}: field {n!r} is missing")
            v = d[n]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ProfileError(f"{where}: field {n!r} must be a finite number, got {v!r}")
            values[n] = float(v)
        try:
            return cls(**values, **extra)
        except ValueError as exc:
            raise ProfileError(f"{where}: {exc}") from None
