"""``draft train`` / ``draft eval`` at the sizes of a real run, in miniature: what a
length limit drops is warned and counted, a validation split stops training early and
the exported head is the best one, and the evaluation's cut is counted too."""

from __future__ import annotations

import json

import pytest

from testkit.checkpoints import TinyKimiSpec

pytestmark = pytest.mark.vllm
pytest.importorskip("speculators", reason="training stack not installed")

SPEC = TinyKimiSpec()
LAYER_IDS = [0, 1, 2, SPEC.num_hidden_layers]
PROMPT, RESPONSE = 8, 32


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(transformers model, target directory, 8 samples of 8 + 32 tokens)."""
    import torch
    from transformers import AutoModelForCausalLM

    from testkit.checkpoints import write_tiny_deepseek_v3
    from vllm_kimi_ext.train import layout
    from vllm_kimi_ext.train.bridge import write_target_stub

    root = tmp_path_factory.mktemp("train-scale")
    write_tiny_deepseek_v3(root / "dsv3", SPEC)
    model = AutoModelForCausalLM.from_pretrained(root / "dsv3", dtype=torch.float32).eval()
    target = write_target_stub(model, root / "target")
    g = torch.Generator().manual_seed(5)
    samples = []
    for i in range(8):
        ids = torch.randint(0, SPEC.num_ranks, (PROMPT + RESPONSE,), generator=g).tolist()
        samples.append(layout.Sample(i, f"s{i}", "synthetic", [], ids[:PROMPT], ids[PROMPT:]))
    return model, target, samples


def _capture(model, samples, data_dir, shard=(0, 1)):
    from vllm_kimi_ext.train import capture, layout

    if not (data_dir / layout.SAMPLES).exists():
        layout.append_samples(data_dir, samples)
    return capture.capture(data_dir, capture.TransformersCapture(model), layer_ids=LAYER_IDS,
                           progress=False, log=lambda _m: None, shard=shard)


@pytest.fixture(scope="module")
def data(tiny):
    """(data directory, target directory) with every sample captured."""
    model, target, samples = tiny
    _capture(model, samples, target.parent / "data")
    return target.parent / "data", target


def test_three_capture_shards_make_the_unsharded_capture(tiny, data, tmp_path):
    from vllm_kimi_ext.train import layout

    model, _, samples = tiny
    whole, _ = data
    sharded = tmp_path / "sharded"
    for i in (2, 0):
        section = _capture(model, samples, sharded, shard=(i, 3))
        assert {e["index"] % 3 for e in section["samples"]} <= {0, 2}
    assert not layout.hidden_path(sharded, 1).exists()
    _capture(model, samples, sharded, shard=(1, 3))
    files = sorted(p.name for p in (sharded / layout.HIDDEN_DIR).iterdir())
    assert files == sorted(p.name for p in (whole / layout.HIDDEN_DIR).iterdir())
    for name in files:
        if name == layout.SHARD_LOG:  # a log in capture order: compared as records below
            continue
        assert ((sharded / layout.HIDDEN_DIR / name).read_bytes() ==
            (whole / layout.HIDDEN_DIR / name).read_bytes()), name
    assert layout.shard_records(sharded) == layout.shard_records(whole)
    a = layout.read_manifest(sharded)["capture"]
    b = layout.read_manifest(whole)["capture"]
    assert a["samples"] == b["samples"] and a["disk_bytes"] == b["disk_bytes"]


def test_training_cut_is_warned_counted_and_really_applied(data, tmp_path):
    from vllm_kimi_ext.train.trainer import TrainConfig, train

    said = []
    result = train(*data, tmp_path / "d", config=TrainConfig(
        max_steps=4, max_len=24, seed=0), progress=False, log=said.append)
    record = json.loads((tmp_path / "d" / "training.json").read_text())
    cut = record["truncation"]
    # every sample is 40 tokens: 16 dropped each, all of them response tokens
    assert cut == {"max_len": 24, "samples_cut": 8, "samples": 8, "tokens_dropped": 8 * 16,
                   "loss_tokens_dropped": 8 * 16, "loss_tokens": 8 * RESPONSE}
    assert any(m.startswith("warning: --max-len 24 cuts 8 of 8 samples") for m in said), said
    # one cut sample per step: 24 tokens, 23 positions after speculators' shift_batch
    # (each position paired with the next token); uncut, a step would hold 39
    assert result.tokens == 4 * 23


def test_validation_stops_early_and_exports_the_best_head(data, tmp_path):
    import torch
    from safetensors.torch import load_file

    from vllm_kimi_ext.train import runstate
    from vllm_kimi_ext.train.trainer import TrainConfig, train

    # a learning rate that overshoots: validation loss gets worse after its best point
    cfg = TrainConfig(max_steps=30, max_len=48, lr=0.3, warmup_ratio=0.0, seed=0,
                      val_fraction=0.3, val_every=1, patience=2, checkpoint_every=1,
                      checkpoint_dir=str(tmp_path / "ck"))
    said = []
    result = train(*data, tmp_path / "d", config=cfg, progress=False, log=said.append)
    record = json.loads((tmp_path / "d" / "training.json").read_text())
    stop, best = record["stopped_early"], record["best_step"]
    assert stop is not None and stop < 30 and result.steps == stop, record["validation"]
    assert stop - best == 2  # patience 2
    losses = dict(record["validation"])
    assert losses[best] == min(losses.values())
    assert record["val_samples"] > 0 and record["samples"] + record["val_samples"] == 8
    # the export is the best state, not the last one (the checkpoint at the stop holds both)
    _, payload = runstate.load_latest(tmp_path / "ck")
    exported = load_file(tmp_path / "d" / "model.safetensors")
    assert torch.equal(exported["fc.weight"], payload["best"]["fc.weight"].to(
        exported["fc.weight"].dtype))
    assert not torch.equal(payload["best"]["fc.weight"], payload["model"]["fc.weight"])


def test_a_second_run_into_a_checkpoint_folder_needs_resume(data, tmp_path):
    from vllm_kimi_ext.train.layout import DataError
    from vllm_kimi_ext.train.trainer import TrainConfig, train

    cfg = TrainConfig(max_steps=3, max_len=48, seed=0, checkpoint_every=1,
                      checkpoint_dir=str(tmp_path / "ck"))
    train(*data, tmp_path / "a", config=cfg, progress=False, log=lambda _m: None)
    with pytest.raises(DataError, match="pass --resume"):
        train(*data, tmp_path / "b", config=cfg, progress=False, log=lambda _m: None)
    other = TrainConfig(max_steps=3, max_len=48, seed=1, checkpoint_every=1, resume=True,
                        checkpoint_dir=str(tmp_path / "ck"))
    with pytest.raises(DataError, match="'seed' was 0, now 1"):
        train(*data, tmp_path / "b", config=other, progress=False, log=lambda _m: None)


def test_eval_counts_what_its_length_limit_cuts(data):
    from vllm_kimi_ext.train.evaluate import evaluate
    from vllm_kimi_ext.train.trainer import TrainConfig, train

    data_dir, target = data
    head = data_dir.parent / "eval-head"
    if not head.exists():
        train(data_dir, target, head, config=TrainConfig(max_steps=2, max_len=48, seed=0),
              progress=False, log=lambda _m: None)
    whole = evaluate(data_dir, target, head, k=3, progress=False)["all"]
    cut = evaluate(data_dir, target, head, k=3, max_len=24, progress=False)["all"]
    assert whole["samples_cut"] == 0 and whole["tokens_dropped"] == 0
    assert cut["samples_cut"] == 8 and cut["tokens_dropped"] == 8 * 16
    assert cut["loss_tokens_dropped"] == 8 * 16
    assert 0 < cut["chains"] < whole["chains"]


def test_loader_workers_feed_the_same_batches(data, tmp_path):
    """Shards read in DataLoader worker processes: the same steps as in-process reads."""
    from vllm_kimi_ext.train.trainer import TrainConfig, train

    runs = [train(*data, tmp_path / f"w{n}", config=TrainConfig(
        max_steps=3, max_len=48, seed=0, loader_workers=n), progress=False,
        log=lambda _m: None) for n in (0, 2)]
    assert runs[0].losses == runs[1].losses and runs[0].tokens == runs[1].tokens
