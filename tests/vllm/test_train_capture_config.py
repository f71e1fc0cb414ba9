"""vLLM 0.34.0 accepts the capture configuration ``draft capture --vllm-target`` builds
(``extract_hidden_states`` + ``ExampleHiddenStatesConnector``) for a Kimi-K2.5 target,
the last layer included. Running it needs CUDA (the connector copies on CUDA streams);
this checks the configuration path on CPU."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm


def test_vllm_builds_the_capture_config_for_kimi(tiny_kimi_dir, tmp_path):
    from testkit.vllm_cpu import make_vllm_config
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


class _FakeLLM:
    """Stands in for ``vllm.LLM`` on CPU: writes each request's hidden states where the
    request's ``kv_transfer_params`` say, in the connector's format (plus its lock file),
    as ExampleHiddenStatesConnector does after the forward."""

    def __init__(self, hidden, layers, corrupt_ids=False):
        from types import SimpleNamespace

        cfg = SimpleNamespace(get_hidden_size=lambda: hidden,
                              get_total_num_hidden_layers=lambda: layers)
        self.llm_engine = SimpleNamespace(model_config=cfg)
        self.corrupt_ids = corrupt_ids

    def generate(self, prompts, params, use_tqdm=False):
        from pathlib import Path
        from types import SimpleNamespace

        import torch
        from safetensors.torch import save_file

        outs = []
        for prompt, sp in zip(prompts, params):
            path = sp.extra_args["kv_transfer_params"]["hidden_states_path"]
            ids = torch.tensor(prompt["prompt_token_ids"])
            if self.corrupt_ids:
                ids = ids + 1
            n = len(ids)
            hs = torch.arange(n * 4 * 8, dtype=torch.float32).reshape(n, 4, 8)
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            save_file({"hidden_states": hs.to(torch.bfloat16), "token_ids": ids}, path)
            Path(path + ".lock").touch()
            outs.append(SimpleNamespace(kv_transfer_params={"hidden_states_path": path}))
        return outs


def test_vllm_capture_moves_connector_files_into_the_data_directory(tmp_path):
    from vllm_kimi_ext.train import capture, layout

    data = tmp_path / "data"
    layout.append_samples(data, [layout.Sample(i, f"h{i}", "s", [], [1, 2, 3], [4, 5 + i])
                                 for i in range(3)])
    staging = tmp_path / "staging"
    backend = capture.VllmCapture(_FakeLLM(8, 8), target="t", staging_dir=staging,
                                  tensor_parallel_size=8)
    section = capture.capture(data, backend, progress=False, log=lambda _m: None)
    assert section["layer_ids"] == [2, 4, 5, 8] and section["tensor_parallel_size"] == 8
    assert section["backend"] == "vllm-extract_hidden_states"
    assert [e["shape"] for e in section["samples"]] == [[5, 4, 8]] * 3
    assert sorted(p.name for p in staging.iterdir()) == []  # moved, lock files removed
    records = list(layout.iter_training_records(data))
    assert [r[1]["token_ids"].tolist() for r in records] == [s.input_ids for s, _ in records]

    bad = capture.VllmCapture(_FakeLLM(8, 8, corrupt_ids=True), target="t",
                              staging_dir=staging, tensor_parallel_size=8)
    layout.append_samples(data, [layout.Sample(3, "h3", "s", [], [1], [2, 3])])
    with pytest.raises(layout.DataError, match="token ids differ from sample 3"):
        capture.capture(data, bad, progress=False, log=lambda _m: None)
