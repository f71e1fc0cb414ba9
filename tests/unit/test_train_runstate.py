"""The pieces of a long ``draft train`` run that need no model: the validation split,
the resumed data position, checkpoint files, the settings check and the count of
what a length limit drops."""

from __future__ import annotations

import pytest

from vllm_kimi_ext.train import runstate
from vllm_kimi_ext.train.layout import DataError, Sample

torch = pytest.importorskip("torch")


def _sample(i: int, prompt: int = 4, response: int = 6, conv: str | None = None) -> Sample:
    s = Sample(i, f"h{i:04d}", "src", [], list(range(prompt)), list(range(response)))
    if conv is not None:
        s.conversation = conv  # type: ignore[attr-defined]
    return s


def test_validation_split_keeps_conversations_whole_and_is_stable():
    # 300 conversations of 1-3 turns each
    samples = [_sample(10 * c + t, conv=f"conv{c}") for c in range(300) for t in range(1 + c % 3)]
    train, val = runstate.split_validation(samples, 0.2, seed=0)
    assert len(train) + len(val) == len(samples)
    assert {s.conversation for s in train}.isdisjoint({s.conversation for s in val})
    # a fair share, not all-or-nothing (300 conversations at 0.2: 60 expected)
    n_val = len({s.conversation for s in val})
    assert 35 < n_val < 85, n_val
    # the order of the input does not move a conversation to the other side
    again = runstate.split_validation(list(reversed(samples)), 0.2, seed=0)[1]
    assert {s.index for s in again} == {s.index for s in val}
    other_seed = runstate.split_validation(samples, 0.2, seed=1)[1]
    assert {s.index for s in other_seed} != {s.index for s in val}
    assert runstate.split_validation(samples, 0.0, seed=0) == (samples, [])


def test_samples_without_conversation_id_split_by_prompt_hash():
    samples = [_sample(i) for i in range(200)]
    train, val = runstate.split_validation(samples, 0.25, seed=0)
    assert 25 < len(val) < 75 and len(train) + len(val) == 200


def test_skip_batches_leaves_out_the_first_batches_only():
    inner = [[0, 1], [2], [3, 4], [5]]
    assert list(runstate.SkipBatches(inner, 0)) == inner
    assert list(runstate.SkipBatches(inner, 3)) == [[5]]
    assert len(runstate.SkipBatches(inner, 3)) == 1
    assert list(runstate.SkipBatches(inner, 9)) == [] and len(runstate.SkipBatches(inner, 9)) == 0


def _payload(step: int) -> dict:
    return {"run": {"lr": 1e-3}, "model": {"w": torch.full((2,), float(step))},
            "optimizer": {}, "scheduler": {}, "best": None,
            "loop": {"step": step}, "rng": [runstate.rng_state()]}


def test_checkpoints_are_renamed_into_place_and_pruned(tmp_path):
    root = tmp_path / "ck"
    assert runstate.load_latest(root) is None
    for step in (2, 4, 6):
        runstate.save_checkpoint(root, step, _payload(step))
    assert [s for s, _ in runstate.checkpoint_dirs(root)] == [4, 6]
    # a killed save leaves a temporary folder: ignored, the newest complete one loads
    torn = root / ".step-000000008.tmp"
    torn.mkdir()
    (torn / runstate.STATE_FILE).write_bytes(b"\x00torn")
    path, payload = runstate.load_latest(root)
    assert path.name == "step-000000006" and payload["loop"]["step"] == 6
    assert torch.equal(payload["model"]["w"], torch.full((2,), 6.0))
    # a later save of the same step replaces the torn folder
    runstate.save_checkpoint(root, 8, _payload(8))
    assert not torn.exists() and runstate.load_latest(root)[1]["loop"]["step"] == 8


def test_an_unreadable_checkpoint_is_refused_with_its_path(tmp_path):
    root = tmp_path / "ck"
    runstate.save_checkpoint(root, 2, _payload(2))
    state = root / "step-000000002" / runstate.STATE_FILE
    state.write_bytes(state.read_bytes()[:50])
    with pytest.raises(DataError, match="step-000000002"):
        runstate.load_latest(root)


def test_rng_state_round_trips():
    import random

    import numpy as np

    state = runstate.rng_state()
    a = (torch.rand(3), random.random(), np.random.rand())
    runstate.set_rng_state(state)
    b = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(a[0], b[0]) and a[1:] == b[1:]


def test_resume_refuses_other_settings_naming_the_field():
    saved = {"lr": 1e-3, "world_size": 2, "total_steps": 10}
    runstate.check_same_run(saved, dict(saved), "ck")
    with pytest.raises(DataError, match="'world_size' was 2, now 4"):
        runstate.check_same_run(saved, {**saved, "world_size": 4}, "ck/step-1")


def test_truncation_counts_every_dropped_token():
    from vllm_kimi_ext.train.trainer import truncation, warn_truncation

    samples = [_sample(0, 4, 6), _sample(1, 10, 20), _sample(2, 30, 5)]
    c = truncation(samples, 12)
    # sample 1: 30 tokens, 18 dropped, all response; sample 2: 35 tokens, 23 dropped,
    # the 5 response tokens among them
    assert c["samples_cut"] == 2 and c["tokens_dropped"] == 18 + 23
    assert c["loss_tokens_dropped"] == 18 + 5 and c["loss_tokens"] == 31
    # prompt_context keeps the last 8 prompt tokens: sample 2 is then 13 tokens, 1 dropped
    c2 = truncation(samples, 12, prompt_context=8)
    assert c2["tokens_dropped"] == (8 + 20 - 12) + (13 - 12)
    said = []
    warn_truncation(c, "--max-len", said.append)
    assert said and "2 of 3 samples" in said[0] and "23 of 31 response tokens" in said[0]
    said.clear()
    warn_truncation(truncation(samples, 100), "--max-len", said.append)
    assert said == []


def test_samples_read_without_token_ids_keep_lengths_masks_and_find_their_line(tmp_path):
    from vllm_kimi_ext.train import layout

    full = [_sample(i, prompt=3 + i, response=2 + 2 * i) for i in range(5)]
    full.append(Sample(5, "h5", "src", [], [1, 2, 3, 4], [5, 6], conversation="c",
                       loss_spans=[[1, 3], [4, 6]]))
    layout.append_samples(tmp_path, full)
    with open(tmp_path / layout.SAMPLES, "a") as fh:
        fh.write('{"index": 9, "prompt_to')  # torn tail of an interrupted run
    light = layout.read_samples(tmp_path, tokens=False)
    assert [s.index for s in light] == list(range(6))
    for a, b in zip(full, light):
        assert b.prompt_token_ids == [] and b.output_token_ids == []  # no ids held
        assert (b.num_tokens, b.prompt_len, b.output_len) == (a.num_tokens, a.prompt_len,
                                                               a.output_len)
        assert b.loss_mask == a.loss_mask and b.num_loss_tokens == a.num_loss_tokens
        assert layout.with_tokens(tmp_path, b) == a
    with pytest.raises(RuntimeError, match="without its token ids"):
        light[0].input_ids  # noqa: B018 - the property raises


class _Seeded:
    """A capture backend writing seeded states; ``offset`` changes every value."""

    hidden_size, num_hidden_layers = 8, 3
    description = {"backend": "test", "target": "t", "tensor_parallel_size": 1}

    def __init__(self, offset: float = 0.0):
        self.offset = offset

    def capture(self, samples, layer_ids, paths, dtype):
        from vllm_kimi_ext.train import capture

        for s, p in zip(samples, paths):
            g = torch.Generator().manual_seed(s.index)
            hs = torch.randn(s.num_tokens, len(layer_ids), 8, generator=g) + self.offset
            capture._save_shard(p, hs.to(torch.bfloat16), torch.tensor(s.input_ids))


def _identity(data, target, samples):
    from vllm_kimi_ext.train import trainer
    from vllm_kimi_ext.train.settings import TrainConfig

    return trainer.run_identity(TrainConfig(), data_dir=data, target_dir=target, init=None,
                                samples=samples, val=[], world=1)


def test_resume_identity_is_content_not_paths(tmp_path):
    """A data folder (and target) moved elsewhere keeps the run's identity, so a resume
    goes on; shards re-captured with other values, or a changed target file, do not."""
    import json
    import shutil

    from vllm_kimi_ext.train import capture, layout

    data, target = tmp_path / "a" / "data", tmp_path / "a" / "target"
    layout.append_samples(data, [_sample(i) for i in range(3)])
    capture.capture(data, _Seeded(), layer_ids=[1, 3], progress=False, log=lambda _m: None)
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"hidden_size": 8}))
    (target / "model.safetensors").write_bytes(b"w" * 64)
    saved = _identity(data, target, layout.read_samples(data, tokens=False))
    ck = tmp_path / "ck" / "step-000000002"
    ck.mkdir(parents=True)
    (ck / "run.json").write_text(json.dumps(saved))
    (ck / runstate.STATE_FILE).write_bytes(b"weights")  # what makes it a checkpoint

    moved = tmp_path / "elsewhere"
    shutil.move(tmp_path / "a", moved)
    data, target = moved / "data", moved / "target"
    now = _identity(data, target, layout.read_samples(data, tokens=False))
    assert now == saved
    runstate.check_resume_identity(tmp_path / "ck", now)  # resumes

    for shard in (data / "hidden_states").glob("hs_*.safetensors"):
        shard.unlink()
    capture.capture(data, _Seeded(offset=1.0), layer_ids=[1, 3], progress=False,
                    log=lambda _m: None)
    rewritten = _identity(data, target, layout.read_samples(data, tokens=False))
    with pytest.raises(DataError, match=r"run setting 'train_data' was .* \(the training "
                                        "samples or their shards differ"):
        runstate.check_resume_identity(tmp_path / "ck", rewritten)
    (target / "model.safetensors").write_bytes(b"w" * 65)
    other_target = _identity(data, target, layout.read_samples(data, tokens=False))
    assert other_target["target_content"] != saved["target_content"]
