"""Canaries for the training pipeline's use of vLLM 0.34.0: hidden-state capture
(``vllm_kimi_ext.train.capture.VllmCapture``) and the flat EAGLE-3 export
(``vllm_kimi_ext.train.bridge.export_flat``). A failure names the code to revisit."""

from __future__ import annotations

import inspect

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.canary]


def test_extract_hidden_states_method_and_connector():
    """VllmCapture asks for method ``extract_hidden_states`` with the
    ``ExampleHiddenStatesConnector`` and reads its files with ``load_hidden_states``."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1 import example_hidden_states_connector as c
    from vllm.v1.worker.gpu.spec_decode.extract_hidden_states_config import (
        ExtractHiddenStatesSpeculatorConfig,
    )

    assert ExtractHiddenStatesSpeculatorConfig.base_method == "extract_hidden_states"
    assert "ExampleHiddenStatesConnector" in KVConnectorFactory._registry
    assert callable(c.load_hidden_states) and callable(c.cleanup_hidden_states)
    write = inspect.getsource(c.ExampleHiddenStatesConnector._submit_async_write)
    assert '"hidden_states"' in write and '"token_ids"' in write
    meta = inspect.getsource(c.ExampleHiddenStatesConnector.build_connector_meta)
    assert '"hidden_states_path"' in meta and "allow_custom_save_path" in meta


def test_aux_states_are_residual_sums_after_layer_i():
    """Layer id i = the residual stream after i decoder layers (hidden + residual), the
    convention TransformersCapture reproduces with output_hidden_states."""
    from vllm.model_executor.models.interfaces import EagleModelMixin

    src = inspect.getsource(EagleModelMixin._maybe_add_hidden_state)
    assert "hidden_states + residual" in src


def test_eagle3_llama_loader_reads_flat_heads():
    """export_flat writes fc / layers.0 / norm / lm_head / d2t; the loader maps d2t to
    draft_id_to_target_id and reads eagle_aux_hidden_state_layer_ids from the config."""
    from vllm.model_executor.models import llama_eagle3

    load = inspect.getsource(llama_eagle3.Eagle3LlamaForCausalLM.load_weights)
    assert '"d2t"' in load and "draft_id_to_target_id" in load
    assert "norm_before_residual" in inspect.getsource(llama_eagle3)
