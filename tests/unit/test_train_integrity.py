"""Training data you can trust: shard sizes and checksums recorded and verified on
resume, token ids from a server checked, a data directory resumed only against the
model that wrote it, strict JSON."""

from __future__ import annotations

import json

import pytest

from vllm_kimi_ext.train import capture, layout, regenerate, validate
from vllm_kimi_ext.train.layout import DataError, Sample


def _sample(i, prompt=(1, 2, 3), out=(4, 5)):
    return Sample(i, f"h{i}", "s", [{"role": "user", "content": f"q{i}"}], list(prompt),
                  list(out))


class _Backend:
    hidden_size, num_hidden_layers = 8, 8
    description = {"backend": "fake"}

    def __init__(self):
        self.captured: list[int] = []

    def capture(self, samples, layer_ids, paths, dtype):
        import torch

        for s, p in zip(samples, paths):
            self.captured.append(s.index)
            hs = torch.arange(s.num_tokens * len(layer_ids) * 8, dtype=torch.float32) + s.index
            capture._save_shard(p, hs.reshape(s.num_tokens, len(layer_ids), 8).to(torch.bfloat16),
                                torch.tensor(s.input_ids))


def _capture(data, backend=None):
    backend = backend or _Backend()
    logs: list[str] = []
    section = capture.capture(data, backend, progress=False, log=logs.append)
    return backend, section, logs


@pytest.fixture
def data(tmp_path):
    layout.append_samples(tmp_path, [_sample(i) for i in range(3)])
    return tmp_path


def test_the_manifest_records_each_shards_size_and_sha256(data):
    _, section, _ = _capture(data)
    for entry in section["samples"]:
        path = data / entry["file"]
        assert entry["bytes"] == path.stat().st_size
        assert entry["sha256"] == layout.file_sha256(path)
    assert (json.loads((data / layout.MANIFEST).read_text())["capture"]["samples"] ==
        section["samples"])


def test_resume_recaptures_a_truncated_and_an_overwritten_shard(data):
    _capture(data)
    clean = {i: layout.hidden_path(data, i).read_bytes() for i in range(3)}
    # truncated: cut inside the data (the header still parses, the shape still matches)
    p0 = layout.hidden_path(data, 0)
    p0.write_bytes(clean[0][:-6])
    # overwritten: same size and shape, other values (another sample's states)
    p2 = layout.hidden_path(data, 2)
    p2.write_bytes(clean[1])
    assert layout.captured(data, _sample(0), 4, 8) and layout.captured(data, _sample(2), 4, 8)
    backend, section, logs = _capture(data)
    assert sorted(backend.captured) == [0, 2]
    assert "2 shard(s) differ from their recorded size and sha256" in logs[0]
    assert {i: layout.hidden_path(data, i).read_bytes() for i in range(3)} == clean
    again, _, _ = _capture(data)
    assert again.captured == []  # now all verified


def test_a_shard_written_before_the_run_was_killed_is_kept_by_its_log_line(data):
    """The manifest is written at the end; the shard log holds what landed before."""
    _capture(data)
    manifest = json.loads((data / layout.MANIFEST).read_text())
    del manifest["capture"]
    (data / layout.MANIFEST).write_text(json.dumps(manifest))
    backend, _, _ = _capture(data)
    assert backend.captured == []
    # a shard with no record at all (killed between its rename and its log line)
    log = data / layout.HIDDEN_DIR / layout.SHARD_LOG
    log.write_text("".join(ln + "\n" for ln in log.read_text().splitlines()
                           if json.loads(ln)["index"] != 1))
    (data / layout.MANIFEST).write_text(json.dumps(manifest))
    backend, _, _ = _capture(data)
    assert backend.captured == [1]


def test_capture_checks_the_data_against_the_target_before_any_engine(data):
    with pytest.raises(DataError, match="sample 0 holds token id 5, outside the target's "
                                        r"vocabulary \[0, 5\)"):
        capture.check_capture_data(data, 5, [1, 2, 8], "bfloat16", 8)
    _capture(data)
    with pytest.raises(DataError, match="captured with layer_ids"):
        capture.check_capture_data(data, 100, [1, 2, 8], "bfloat16", 8)
    with pytest.raises(DataError, match="hidden_size 8"):
        capture.check_capture_data(data, 100, [2, 4, 5, 8], "bfloat16", 16)
    assert len(capture.check_capture_data(data, 100, [2, 4, 5, 8], "bfloat16", 8)) == 3


@pytest.mark.parametrize("field,value,words", [
    ("prompt_token_ids", [1, "2"], "item 1 is '2', expected an integer token id"),
    ("output_token_ids", [1.5], "item 0 is 1.5"),
    ("output_token_ids", [True], "item 0 is True"),
    ("prompt_token_ids", [-1], "item 0 is -1, expected a token id in [0, 4194304)"),
    ("prompt_token_ids", "1 2", "is a str, expected a list of token ids"),
    ("index", -3, "field 'index' is -3, expected an integer >= 0"),
])
def test_samples_file_with_bad_ids_is_refused_naming_line_and_field(tmp_path, field, value,
                                                                     words):
    rec = json.loads(_sample(0).to_json())
    rec[field] = value
    (tmp_path / layout.SAMPLES).write_text(json.dumps(rec) + "\n" + _sample(1).to_json() + "\n")
    with pytest.raises(DataError) as err:
        layout.read_samples(tmp_path)
    assert "samples.jsonl:1" in str(err.value) and words in str(err.value)


class _Post:
    """A fake server: ``/models`` and ``/chat/completions`` answers."""

    def __init__(self, models=("kimi",), prompt_ids=None, token_ids=None):
        self.models = models
        self.prompt_ids = [1, 2] if prompt_ids is None else prompt_ids
        self.token_ids = [3] if token_ids is None else token_ids

    def __call__(self, path, body):
        if body is None:
            return {"data": [{"id": m} for m in self.models]}
        return {"prompt_token_ids": self.prompt_ids,
                "choices": [{"token_ids": self.token_ids, "message": {"content": "x"}}]}


@pytest.mark.parametrize("answer,words", [
    (dict(token_ids=[3, 1 << 23]), "token_ids item 1 is 8388608, expected a token id in"),
    (dict(token_ids=[3, "4"]), "token_ids item 1 is '4'"),
    (dict(prompt_ids=[1, None]), "prompt_token_ids item 1 is None"),
    (dict(prompt_ids=[]), "prompt_token_ids is empty"),
    (dict(token_ids={"a": 1}), "token_ids is a dict"),
])
def test_server_token_ids_are_checked_before_anything_is_stored(answer, words):
    gen = regenerate.ServerGenerator("http://x/v1", regenerate.Sampling(), post=_Post(**answer))
    with pytest.raises(DataError, match="nothing stored") as err:
        gen.answer([[{"role": "user", "content": "q"}]])
    assert words in str(err.value)


def test_server_ids_are_checked_against_a_known_vocabulary():
    gen = regenerate.ServerGenerator("http://x/v1", regenerate.Sampling(), vocab_size=3,
                                     post=_Post(token_ids=[3]))
    with pytest.raises(DataError, match=r"expected a token id in \[0, 3\)"):
        gen.answer([[{"role": "user", "content": "q"}]])


def test_a_server_with_several_models_needs_model():
    with pytest.raises(DataError, match="serves a, b; pick one with --model"):
        regenerate.ServerGenerator("http://x/v1", regenerate.Sampling(), post=_Post(("a", "b")))


class _Gen:
    def __init__(self, model):
        self.description = {"backend": "openai-server", "model": model}

    def answer(self, requests):
        return [regenerate.Answer([1, 2], [3], "a") for _ in requests]


def test_resume_against_another_served_model_is_refused_and_the_manifest_kept(tmp_path):
    convs = [regenerate.Conversation("p", ("q1",)), regenerate.Conversation("p", ("q2",))]
    regenerate.regenerate(tmp_path, convs[:1], _Gen("kimi-k2.5"), progress=False)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(DataError, match="generated with model 'kimi-k2.5', this run uses "
                                        "'other' \\(--model\\)"):
        regenerate.regenerate(tmp_path, convs, _Gen("other"), progress=False)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    regenerate.regenerate(tmp_path, convs, _Gen("kimi-k2.5"), progress=False)  # same: resumes
    assert len(layout.read_samples(tmp_path)) == 2


def test_strict_json_turns_non_finite_numbers_into_null():
    text = validate.strict_json({"a": float("nan"), "b": [1.0, float("inf")],
                                 "c": {"d": -float("inf")}, "e": 2})
    assert json.loads(text) == {"a": None, "b": [1.0, None], "c": {"d": None}, "e": 2}
    assert "NaN" not in text and "Infinity" not in text
