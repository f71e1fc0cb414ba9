"""CI miniature of the training pipeline: capture -> speculators training -> export ->
the doctor -> vLLM's EAGLE-3 loader, on a tiny DeepSeek-V3-architecture target (the
text stack of the tiny Kimi-K2.5 checkpoint, same dimensions) in a few seconds of CPU.
"""

from __future__ import annotations

import pytest

from testkit.checkpoints import TinyKimiSpec

pytestmark = pytest.mark.vllm
pytest.importorskip("speculators", reason="training stack not installed (pip install .[train])")

SPEC = TinyKimiSpec()
LAYER_IDS = [0, 1, 2, SPEC.num_hidden_layers]  # 3 aux taps + the last layer


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    """(transformers model, target directory for training) of a tiny DeepSeek-V3 text
    model with the tiny Kimi target's dimensions."""
    import torch
    from transformers import AutoModelForCausalLM

    from testkit.checkpoints import write_tiny_deepseek_v3
    from vllm_kimi_ext.train.bridge import write_target_stub

    root = tmp_path_factory.mktemp("train-target")
    write_tiny_deepseek_v3(root / "dsv3", SPEC)
    model = AutoModelForCausalLM.from_pretrained(root / "dsv3", dtype=torch.float32).eval()
    with torch.no_grad():  # a non-trivial final norm: norm(norm(h)) != norm(h)
        model.model.norm.weight.copy_(torch.linspace(0.5, 2.0, SPEC.hidden_size))
    return model, write_target_stub(model, root / "target")


@pytest.fixture(scope="module")
def captured(tiny_target, tmp_path_factory):
    import torch

    from vllm_kimi_ext.train import capture, layout

    model, _ = tiny_target
    data = tmp_path_factory.mktemp("train-data")
    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(8):
        ids = torch.randint(0, SPEC.num_ranks, (40,), generator=g).tolist()
        samples.append(layout.Sample(i, f"h{i}", "synthetic", [], ids[:8], ids[8:]))
    layout.append_samples(data, samples)
    capture.capture(data, capture.TransformersCapture(model), layer_ids=LAYER_IDS,
                    progress=False, log=lambda _m: None)
    return data


def test_captured_last_layer_reproduces_the_targets_logits(tiny_target, captured):
    """Layer id L is the pre-norm last state: lm_head(norm(h_L)) == the model's logits."""
    import torch

    from vllm_kimi_ext.train import layout

    model, _ = tiny_target
    sample, shard = next(layout.iter_training_records(captured))
    with torch.no_grad():
        logits = model(torch.tensor([sample.input_ids])).logits[0]
        again = model.lm_head(model.model.norm(shard["hidden_states"][:, -1].float()))
    assert shard["hidden_states"].shape == (40, 4, SPEC.hidden_size)
    assert torch.allclose(again, logits, atol=0.05 * float(logits.abs().max()))  # bf16 shards


def test_miniature_trains_exports_passes_doctor_and_loads_in_vllm(
        tiny_target, captured, tiny_kimi_dir, tmp_path):
    import torch
    from safetensors.torch import load_file

    from testkit.vllm_cpu import load_model, make_vllm_config
    from vllm_kimi_ext.drafts.doctor.diagnosis import diagnose
    from vllm_kimi_ext.train.trainer import TrainConfig, train

    _, target = tiny_target
    out = tmp_path / "draft"
    result = train(captured, target, out, config=TrainConfig(
        max_steps=16, lr=3e-3, max_len=128, warmup_ratio=0.0, seed=0), progress=False,
        log=lambda _m: None)
    losses = result.losses
    assert len(losses) == 16
    # the KL to the target falls: last steps well below the first (seeded; measured
    # 16-step runs end at about half the first loss)
    assert sum(losses[-4:]) / 4 < 0.8 * sum(losses[:4]) / 4, losses

    # the doctor accepts it against the tiny Kimi-K2.5 target
    report = diagnose(tiny_kimi_dir, out, method="eagle3")
    assert report.errors == [], report.format_text()

    # vLLM's EAGLE-3 loader builds it on the Kimi-K2.5 target, every parameter written
    cfg = make_vllm_config(tiny_kimi_dir, speculative_config={
        "method": "eagle3", "model": str(out), "num_speculative_tokens": 3})
    model, load_report = load_model(cfg, cfg.speculative_config.draft_model_config)
    assert type(model).__name__ == "Eagle3LlamaForCausalLM"
    assert load_report.unwritten == []
    params = dict(model.named_parameters())
    written = load_file(out / "model.safetensors")
    assert torch.equal(params["model.fc.weight"].cpu(), written["fc.weight"])
    assert (cfg.speculative_config.draft_model_config.hf_config
        .eagle_aux_hidden_state_layer_ids == LAYER_IDS[:-1])


def test_fine_tune_a_public_style_head_with_reduced_vocab(
        tiny_target, captured, tiny_kimi_dir, tmp_path):
    """--init with a head laid out as the public Kimi heads ship (``midlayer.*``, aux ids
    under ``eagle_config``, a 512-token draft vocabulary with d2t/t2d): its weights are
    the starting point, its vocabulary maps are kept, the result loads in vLLM."""
    import torch
    from safetensors.torch import load_file

    from testkit.checkpoints import TinyEagle3Spec, write_tiny_eagle3
    from testkit.vllm_cpu import load_model, make_vllm_config
    from vllm_kimi_ext.train.trainer import TrainConfig, train

    _, target = tiny_target
    public = tmp_path / "public"
    write_tiny_eagle3(public, SPEC, TinyEagle3Spec(draft_vocab_size=512,
                                                    aux_layer_ids=tuple(LAYER_IDS[:-1])))
    before = load_file(public / "model.safetensors")
    out = tmp_path / "mine"
    result = train(captured, target, out, init=public, config=TrainConfig(
        max_steps=2, lr=1e-3, max_len=128, seed=0), progress=False, log=lambda _m: None)
    assert result.doctor["ok"], result.doctor
    after = load_file(out / "model.safetensors")
    assert torch.equal(after["d2t"], before["d2t"]) and torch.equal(after["t2d"], before["t2d"])
    assert after["lm_head.weight"].shape == (512, SPEC.hidden_size)
    # started from the head's weights: two small steps stay close to them
    moved = (after["layers.0.mlp.down_proj.weight"].float()
             - before["midlayer.mlp.down_proj.weight"].float()).abs().max()
    assert 0 < float(moved) < 0.05
    cfg = make_vllm_config(tiny_kimi_dir, speculative_config={
        "method": "eagle3", "model": str(out), "num_speculative_tokens": 3})
    model, report = load_model(cfg, cfg.speculative_config.draft_model_config)
    assert report.unwritten == []
    assert torch.equal(model.draft_id_to_target_id.cpu(), before["d2t"])


def test_speculators_own_dataset_reads_the_data_directory(captured):
    """`draft capture --speculators-dataset` makes the directory `speculators train
    --data-path` input: its ArrowDataset reads our shards as its own."""
    import torch
    from speculators.train.data import ArrowDataset

    from vllm_kimi_ext.train import layout
    from vllm_kimi_ext.train.export import write_speculators_dataset

    write_speculators_dataset(captured)
    ds = ArrowDataset(128, captured, on_missing="raise")
    samples = layout.read_samples(captured)
    assert len(ds) == len(samples)
    item = ds[3]
    assert torch.equal(item["input_ids"], torch.tensor(samples[3].input_ids))
    assert item["hidden_states"].shape == (40, 3 * SPEC.hidden_size)
    assert item["verifier_last_hidden_states"].shape == (40, SPEC.hidden_size)
    assert item["loss_mask"].tolist() == samples[3].loss_mask
