"""Training-data seams: samples file, regeneration (server and resume), capture
bookkeeping, and the acceptance arithmetic."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from vllm_kimi_ext.train import capture, layout, regenerate
from vllm_kimi_ext.train.layout import DataError, Sample


def _sample(i, prompt=(1, 2, 3), out=(4, 5), source="s"):
    return Sample(i, f"h{i}", source, [{"role": "user", "content": f"q{i}"}], list(prompt),
                  list(out))


def test_sample_sequence_and_mask():
    s = _sample(0)
    assert s.input_ids == [1, 2, 3, 4, 5] and s.loss_mask == [0, 0, 0, 1, 1]
    assert (layout.prompt_hash([{"role": "user", "content": "a"}]) !=
        layout.prompt_hash([{"role": "user", "content": "a"}], {"thinking": True}))


def test_samples_file_torn_tail_dropped_and_repaired(tmp_path):
    layout.append_samples(tmp_path, [_sample(0), _sample(1)])
    path = tmp_path / layout.SAMPLES
    with open(path, "a") as fh:
        fh.write('{"index": 2, "prompt_ha')  # interrupted write
    assert [s.index for s in layout.read_samples(tmp_path)] == [0, 1]
    layout.append_samples(tmp_path, [_sample(2)])
    assert [s.index for s in layout.read_samples(tmp_path)] == [0, 1, 2]
    path.write_text(path.read_text().replace('"index": 1,', '"index": 1 oops', 1))
    with pytest.raises(DataError, match=r"samples.jsonl:2: not valid JSON"):
        layout.read_samples(tmp_path)


class _EchoGenerator:
    """Answers with the number of messages it was given; counts calls."""

    description = {"backend": "fake"}

    def __init__(self):
        self.asked: list[list[dict]] = []

    def answer(self, requests):
        out = []
        for messages in requests:
            self.asked.append(messages)
            n = len(messages)
            out.append(regenerate.Answer([7] * n, [n, n + 1], f"answer{n}", "why", "stop"))
        return out


def test_regenerate_multi_turn_history_and_resume(tmp_path):
    prompts = tmp_path / "mt.jsonl"
    prompts.write_text(json.dumps({"turns": ["t1", "t2"]}) + "\n" +
                       json.dumps({"prompt": "single"}) + "\n")
    convs = regenerate.load_conversations([prompts])
    assert [c.turns for c in convs] == [("t1", "t2"), ("single",)]
    gen = _EchoGenerator()
    data = tmp_path / "data"
    regenerate.regenerate(data, convs, gen, batch_size=1, progress=False)
    # turn 2 is asked with the target's own answer to turn 1 in the history
    assert gen.asked[-1] == [{"role": "user", "content": "t1"},
                             {"role": "assistant", "content": "answer1",
                              "reasoning_content": "why"},
                             {"role": "user", "content": "t2"}]
    # one sample per conversation: the two-turn record is the last turn's request
    samples = layout.read_samples(data)
    assert [s.source for s in samples] == ["mt", "mt"]
    multi = next(s for s in samples if s.conversation)
    assert multi.input_ids == [7, 7, 7, 3, 4]
    gen2 = _EchoGenerator()
    regenerate.regenerate(data, convs, gen2, progress=False)
    assert gen2.asked == [] and len(layout.read_samples(data)) == 2
    assert layout.read_manifest(data)["generation"]["measured"]["generated_tokens"] == 0


class _Handler(BaseHTTPRequestHandler):
    bodies: list = []
    token_ids = True

    def log_message(self, *args):
        pass

    def _send(self, obj):
        raw = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        self._send({"data": [{"id": "kimi"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        choice = {"message": {"content": "hi", "reasoning": "think"}, "finish_reason": "stop"}
        out = {"choices": [choice]}
        if type(self).token_ids:
            choice["token_ids"] = [9, 10]
            out["prompt_token_ids"] = [1, 2, 3]
        self._send(out)


@pytest.fixture
def server():
    srv = HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    _Handler.bodies, _Handler.token_ids = [], True
    yield f"http://127.0.0.1:{srv.server_port}/v1"
    srv.shutdown()


def test_server_generator_sends_template_kwargs_and_reads_token_ids(server):
    gen = regenerate.ServerGenerator(server, regenerate.Sampling(max_tokens=5),
                                     chat_template_kwargs={"thinking": True})
    assert gen.model == "kimi"
    (ans,) = gen.answer([[{"role": "user", "content": "q"}]])
    assert ((ans.prompt_token_ids, ans.output_token_ids, ans.text, ans.reasoning) ==
        ([1, 2, 3], [9, 10], "hi", "think"))
    body = _Handler.bodies[-1]
    assert body["return_token_ids"] is True and body["chat_template_kwargs"] == {"thinking": True}
    assert body["max_tokens"] == 5 and body["model"] == "kimi"
    _Handler.token_ids = False
    with pytest.raises(DataError, match="return_token_ids"):
        gen.answer([[{"role": "user", "content": "q"}]])


# --------------------------------------------------------------------------- #


def test_layer_ids_and_disk_estimate():
    assert capture.default_layer_ids(61) == [2, 30, 58, 61]
    with pytest.raises(DataError, match="end with 61"):
        capture.check_layer_ids([2, 30, 58], 61)
    with pytest.raises(DataError, match="ascending"):
        capture.check_layer_ids([30, 2, 61], 61)
    samples = [_sample(0), _sample(1, prompt=range(10), out=range(5))]
    # (5 + 15) tokens x (4 x 8 x 2 + 8) bytes + 2 headers
    assert capture.estimate_disk(samples, 4, 8) == 20 * 72 + 2 * capture.SHARD_HEADER_BYTES


class _FakeBackend:
    hidden_size, num_hidden_layers = 8, 8
    description = {"backend": "fake"}

    def __init__(self):
        self.calls = 0

    def capture(self, samples, layer_ids, paths, dtype):
        import torch

        for s, p in zip(samples, paths):
            self.calls += 1
            hs = torch.arange(s.num_tokens * len(layer_ids) * 8, dtype=torch.float32)
            capture._save_shard(p, hs.reshape(s.num_tokens, len(layer_ids), 8).to(torch.bfloat16),
                                torch.tensor(s.input_ids))


def test_capture_resumes_and_refuses_other_layers(tmp_path, monkeypatch):
    layout.append_samples(tmp_path, [_sample(0), _sample(1)])
    be = _FakeBackend()
    logs = []
    section = capture.capture(tmp_path, be, progress=False, log=logs.append)
    assert be.calls == 2 and section["layer_ids"] == [2, 4, 5, 8]
    assert [e["shape"] for e in section["samples"]] == [[5, 4, 8], [5, 4, 8]]
    assert "B/token" in logs[0]
    be2 = _FakeBackend()
    capture.capture(tmp_path, be2, progress=False, log=logs.append)
    assert be2.calls == 0
    # a torn shard is rewritten
    layout.hidden_path(tmp_path, 1).write_bytes(b"\x08\x00")
    capture.capture(tmp_path, be2, progress=False, log=logs.append)
    assert be2.calls == 1
    with pytest.raises(DataError, match="captured with layer_ids"):
        capture.capture(tmp_path, be2, layer_ids=[1, 2, 8], progress=False, log=logs.append)
    records = list(layout.iter_training_records(tmp_path))
    assert [r[1]["hidden_states"].shape[1] for r in records] == [4, 4]


def test_capture_refuses_when_disk_is_short(tmp_path, monkeypatch):
    import collections

    layout.append_samples(tmp_path, [_sample(0)])
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(capture.shutil, "disk_usage", lambda _p: usage(1, 1, 10))
    with pytest.raises(DataError, match="needed, 10 B free"):
        capture.capture(tmp_path, _FakeBackend(), progress=False, log=lambda _m: None)
    assert not layout.hidden_path(tmp_path, 0).exists()


# --------------------------------------------------------------------------- #


def test_sum_min_and_tau_against_direct_sums():
    import torch

    from vllm_kimi_ext.train import evaluate as ev

    g = torch.Generator().manual_seed(0)
    T, V, Vd, k = 9, 7, 4, 3
    p = torch.softmax(torch.randn(T, V, generator=g), -1)
    kept = [0, 2, 5, 6]
    d2t = torch.tensor(kept) - torch.arange(Vd)
    qs = [torch.softmax(torch.randn(T, Vd, generator=g), -1) for _ in range(k)]
    valid = torch.tensor([True, False, True, True, True, True, True, False, False])
    alpha, greedy = ev.chain_acceptance(p, qs, valid, d2t)
    starts = [i for i in range(T - (k - 1)) if valid[i]]
    assert alpha.shape == (len(starts), k)
    for row, i in enumerate(starts):
        for j in range(k):
            direct = sum(min(float(p[i + j, kept[x]]), float(qs[j][i, x])) for x in range(Vd))
            assert float(alpha[row, j]) == pytest.approx(direct, abs=1e-6)
            hit = kept[int(qs[j][i].argmax())] == int(p[i + j].argmax())
            assert float(greedy[row, j]) == float(hit)
    a = alpha[0].tolist()
    assert float(ev.chain_tau(alpha)[0]) == pytest.approx(1 + a[0] + a[0] * a[1] +
                                                          a[0] * a[1] * a[2])
    assert float(ev.chain_tau(torch.tensor([[0.5, 0.5, 0.5]]))[0]) == pytest.approx(1.875)


def test_identical_distributions_accept_everything():
    import torch

    from vllm_kimi_ext.train import evaluate as ev

    p = torch.softmax(torch.randn(6, 5), -1)
    alpha, greedy = ev.chain_acceptance(p, [p], torch.ones(6, dtype=torch.bool))
    assert torch.allclose(alpha, torch.ones(6, 1, dtype=torch.float64))
    assert greedy.all()
    assert torch.allclose(ev.chain_tau(alpha), torch.full((6,), 2.0, dtype=torch.float64))


def test_cli_refusals_are_one_line_exit_2(tmp_path, capsys):
    from vllm_kimi_ext.cli import main

    def refused(argv, needle):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, err

    refused(["draft", "train", "--data", str(tmp_path / "none"), "--target", str(tmp_path),
             "--out", str(tmp_path / "o")], "none: no such folder")
    refused(["draft", "capture", "--data", str(tmp_path)], "exactly one of --vllm-target")
    refused(["draft", "regenerate", "--prompts", str(tmp_path / "p.jsonl"), "--out",
             str(tmp_path / "d"), "--server", "http://127.0.0.1:9/v1"], "p.jsonl: no such file")
    layout.append_samples(tmp_path, [_sample(0)])
    (tmp_path / "config.json").write_text("{}")
    refused(["draft", "eval", "--data", str(tmp_path), "--target", str(tmp_path), "--draft",
             str(tmp_path), "--split", "heldout"], "needs --holdout-every")
