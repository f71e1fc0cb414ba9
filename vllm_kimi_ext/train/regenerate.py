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
turns 1..k-1 in the history, and each turn is one sample. Samples already in the
data directory (same prompt hash) are skipped, so an interrupted run resumes.
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


def regenerate(
    data_dir: str | Path,
    conversations: Sequence[Conversation],
    generator: Generator,
    *,
    chat_template_kwargs: dict | None = None,
    batch_size: int = Regeneration.batch_size,
    progress: bool | None = None,
) -> dict:
    """Ask the target every turn of every conversation; append samples to ``data_dir``.

    Turn k of all conversations is asked in batches of ``batch_size`` once turn k-1
    is answered. Returns the generation section written to the manifest (settings
    and the measured throughput of this run).
    """
    from tqdm import tqdm

    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    existing = {s.prompt_hash: s for s in (layout.read_samples(data_dir)
                                           if (data_dir / layout.SAMPLES).is_file() else [])}
    next_index = max((s.index for s in existing.values()), default=-1) + 1
    answers: list[list[Answer]] = [[] for _ in conversations]
    total = sum(len(c.turns) for c in conversations)
    bar = tqdm(total=total, desc="regenerate", unit="turn", disable=None if progress is None
               else not progress)
    generated = 0
    t0 = time.perf_counter()
    for k in range(max((len(c.turns) for c in conversations), default=0)):
        todo: list[tuple[int, list[dict], str]] = []
        for ci, conv in enumerate(conversations):
            if k >= len(conv.turns):
                continue
            messages = _history(conv.turns[: k + 1], answers[ci])
            h = prompt_hash(messages, chat_template_kwargs)
            if h in existing:
                s = existing[h]
                answers[ci].append(Answer(s.prompt_token_ids, s.output_token_ids, s.response,
                                          s.reasoning, s.finish_reason))
                bar.update(1)
            else:
                todo.append((ci, messages, h))
        # similar lengths together: less padding in a batch, less waiting on stragglers
        todo.sort(key=lambda item: sum(len(m["content"]) for m in item[1]))
        for start in range(0, len(todo), batch_size):
            chunk = todo[start:start + batch_size]
            got = generator.answer([m for _, m, _ in chunk])
            new = []
            for (ci, messages, h), ans in zip(chunk, got):
                answers[ci].append(ans)
                new.append(Sample(next_index, h, conversations[ci].source, messages,
                                  ans.prompt_token_ids, ans.output_token_ids, ans.text,
                                  ans.reasoning, ans.finish_reason))
                existing[h] = new[-1]
                next_index += 1
                generated += len(ans.output_token_ids)
            layout.append_samples(data_dir, new)
            bar.update(len(chunk))
    bar.close()
    elapsed = time.perf_counter() - t0
    section = dict(generator.description, chat_template_kwargs=chat_template_kwargs or {},
                   measured={"generated_tokens": generated, "seconds": round(elapsed, 3),
                             "tokens_per_s": round(generated / elapsed, 3) if elapsed else None})
    layout.update_manifest(data_dir, generation=section)
    return section


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
                 post: Callable[[str, dict], dict] | None = None):
        self.base_url = base_url.rstrip("/")
        self.sampling = sampling
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.api_key = api_key
        self.timeout = timeout
        self.concurrency = concurrency
        self._post = post or self._http_post
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
        return r.json()

    def _served_model(self) -> str:
        data = self._post("/models", None).get("data") or []
        if not data:
            raise DataError(f"server {self.base_url}/models: no model served")
        return data[0]["id"]

    def _one(self, messages: list[dict]) -> Answer:
        s = self.sampling
        body: dict[str, Any] = {
            "model": self.model, "messages": messages, "max_tokens": s.max_tokens,
            "temperature": s.temperature, "top_p": s.top_p, "seed": s.seed,
            "return_token_ids": True, "skip_special_tokens": False,
        }
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = self.chat_template_kwargs
        out = self._post("/chat/completions", body)
        choice = (out.get("choices") or [{}])[0]
        prompt_ids, output_ids = out.get("prompt_token_ids"), choice.get("token_ids")
        if prompt_ids is None or output_ids is None:
            raise DataError(
                f"server {self.base_url}: the response has no prompt_token_ids/token_ids; "
                "serve the target with vLLM >= 0.10.2 (request field return_token_ids)")
        msg = choice.get("message") or {}
        return Answer(list(prompt_ids), list(output_ids), msg.get("content") or "",
                      msg.get("reasoning") or msg.get("reasoning_content"),
                      choice.get("finish_reason"))

    def answer(self, requests: Sequence[list[dict]]) -> list[Answer]:
        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            return list(pool.map(self._one, requests))


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
