"""vLLM 0.34.0 accepts the capture configuration ``draft capture --vllm-target`` builds
(``extract_hidden_states`` + ``ExampleHiddenStatesConnector``) for a Kimi-K2.5 target,
the last layer included. Running it needs CUDA (the connector copies on CUDA streams);
this checks the configuration path on CPU."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm


def test_vllm_builds_the_capture_config_for_kimi(tiny_kimi_dir, tmp_path):
    from vllm_kimi_ext.testing.vllm_cpu import make_vllm_config
    from vllm_kimi_ext.train.capture import vllm_engine_kwargs

    ids = [0, 1, 2, 3]  # the tiny target has 3 layers: 3 aux taps + the last layer
    kw = vllm_engine_kwargs(tiny_kimi_dir, ids, tmp_path / "staging", tensor_parallel_size=1)
    model = kw.pop("model")
    cfg = make_vllm_config(model, tensor_parallel_size=kw.pop("tensor_parallel_size"),
                           speculative_config=kw.pop("speculative_config"), **kw)
    spec = cfg.speculative_config
    assert spec.method == "extract_hidden_states" and spec.num_speculative_tokens == 1
    assert list(spec.draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids) == ids
    assert spec.draft_model_config.hf_config.architectures == ["ExtractHiddenStatesModel"]
    kv = cfg.kv_transfer_config
    assert kv.kv_connector == "ExampleHiddenStatesConnector" and kv.kv_role == "kv_producer"
    assert kv.kv_connector_extra_config["shared_storage_path"] == str(tmp_path / "staging")
