"""JSON every parser reads: :func:`strict` turns non-finite floats into None (the cost
model's and the trainer's JSON outputs both use it; neither imports the other's CLI)."""

from __future__ import annotations

import math


def strict(value):
    """``value`` with every non-finite float made None, so JSON has no NaN or Infinity."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)
