"""Responses from the target itself, for a prompt set (``draft regenerate``).

The served target answers every prompt with the chat template and thinking mode it
is served with; what is kept is the exact token sequence it saw and produced:

* :class:`ServerGenerator` asks an OpenAI-compatible vLLM server (``vllm serve``,
  any tensor-parallel size) through ``/v1/chat/completions`` with
  ``return_token_ids: true``, so the prompt's token ids (chat template applied by
  the server, ``chat_template_kwargs`` such as ``{"thinking": true}`` passed
  through) and the generated ids come back as served: nothing is re-tokenized.
* :class:`TransformersGenerator` runs a transformers model in-process (small CPU
  runs and tests): the tokenizer's chat template, batched ``generate``.

Prompt files are JSONL or plain text read with shrink-vocab's reader (fields
``prompt``, ``text``, ``question``, ``turns``, ``content``). A record with several
turns becomes a conversation: turn k is asked with the target's own answers to
turns 1..k-1 in the history, and the conversation is stored once: the last turn's
prompt (which holds the history as the template renders it) and response, the loss
on every assistant turn (:func:`conversation_sample`). Conversations already in the
data directory are skipped, so an interrupted run resumes. Against a server, many
conversations are in flight at once (``--concurrency``): the server's continuous
batching schedules them and no request waits for another's end.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from . import layout
from .layout import DataError, Sample, prompt_hash
from .settings import Regeneration, Sampling


@dataclasses.dataclass(frozen=True)
class Conversation:
    """User turns of one prompt record, and the file it came from."""

    source: str
    turns: tuple[str, ...]


@dataclasses.dataclass
class Answer:
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    text: str
    reasoning: str | None = None
    finish_reason: str | None = None


class Generator(Protocol):
    """Answers a batch of chat requests (lists of messages)."""

    description: dict

    def answer(self, requests: Sequence[list[dict]]) -> list[Answer]: ...


def load_conversations(paths: Sequence[str | Path], *, field: str | None = None,
                       first_turn_only: bool = False, limit: int | None = None
                       ) -> list[Conversation]:
    """Conversations of the prompt files, in file order (``limit`` per file)."""
    from vllm_kimi_ext.drafts.shrink_vocab.corpus import iter_documents
    from vllm_kimi_ext.drafts.shrink_vocab.shrink import ShrinkVocabError

    out: list[Conversation] = []
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise DataError(f"prompt file {path}: no such file")
        source = path.name.split(".")[0]
        taken = 0
        try:
            for texts in iter_documents(path, field):
                if not texts:
                    continue
                turns = tuple(texts[:1] if first_turn_only else texts)
                out.append(Conversation(source, turns))
                taken += 1
                if limit is not None and taken >= limit:
                    break
        except ShrinkVocabError as exc:
            raise DataError(str(exc)) from None
        if taken == 0:
            raise DataError(f"prompt file {path}: no usable records")
    return out


def check_resume(data_dir: str | Path, backend: str | None, model: str | None) -> None:
    """An earlier run's data directory is resumed only by the same backend and model:
    samples of two models in one directory would be trained on as one target's."""
    previous = layout.read_manifest(data_dir).get("generation") or {}
    for field, now in (("backend", backend), ("model", model)):
        before = previous.get(field)
        if before is not None and now is not None and before != now:
            flag = ("--model" if field == "model" and backend == "openai-server" else
                "--hf-model" if field == "model" else "--server/--hf-model")
            raise DataError(f"{Path(data_dir) / layout.MANIFEST}: generated with {field} "
                            f"{before!r}, this run uses {now!r} ({flag}); resume with the "
                            "same one or write to a new --out")


def _history(turns: Sequence[str], answers: Sequence[Answer]) -> list[dict]:
    """Messages for the next turn: user turns interleaved with the target's answers."""
    messages: list[dict] = []
    for i, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        if i < len(answers):
            msg = {"role": "assistant", "content": answers[i].text}
            if answers[i].reasoning:
                msg["reasoning_content"] = answers[i].reasoning
            messages.append(msg)
    return messages


def conversation_key(conv: Conversation, chat_template_kwargs: dict | None) -> str:
    """The id of a conversation: the hash of its user turns (and template arguments).
    For one turn it equals that request's prompt hash."""
    return prompt_hash([{"role": "user", "content": t} for t in conv.turns],
                       chat_template_kwargs)


def _find(haystack: bytes, needle: bytes, start: int) -> int:
    """Token index of ``needle`` in ``haystack`` (int32 token arrays) at or after token
    ``start``, or -1."""
    pos = haystack.find(needle, 4 * start)
    while pos != -1 and pos % 4:
        pos = haystack.find(needle, pos + 1)
    return -1 if pos == -1 else pos // 4


def locate_turn(prompt: Sequence[int], output: Sequence[int], start: int
                ) -> tuple[int, int, int]:
    """Where an earlier answer's tokens sit in a later turn's prompt.

    The history renders an answer the way the chat template does (a thinking
    template usually drops the reasoning; the stop token is the template's own), so
    the longest run of the answer that ends at its last non-stop token and appears
    after token ``start`` is taken. Returns ``(begin, end, unmatched)``:
    ``unmatched`` answer tokens have no place in the history (not trained on)."""
    from array import array

    hay = array("i", prompt).tobytes()
    body = list(output)
    for candidate in (body, body[:-1]):
        if candidate:
            at = _find(hay, array("i", candidate).tobytes(), start)
            if at != -1:
                return at, at + len(candidate), len(body) - len(candidate)
    body = body[:-1]
    lo, hi, best = 1, len(body), None  # a suffix that occurs makes every shorter one occur
    while lo <= hi:
        mid = (lo + hi) // 2
        at = _find(hay, array("i", body[-mid:]).tobytes(), start)
        if at != -1:
            best, lo = (at, mid), mid + 1
        else:
            hi = mid - 1
    if best is None:
        return start, start, len(output)
    return best[0], best[0] + best[1], len(output) - best[1]


def conversation_sample(index: int, conv: Conversation, key: str, answers: Sequence[Answer],
                        chat_template_kwargs: dict | None) -> tuple[Sample, int]:
    """One sample for the whole conversation: the last turn's prompt (which holds the
    history) and response, with the loss on every assistant turn. Returns the sample
    and the number of answer tokens the history does not reproduce."""
    messages = _history(conv.turns, answers[:-1])
    last = answers[-1]
    h = prompt_hash(messages, chat_template_kwargs)
    sample = Sample(index, h, conv.source, messages, last.prompt_token_ids,
                    last.output_token_ids, last.text, last.reasoning, last.finish_reason)
    if len(answers) == 1:
        return sample, 0
    spans, pos, unmatched = [], 0, 0
    for ans in answers[:-1]:
        a, b, lost = locate_turn(last.prompt_token_ids, ans.output_token_ids, pos)
        unmatched += lost
        if b > a:
            spans.append([a, b])
            pos = b
    n = len(last.prompt_token_ids)
    spans.append([n, n + len(last.output_token_ids)])
    sample.conversation, sample.loss_spans = key, spans
    return sample, unmatched


def regenerate(
    data_dir: str | Path,
    conversations: Sequence[Conversation],
    generator: Generator,
    *,
    chat_template_kwargs: dict | None = None,
    batch_size: int = Regeneration.batch_size,
    progress: bool | None = None,
    log=print,
) -> dict:
    """Ask the target every turn of every conversation; append one sample per
    conversation to ``data_dir`` (:func:`conversation_sample`).

    A generator with ``answer_one`` (the server) gets its conversations through a pool
    of ``generator.concurrency`` threads, each asking its conversation's turns in
    turn: that many requests stay in flight and the server's continuous batching
    schedules them; a sample is written as soon as its conversation is done. Others
    (transformers) answer turn k of all conversations in batches of ``batch_size``.
    Returns the generation section written to the manifest (settings, measured
    throughput, and the counts of responses cut by ``max_tokens`` and of answer
    tokens the history does not reproduce).
    """
    from tqdm import tqdm

    data_dir = Path(data_dir)
    check_resume(data_dir, generator.description.get("backend"),
                 generator.description.get("model"))
    data_dir.mkdir(parents=True, exist_ok=True)
    existing = (layout.read_samples(data_dir, tokens=False)
                if (data_dir / layout.SAMPLES).is_file() else [])
    done = {s.conversation or s.prompt_hash for s in existing}
    next_index = max((s.index for s in existing), default=-1) + 1
    todo = [(c, conversation_key(c, chat_template_kwargs)) for c in conversations]
    todo = [(c, k) for c, k in todo if k not in done]
    bar = tqdm(total=sum(len(c.turns) for c in conversations), desc="regenerate", unit="turn",
               initial=sum(len(c.turns) for c in conversations) - sum(len(c.turns)
                                                                     for c, _ in todo),
               disable=None if progress is None else not progress)
    stats = {"generated_tokens": 0, "responses_cut_by_max_tokens": 0,
             "history_tokens_unmatched": 0}
    t0 = time.perf_counter()

    def store(conv: Conversation, key: str, answers: list[Answer]) -> None:
        nonlocal next_index
        sample, unmatched = conversation_sample(next_index, conv, key, answers,
                                                chat_template_kwargs)
        layout.append_samples(data_dir, [sample])
        next_index += 1
        stats["generated_tokens"] += sum(len(a.output_token_ids) for a in answers)
        stats["responses_cut_by_max_tokens"] += sum(a.finish_reason == "length"
                                                    for a in answers)
        stats["history_tokens_unmatched"] += unmatched

    if hasattr(generator, "answer_one"):
        _regenerate_in_flight(todo, generator, store, bar)
    else:
        _regenerate_batched(todo, generator, store, bar, batch_size)
    bar.close()
    elapsed = time.perf_counter() - t0
    if stats["responses_cut_by_max_tokens"]:
        log(f"warning: {stats['responses_cut_by_max_tokens']} responses stopped at "
            f"max_tokens {generator.description.get('max_tokens')} (cut; raise --max-tokens)")
    if stats["history_tokens_unmatched"]:
        log(f"warning: {stats['history_tokens_unmatched']} tokens of earlier answers are not "
            "in the history the chat template renders (e.g. dropped reasoning); they are "
            "not trained on")
    section = dict(generator.description, chat_template_kwargs=chat_template_kwargs or {},
                   measured={**stats, "seconds": round(elapsed, 3),
                             "tokens_per_s": round(stats["generated_tokens"] / elapsed, 3)
                             if elapsed else None})
    layout.update_manifest(data_dir, generation=section)
    return section


def _regenerate_in_flight(todo, generator, store, bar) -> None:
    """Conversations through a thread pool; samples stored as they complete."""
    from concurrent.futures import FIRST_COMPLETED, wait

    def run(conv: Conversation) -> list[Answer]:
        answers: list[Answer] = []
        for k in range(len(conv.turns)):
            answers.append(generator.answer_one(_history(conv.turns[: k + 1], answers)))
            bar.update(1)
        return answers

    pool = ThreadPoolExecutor(max_workers=max(1, int(generator.concurrency)))
    try:
        pending = {pool.submit(run, conv): (conv, key) for conv, key in todo}
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                conv, key = pending.pop(fut)
                store(conv, key, fut.result())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _regenerate_batched(todo, generator, store, bar, batch_size: int) -> None:
    """Turn k of every conversation in batches, once turn k-1 is answered."""
    answers: list[list[Answer]] = [[] for _ in todo]
    for k in range(max((len(c.turns) for c, _ in todo), default=0)):
        asks = [(ci, _history(conv.turns[: k + 1], answers[ci]))
                for ci, (conv, _) in enumerate(todo) if k < len(conv.turns)]
        # similar lengths together: less padding in a batch
        asks.sort(key=lambda item: sum(len(m["content"]) for m in item[1]))
        for start in range(0, len(asks), batch_size):
            chunk = asks[start:start + batch_size]
            for (ci, _), ans in zip(chunk, generator.answer([m for _, m in chunk])):
                answers[ci].append(ans)
                conv, key = todo[ci]
                if len(answers[ci]) == len(conv.turns):
                    store(conv, key, answers[ci])
            bar.update(len(chunk))


# --------------------------------------------------------------------------- #
# An OpenAI-compatible server (vllm serve)                                     #
# --------------------------------------------------------------------------- #


class ServerGenerator:
    """Chat completions from a vLLM server, token ids as served.

    ``base_url`` is the server's ``.../v1``; ``model`` the served model name (asked
    from ``/v1/models`` when omitted). Requests of one batch run concurrently.
    """

    def __init__(self, base_url: str, sampling: Sampling, *, model: str | None = None,
                 chat_template_kwargs: dict | None = None, api_key: str = "EMPTY",
                 timeout: float = 3600.0, concurrency: int = Regeneration.concurrency,
                 post: Callable[[str, dict], dict] | None = None,
                 vocab_size: int | None = None):
        self.base_url = base_url.rstrip("/")
        self.sampling = sampling
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.api_key = api_key
        self.timeout = timeout
        self.concurrency = concurrency
        self._post = post or self._http_post
        self.vocab_size = vocab_size
        self.model = model or self._served_model()
        self.description = {"backend": "openai-server", "base_url": self.base_url,
                            "model": self.model, **dataclasses.asdict(sampling)}

    def _http_post(self, path: str, body: dict | None) -> dict:
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"}
        url = f"{self.base_url}{path}"
        try:
            if body is None:
                r = httpx.get(url, headers=headers, timeout=self.timeout)
            else:
                r = httpx.post(url, json=body, headers=headers, timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise DataError(f"server {url}: {exc}") from None
        if r.status_code != 200:
            raise DataError(f"server {url}: HTTP {r.status_code}: {r.text[:200]}")
        try:
            return r.json()
        except ValueError:
            raise DataError(f"server {url}: the answer is not JSON: {r.text[:200]!r}") from None

    def _served_model(self) -> str:
        answer = self._post("/models", None)
        data = answer.get("data") if isinstance(answer, dict) else None
        if not data or not isinstance(data[0], dict) or not isinstance(data[0].get("id"), str):
            raise DataError(f"server {self.base_url}/models: no model served")
        served = [m.get("id") for m in data if isinstance(m, dict)]
        if len(served) > 1:
            raise DataError(f"server {self.base_url}/models: serves {', '.join(map(str, served))};"
                            " pick one with --model")
        return data[0]["id"]

    def answer_one(self, messages: list[dict]) -> Answer:
        s = self.sampling
        body: dict[str, Any] = {
            "model": self.model, "messages": messages, "max_tokens": s.max_tokens,
            "temperature": s.temperature, "top_p": s.top_p, "seed": s.seed,
            "return_token_ids": True, "skip_special_tokens": False,
        }
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = self.chat_template_kwargs
        out = self._post("/chat/completions", body)
        choices = out.get("choices") if isinstance(out, dict) else None
        choice = (choices[0] if isinstance(choices, list) and choices and
            isinstance(choices[0], dict) else {})
        prompt_ids, output_ids = out.get("prompt_token_ids"), choice.get("token_ids")
        if prompt_ids is None or output_ids is None:
            raise DataError(
                f"server {self.base_url}: the response has no prompt_token_ids/token_ids; "
                "serve the target with vLLM >= 0.10.2 (request field return_token_ids)")
        for name, ids in (("prompt_token_ids", prompt_ids), ("token_ids", output_ids)):
            problem = layout.token_ids_problem(ids, self.vocab_size)
            if problem or (name == "prompt_token_ids" and not ids):
                raise DataError(f"server {self.base_url}/chat/completions: {name} "
                                f"{problem or 'is empty'}; nothing stored")
        msg = choice.get("message") or {}
        return Answer(list(prompt_ids), list(output_ids), msg.get("content") or "",
                      msg.get("reasoning") or msg.get("reasoning_content"),
                      choice.get("finish_reason"))

    def answer(self, requests: Sequence[list[dict]]) -> list[Answer]:
        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            return list(pool.map(self.answer_one, requests))


# --------------------------------------------------------------------------- #
# transformers, in-process (small CPU runs)                                    #
# --------------------------------------------------------------------------- #


class TransformersGenerator:
    """Batched ``generate`` of a transformers causal LM with its chat template."""

    def __init__(self, model, tokenizer, sampling: Sampling, *,
                 chat_template_kwargs: dict | None = None, name: str = ""):
        self.model = model.eval()
        self.tok = tokenizer
        self.sampling = sampling
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.description = {"backend": "transformers", "model": name,
                            **dataclasses.asdict(sampling)}

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        ids = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                           **self.chat_template_kwargs)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def answer(self, requests: Sequence[list[dict]]) -> list[Answer]:
        import torch

        s = self.sampling
        prompts = [self.prompt_ids(m) for m in requests]
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        eos = self.model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos]) - {None}
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):  # left padding
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        torch.manual_seed(s.seed)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=s.max_tokens,
                do_sample=s.temperature > 0, temperature=s.temperature or None,
                top_p=s.top_p if s.temperature > 0 else None, pad_token_id=pad)
        answers = []
        for i, p in enumerate(prompts):
            gen = [int(t) for t in out[i, width:]]
            cut = next((j + 1 for j, t in enumerate(gen) if t in eos), None)
            finish = "stop" if cut is not None else "length"
            gen = gen[:cut] if cut is not None else gen
            text = self.tok.decode(gen, skip_special_tokens=True)
            answers.append(Answer(p, gen, text, None, finish))
        return answers
