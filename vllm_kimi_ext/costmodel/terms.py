"""One line of a decode step's cost breakdown (shared by the target and draft costing)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Term:
    """One line of a step's breakdown."""

    phase: str  # target | verify | draft | overhead
    name: str
    time_s: float = 0.0
    hbm_bytes: float = 0.0
    flops: float = 0.0
    collectives: int = 0
    allreduces: int = 0
    comm_bytes: float = 0.0  # message size: AR buffer, or gathered output
    comm_bytes_per_rank: float = 0.0  # what this rank contributes (comm.accounting convention)
