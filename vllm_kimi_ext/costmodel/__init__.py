"""PCIe decode cost model and recommender for speculative decoding of Kimi-K2.5.

Pure Python over JSON profiles (``profiles/``); it never imports vLLM or torch, so it runs
anywhere. Entry points:

- :class:`CostModel` / :class:`Plan` - one decode step's time, bytes and collectives;
- :class:`Acceptance` - per-position rates, acceptance length and their conversions;
- :func:`calibrate` - the two-parameter fit against published figures;
- :func:`recommend` - the configuration to run, with an explanation;
- ``vllm-kimi-ext plan`` (:mod:`.cli`) and :mod:`.report` for tables, plots and docs.
"""

from vllm_kimi_ext.costmodel.acceptance import Acceptance, from_draft_profile
from vllm_kimi_ext.costmodel.calibration import CalibrationResult, calibrate
from vllm_kimi_ext.costmodel.catalog import (
    DraftProfile,
    HardwareProfile,
    ModelProfile,
    UnknownProfileError,
    list_profiles,
    load_draft,
    load_hardware,
    load_model,
)
from vllm_kimi_ext.costmodel.latency import LatencyTable, load_latency_table
from vllm_kimi_ext.costmodel.model import CalibParams, CostModel, Plan, StepEstimate
from vllm_kimi_ext.costmodel.recommend import Recommendation, recommend

__all__ = [
    "Acceptance",
    "CalibParams",
    "CalibrationResult",
    "CostModel",
    "DraftProfile",
    "HardwareProfile",
    "LatencyTable",
    "ModelProfile",
    "Plan",
    "Recommendation",
    "StepEstimate",
    "UnknownProfileError",
    "calibrate",
    "from_draft_profile",
    "list_profiles",
    "load_draft",
    "load_hardware",
    "load_latency_table",
    "load_model",
    "recommend",
]
