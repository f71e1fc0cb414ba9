"""Canary: the vLLM 0.34.0 facts behind the what-if row "Adaptive verification"
(``vllm_kimi_ext/costmodel/whatif.py``): every speculative method reads the flag (it is no
method-specific option, the base draft-model speculator reads it), and it needs full CUDA
graphs and no LoRA. When one fails after an upgrade, revisit the row's text and ``_adaptive``."""

from __future__ import annotations

import inspect

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.canary]


def test_no_method_is_refused_the_flag():
    from vllm.config import speculative

    assert "enable_adaptive_verification" not in speculative._METHOD_SPECIFIC_OPTIONS
    # the docstring the row contradicts (it says DSpark only)
    src = inspect.getsource(speculative.SpeculativeConfig)
    assert ('Currently only\n    supported for method="dspark"' in src or
        'only supported for method="dspark"' in src.replace("\n    ", " "))


def test_the_base_speculator_and_the_runner_read_it_for_every_method():
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.gpu.spec_decode import speculator

    base = inspect.getsource(speculator)
    assert "self.speculative_config.enable_adaptive_verification" in base
    assert "maybe_create_adaptive_verification_manager(" in inspect.getsource(GPUModelRunner)


def test_it_needs_full_cuda_graphs_and_no_lora():
    from vllm.config.vllm import VllmConfig

    src = inspect.getsource(VllmConfig._validate_adaptive_verification)
    assert "has_full_cudagraphs()" in src and "requires full CUDA graphs" in src
    assert "lora_config is not None" in src
