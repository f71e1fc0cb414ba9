"""PCIe decode cost model and recommender for speculative decoding of Kimi-K2.5.

Pure Python over JSON profiles (``profiles/``); it never imports vLLM or torch, so it runs
anywhere. Entry points:

- :class:`CostModel` / :class:`Plan` - one decode step's time, bytes and collectives;
- :class:`Acceptance` - per-position rates, acceptance length and their conversions;
- :func:`validate` - measured against predicted at every public calibration point;
- :func:`recommend` - the configuration to run, with an explanation;
- :func:`headline` - the one answer the README, docs/what-to-run.md and ``nox -s bench`` show;
- ``vllm-kimi-ext plan`` (:mod:`.cli`) and :mod:`.report` for tables, plots and docs.
"""

from vllm_kimi_ext.costmodel.acceptance import Acceptance, AcceptanceBand, from_draft_profile
from vllm_kimi_ext.costmodel.catalog import (
    DraftProfile,
    HardwareProfile,
    ModelProfile,
    ProfileError,
    UnknownProfileError,
    list_profiles,
    load_draft,
    load_hardware,
    load_model,
)
from vllm_kimi_ext.costmodel.latency import LatencyTable, load_latency_table
from vllm_kimi_ext.costmodel.model import CostModel, Plan, StepEstimate, Variant
from vllm_kimi_ext.costmodel.params import CalibParams

_LAZY = {  # modules that also run as ``python -m``: imported on first use
    "ValidationReport": "vllm_kimi_ext.costmodel.calibration",
    "validate": "vllm_kimi_ext.costmodel.calibration",
    "headline": "vllm_kimi_ext.costmodel.headline",
    "recommend": "vllm_kimi_ext.costmodel.recommend",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Acceptance",
    "AcceptanceBand",
    "CalibParams",
    "CostModel",
    "DraftProfile",
    "HardwareProfile",
    "LatencyTable",
    "ModelProfile",
    "Plan",
    "ProfileError",
    "StepEstimate",
    "UnknownProfileError",
    "ValidationReport",
    "Variant",
    "from_draft_profile",
    "headline",
    "list_profiles",
    "load_draft",
    "load_hardware",
    "load_latency_table",
    "load_model",
    "recommend",
    "validate",
]
