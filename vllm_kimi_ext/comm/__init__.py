"""Collective accounting (calls and bytes per phase) over vLLM's group collectives."""

from vllm_kimi_ext.comm.accounting import (
    COLLECTIVE_METHODS,
    CollectiveCall,
    CollectiveCounter,
    StepReporter,
    active_counter,
    phase,
)

__all__ = [
    "COLLECTIVE_METHODS",
    "CollectiveCall",
    "CollectiveCounter",
    "StepReporter",
    "active_counter",
    "phase",
]
