"""Multi-turn records stored once per conversation with the loss on every assistant
turn, held out whole, and regenerated with many requests in flight against an
OpenAI-compatible server (a stand-in on 127.0.0.1)."""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer

import pytest

from tests.unit.test_train_data import _Handler  # its JSON replies
from vllm_kimi_ext.train import layout, regenerate
from vllm_kimi_ext.train.layout import DataError, Sample

# token ids of a toy chat template: <u> user ... <a> assistant ... <e>
U, A, E = 1, 2, 3


def _render(messages: list[dict]) -> list[int]:
    """The stand-in server's template: history answers without their reasoning."""
    ids = []
    for m in messages:
        ids += [U if m["role"] == "user" else A, *_text_ids(m["content"]), E]
    return ids + [A]


def _text_ids(text: str) -> list[int]:
    return [100 + (ord(c) % 50) for c in text]


def _answer(messages: list[dict]) -> tuple[list[int], str, str]:
    """(generated ids, content, reasoning): reasoning ids, then the content, then <e>."""
    turn = sum(m["role"] == "user" for m in messages)
    content = f"ans{turn}-{messages[0]['content']}"
    reasoning = f"think{turn}"
    return [*(_text_ids(reasoning)), 99, *_text_ids(content), E], content, reasoning


def test_locate_turn_finds_the_rendered_answer():
    prompt = [U, 5, 6, E, A, 7, 8, 9, E, U, 4, E, A]
    assert regenerate.locate_turn(prompt, [7, 8, 9, E], 0) == (5, 9, 0)
    # the reasoning (11, 12) is not in the history: the content is found, 2 unmatched
    assert regenerate.locate_turn(prompt, [11, 12, 7, 8, 9, E], 0) == (5, 8, 3)
    # nothing in common: all unmatched, empty span
    assert regenerate.locate_turn(prompt, [40, 41], 3) == (3, 3, 2)
    # searched only after `start`
    assert regenerate.locate_turn([7, 8, E, 7, 8, E], [7, 8, E], 1) == (3, 6, 0)


def test_conversation_sample_masks_every_assistant_turn():
    conv = regenerate.Conversation("mt", ("hi", "more"))
    msgs1 = [{"role": "user", "content": "hi"}]
    out1, c1, r1 = _answer(msgs1)
    a1 = regenerate.Answer(_render(msgs1), out1, c1, r1, "stop")
    msgs2 = regenerate._history(conv.turns, [a1])
    out2, c2, r2 = _answer(msgs2)
    a2 = regenerate.Answer(_render(msgs2), out2, c2, r2, "length")
    sample, unmatched = regenerate.conversation_sample(0, conv, "k", [a1, a2], None)
    assert sample.prompt_token_ids == a2.prompt_token_ids
    first = _text_ids(c1) + [E]
    begin = a2.prompt_token_ids.index(A) + 1
    assert sample.loss_spans[0] == [begin, begin + len(first) - 1]  # content, not <e>
    assert sample.loss_spans[-1] == [len(a2.prompt_token_ids), sample.num_tokens]
    assert unmatched == len(out1) - (len(first) - 1)  # reasoning, separator, <e>
    mask = sample.loss_mask
    assert sum(mask) == sample.num_loss_tokens == len(first) - 1 + len(out2)
    assert [t for t, m in zip(sample.input_ids, mask) if m][: len(first) - 1] == first[:-1]
    # stored and read back the same; a one-turn record keeps the old format
    assert Sample.from_dict(json.loads(sample.to_json()), "x").loss_mask == mask
    single, _ = regenerate.conversation_sample(1, regenerate.Conversation("s", ("q",)), "k",
                                               [a1], None)
    assert "loss_spans" not in single.to_json() and single.conversation is None


def test_loss_spans_outside_the_sample_are_refused():
    rec = json.loads(Sample(0, "h", "s", [], [1, 2], [3]).to_json())
    rec["loss_spans"] = [[1, 9]]
    with pytest.raises(DataError, match="loss_spans"):
        Sample.from_dict(rec, "samples.jsonl:1")


def test_holdout_never_splits_a_conversation():
    from vllm_kimi_ext.train.cli import holdout_hashes

    samples = []
    for c in range(40):
        conv = f"{c * 7919:024x}"
        for t in range(3):  # three samples sharing one conversation id
            samples.append(Sample(3 * c + t, f"{(c * 31 + t) * 104729:024x}", "s", [], [1],
                                  [2], conversation=conv, loss_spans=[[0, 2]]))
    held = holdout_hashes(samples, 4)
    by_conv: dict[str, set[bool]] = {}
    for s in samples:
        by_conv.setdefault(s.conversation, set()).add(s.prompt_hash in held)
    assert all(len(sides) == 1 for sides in by_conv.values())
    assert 0 < sum(True in sides for sides in by_conv.values()) < 40


class _Server(_Handler):
    """Chat completions with token ids. The first 8 requests are answered only once all
    8 are in flight (a barrier); conversation 'slow' is answered only after every other
    conversation's turns were (or after 30 s): a client that waits for a batch's slowest
    request never gets there."""

    lock = threading.Lock()
    in_flight = most = served = 0
    order: list[str] = []
    gate = threading.Barrier(8)
    gate_broken = False
    others_done = threading.Event()
    others = 0
    slow_released = None

    def do_POST(self):
        cls = type(self)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with cls.lock:
            cls.in_flight += 1
            cls.most = max(cls.most, cls.in_flight)
            cls.served += 1
            early = cls.served <= 8
        if early:
            try:
                cls.gate.wait(timeout=30)
            except threading.BrokenBarrierError:
                cls.gate_broken = True
        first = body["messages"][0]["content"]
        if first == "slow":
            cls.slow_released = cls.others_done.wait(timeout=30)
        out, content, reasoning = _answer(body["messages"])
        with cls.lock:
            cls.in_flight -= 1
            cls.order.append(first)
            if first != "slow":
                cls.others += 1
                if cls.others == 2 * 11:
                    cls.others_done.set()
        self._send({"prompt_token_ids": _render(body["messages"]),
                    "choices": [{"token_ids": out, "finish_reason": "stop",
                                 "message": {"content": content, "reasoning": reasoning}}]})


def test_server_regeneration_keeps_many_requests_in_flight(tmp_path):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        gen = regenerate.ServerGenerator(f"http://127.0.0.1:{srv.server_port}/v1",
                                         regenerate.Sampling(max_tokens=64), concurrency=8)
        convs = [regenerate.Conversation("p", ("slow", "again"))] + [
            regenerate.Conversation("p", (f"q{i}", "again")) for i in range(11)]
        section = regenerate.regenerate(tmp_path / "d", convs, gen, progress=False,
                                        log=lambda _m: None)
    finally:
        srv.shutdown()
    samples = layout.read_samples(tmp_path / "d")
    assert len(samples) == 12 and all(s.conversation for s in samples)
    # eight requests were in flight together, never more than --concurrency
    assert not _Server.gate_broken and _Server.most == 8, _Server.most
    # the slow conversation held up none of the others: all 22 of their turns were
    # answered while its first turn was still open, and it was stored last
    assert _Server.slow_released is True
    assert _Server.order[-2:] == ["slow", "slow"]
    assert samples[-1].messages[0]["content"] == "slow"
    assert section["measured"]["history_tokens_unmatched"] == 12 * (len("think1") + 1 + 1)
    # resumed (the same model: another one's run is refused): nothing asked again
    again = regenerate.regenerate(tmp_path / "d", convs, gen := regenerate.ServerGenerator(
        "http://127.0.0.1:1/v1", regenerate.Sampling(), model="kimi"), progress=False,
        log=lambda _m: None)
    assert again["measured"]["generated_tokens"] == 0 and gen.model == "kimi"


def test_cuts_count_the_loss_tokens_of_every_turn():
    from vllm_kimi_ext.train.trainer import truncation

    s = Sample(0, "h", "s", [], list(range(8)), list(range(4)), conversation="c",
               loss_spans=[[2, 5], [8, 12]])
    assert s.num_loss_tokens == 7 and s.loss_tokens_after(4) == 1 + 4
    assert s.loss_tokens_after(9) == 3 and s.loss_tokens_after(12) == 0
    # max_len 10 drops tokens 10, 11 (last turn); prompt_context 3 starts at token 5,
    # dropping the whole first assistant turn (3 loss tokens) too
    assert truncation([s], 10)["loss_tokens_dropped"] == 2
    c = truncation([s], 5, prompt_context=3)
    assert c["tokens_dropped"] == 2 and c["loss_tokens_dropped"] == 3 + 2
