"""The training pipeline against computations made here, on the CI miniature's tiny
DeepSeek-V3-architecture target and captured data:

* ``draft train`` optimises the test-time-training loss at the configured depth (3 by
  default), not depth 1: its first recorded loss is the depth-3 loss of the initial
  head on the first batch, which differs from the depth-1 loss;
* a reduced-vocabulary export (``--draft-vocab-size``) loads through vLLM's EAGLE-3
  loader on the tiny Kimi-K2.5 target and gives the trained head's logits on the
  target ids its ``t2d`` marks (``d2t`` stored as offsets, as vLLM reads it);
* every field of the exported ``config.json`` equals the trained model's, for three
  sets of layer options, and vLLM builds the layer those flags describe;
* ``draft eval``'s α and τ equal a direct computation on a small fixed case (the chain
  window: start ``i`` of the shifted sequence predicts original tokens ``i+2 ..
  i+1+k``).
"""

from __future__ import annotations

import copy
import json

import pytest

from tests.vllm.test_train_miniature import (  # noqa: F401 (fixtures)
    LAYER_IDS,
    SPEC,
    captured,
    tiny_target,
)

pytestmark = pytest.mark.vllm
pytest.importorskip("speculators", reason="training stack not installed (pip install .[train])")

QUIET = {"progress": False, "log": lambda _m: None}


@pytest.fixture()
def forward_calls(monkeypatch):
    """Each speculators EAGLE-3 model the code under test runs, recorded at its first
    forward: ``{"model", "initial" (a copy as it was then), "inputs", "loss_config"}``."""
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel

    seen: list[dict] = []
    original = Eagle3DraftModel.forward

    def spy(self, *args, **kwargs):
        if not any(s["model"] is self for s in seen):
            seen.append({"model": self, "initial": copy.deepcopy(self),
                         "inputs": {k: v.clone() for k, v in kwargs.items()
                                    if torch.is_tensor(v)},
                         "loss_config": kwargs.get("loss_config")})
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Eagle3DraftModel, "forward", spy)
    return seen


def _train(captured, target, out, **kwargs):  # noqa: F811 (fixture value)
    from vllm_kimi_ext.train.trainer import TrainConfig, train

    cfg = kwargs.pop("config", None) or TrainConfig(max_steps=1, max_len=128,
                                                    warmup_ratio=0.0, seed=0)
    return train(captured, target, out, config=cfg, **kwargs, **QUIET)


# --------------------------------------------------------------------------- TTT depth


@pytest.mark.parametrize("depth", [None, 2], ids=["default", "ttt-steps-2"])
def test_training_optimises_the_loss_at_the_configured_depth(
        tiny_target, captured, forward_calls, tmp_path, depth):  # noqa: F811
    import torch

    from vllm_kimi_ext.train.trainer import TrainConfig

    cfg = TrainConfig(max_steps=1, max_len=128, warmup_ratio=0.0, seed=0)
    if depth is not None:
        cfg.ttt_steps = depth
    expected_depth = 3 if depth is None else depth
    result = _train(captured, tiny_target[1], tmp_path / "d", config=cfg)
    first = forward_calls[0]

    def loss(k: int) -> float:
        with torch.no_grad():
            _, value, _ = first["initial"](**first["inputs"], ttt_steps=k,
                                           loss_config=first["loss_config"])
        return float(value)

    by_depth = {k: loss(k) for k in (1, 2, 3)}
    # the premise: on this batch the depths give clearly different losses
    assert by_depth[1] < 0.7 * by_depth[2] < 0.7 * by_depth[3], by_depth
    assert result.losses[0] == pytest.approx(by_depth[expected_depth], rel=1e-4), by_depth


# --------------------------------------------------------------- reduced vocabulary


def test_reduced_vocab_export_round_trips_through_vllms_eagle3_loader(
        tiny_target, captured, forward_calls, tiny_kimi_dir, tmp_path):  # noqa: F811
    import torch
    from safetensors.torch import load_file

    from testkit.vllm_cpu import compute_logits, load_model, make_vllm_config

    out = tmp_path / "reduced"
    result = _train(captured, tiny_target[1], out, draft_vocab_size=64)
    assert result.doctor["ok"], result.doctor
    head = forward_calls[0]["model"]  # the trained speculators model
    kept = head.t2d.nonzero().flatten()  # target ids of draft ids 0..63, ascending
    assert kept.numel() == 64 and bool((kept[1:] > kept[:-1]).all())
    written = load_file(out / "model.safetensors")
    assert torch.equal(written["d2t"], kept - torch.arange(64))  # offsets, not ids
    assert json.loads((out / "config.json").read_text())["draft_vocab_size"] == 64

    cfg = make_vllm_config(tiny_kimi_dir, speculative_config={
        "method": "eagle3", "model": str(out), "num_speculative_tokens": 3})
    model, report = load_model(cfg, cfg.speculative_config.draft_model_config)
    assert report.unwritten == []
    x = torch.randn(5, SPEC.hidden_size, generator=torch.Generator().manual_seed(0))
    got = compute_logits(model, cfg, x.to(torch.bfloat16)).float()
    assert got.shape == (5, SPEC.vocab_size)
    with torch.no_grad():  # the trained head's own draft logits, from its bf16 weights
        want = x.to(torch.bfloat16).float() @ head.lm_head.weight.to(torch.bfloat16).float().T
    assert torch.allclose(got[:, kept], want, atol=0.02 * float(want.abs().max())), (
        (got[:, kept] - want).abs().max())
    others = torch.ones(SPEC.vocab_size, dtype=torch.bool)
    others[kept] = False
    assert bool(torch.isneginf(got[:, others]).all())
    # the target's token each draft row proposes, as vLLM maps it
    assert torch.equal(got.argmax(-1), kept[want.argmax(-1)])


# ----------------------------------------------------------------- exported config


OPTION_SETS = {
    "defaults": {},
    "eagle-3.1": {"norm_before_residual": False, "norm_before_fc": True, "norm_output": True},
    "fc-norm": {"fc_norm": True},
}


@pytest.mark.parametrize("name", sorted(OPTION_SETS))
def test_every_exported_config_field_is_the_trained_models(
        tiny_target, captured, forward_calls, tiny_kimi_dir, tmp_path, name):  # noqa: F811
    from testkit.vllm_cpu import load_model, make_vllm_config
    from vllm_kimi_ext.train import bridge

    options = bridge.DraftOptions(**OPTION_SETS[name])
    out = tmp_path / name
    _train(captured, tiny_target[1], out, options=options)
    trained = forward_calls[0]["model"].config
    layer = trained.transformer_layer_config.to_dict()
    tcfg = bridge.target_text_config(tiny_target[1])
    exported = json.loads((out / "config.json").read_text())

    flags = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
    expected = {
        "architectures": ["Eagle3LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": tcfg["vocab_size"], "draft_vocab_size": trained.draft_vocab_size,
        "eagle_aux_hidden_state_layer_ids": list(trained.eagle_aux_hidden_state_layer_ids),
        "num_aux_hidden_states": len(trained.eagle_aux_hidden_state_layer_ids),
        "target_hidden_size": tcfg["hidden_size"], "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        **{f: getattr(trained, f) for f in flags},
        **{k: tcfg.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")},
    }
    assert {f: getattr(trained, f) for f in flags} == {
        f: getattr(options, f) for f in flags}  # the options reached the model
    for key, value in exported.items():
        want = expected[key] if key in expected else layer[key]
        assert value == want, f"config.json {key}: {value!r}, trained model {want!r}"
    missing = [k for k in expected if k not in exported]
    assert missing == [], f"config.json lacks {missing}"
    for key in ("hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings"):
        assert exported[key] == layer[key], key

    # vLLM reads each flag and builds that layer
    cfg = make_vllm_config(tiny_kimi_dir, speculative_config={
        "method": "eagle3", "model": str(out), "num_speculative_tokens": 2})
    hf = cfg.speculative_config.draft_model_config.hf_config
    assert {f: bool(getattr(hf, f, False)) for f in flags} == {
        f: getattr(trained, f) for f in flags}
    model, report = load_model(cfg, cfg.speculative_config.draft_model_config)
    assert report.unwritten == []
    inner = model.model
    assert inner.norm_before_fc == trained.norm_before_fc
    assert (inner.fc_norm is not None) == trained.fc_norm
    assert bool(inner.norm_output) == trained.norm_output
    residual = inner.layers[0]._residual_norm.__name__
    assert residual == ("_norm_before_residual" if trained.norm_before_residual
                        else "_norm_after_residual")


# -------------------------------------------------------------------------- eval


def test_eval_alpha_and_tau_against_a_direct_computation(tiny_target, captured):  # noqa: F811
    """A head whose attention and MLP write nothing (``o_proj``, ``down_proj`` zero)
    and whose residual is its raw input: at every depth its distribution at shifted
    position ``i`` is ``softmax(lm_head(norm(fc(aux_i))))``. The target's ``p`` at
    original position ``t`` comes from the transformers model's own norm and head."""
    import torch

    from vllm_kimi_ext.train import bridge, evaluate, layout, trainer

    target_model, target = tiny_target
    k = 3
    cap = trainer.capture_settings(captured)
    torch.manual_seed(0)
    head = bridge.build_draft(target, cap["aux_layer_ids"], ttt_steps=k,
                              options=bridge.DraftOptions(norm_before_residual=False))
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.zero_()
    samples = layout.read_samples(captured)[:2]
    rows = evaluate.evaluate(captured, target, head, samples=samples, k=k, progress=False)

    alphas, greedy, taus = [], [], []
    for s, shard in layout.iter_training_records(captured, samples):
        hs = shard["hidden_states"].float()
        with torch.no_grad():
            p = torch.softmax(target_model.lm_head(target_model.model.norm(hs[:, -1])), -1)
            q = torch.softmax(head.lm_head(head.norm(head.fc(hs[:, :-1].flatten(1)))), -1)
        n, mask = s.num_tokens, s.loss_mask
        for i in range(n - 1):
            predicted = range(i + 2, i + 2 + k)  # original positions of the k tokens
            if predicted[-1] >= n or not all(mask[t] for t in predicted):
                continue
            a = [float(torch.minimum(p[i + 1 + j], q[i]).sum()) for j in range(k)]
            g = [float(int(q[i].argmax()) == int(p[i + 1 + j].argmax())) for j in range(k)]
            alphas.append(a)
            greedy.append(g)
            taus.append(1 + a[0] + a[0] * a[1] + a[0] * a[1] * a[2])
    chains = len(alphas)
    # 8 prompt + 32 response tokens: starts 6..35 of each sample
    assert chains == 2 * 30
    got = rows["all"]
    assert got["chains"] == chains
    for j in range(k):
        assert got["alpha"][j] == pytest.approx(sum(a[j] for a in alphas) / chains, abs=2e-3)
        assert got["greedy_alpha"][j] == pytest.approx(sum(g[j] for g in greedy) / chains)
    assert got["tau"] == pytest.approx(sum(taus) / chains, abs=5e-3)
    # the per-position alphas really vary, so a window off by one shows
    per_start = [a[0] for a in alphas]
    assert max(per_start) - min(per_start) > 0.05
