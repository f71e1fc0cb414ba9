"""Read the vocabulary of a Hugging Face ``tokenizer.json`` (BPE models only).

Two BPE spellings are understood: byte-level (Qwen, Llama-3: every token is
written in GPT-2's byte -> printable-character alphabet) and SentencePiece-style
(Llama-2, Mistral: ``▁`` for a space, ``<0xNN>`` byte-fallback tokens).  Regular
tokens become their byte strings; added tokens are atomic control tokens and keep
their names, so they never match plain text.

Standard library only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_kimi_ext.user_input import MAX_VOCAB_SIZE

from .errors import TokenizerInputError
from .json_files import read_json_object

__all__ = ["HF_TOKENIZER_FILE", "gpt2_byte_decoder", "hf_vocab_keys"]

HF_TOKENIZER_FILE = "tokenizer.json"


def gpt2_byte_decoder() -> dict[str, int]:
    """Inverse of the GPT-2 byte -> printable-unicode table used by byte-level BPE."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _component_types(node: Any) -> set[str]:
    """Every ``type`` in a tokenizer.json normalizer/pre-tokenizer/decoder tree."""
    found: set[str] = set()
    if isinstance(node, dict):
        if isinstance(node.get("type"), str):
            found.add(node["type"])
        for v in node.values():
            found |= _component_types(v)
    elif isinstance(node, list):
        for v in node:
            found |= _component_types(v)
    return found


def _regular_key(token: str, tid: int, decoder: dict[str, int] | None, path: Path) -> bytes:
    """The byte string a vocabulary entry stands for (``decoder``: the byte-level
    alphabet, None for a SentencePiece-style vocabulary)."""
    if decoder is not None:
        try:
            return bytes(decoder[c] for c in token)
        except KeyError as exc:
            raise TokenizerInputError(
                f"{path}: token {token!r} (id {tid}) has a character outside the "
                "byte-level alphabet", path=path) from exc
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        return bytes([int(token[3:5], 16)])  # byte-fallback token
    return token.replace("\u2581", " ").encode("utf-8")


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _vocab_ids(vocab: dict[str, Any], path: Path) -> dict[str, int]:
    """``model.vocab`` checked: every id a non-negative integer below the size limit,
    no id given to two tokens."""
    by_id: dict[int, str] = {}
    for token, tid in vocab.items():
        if not _is_id(tid) or not 0 <= tid < MAX_VOCAB_SIZE:
            raise TokenizerInputError(
                f"{path}: model.vocab[{token!r}] = {tid!r} is not a token id (expected an "
                f"integer in [0, {MAX_VOCAB_SIZE}))", path=path, field=f"model.vocab.{token}",
                expected="a non-negative integer id")
        if tid in by_id:
            raise TokenizerInputError(
                f"{path}: model.vocab gives id {tid} to both {by_id[tid]!r} and {token!r} "
                "(duplicate id)", path=path, field="model.vocab", expected="unique ids")
        by_id[tid] = token
    return vocab


def _added_tokens(data: dict[str, Any], vocab: dict[str, int],
                  path: Path) -> dict[int, str]:
    """``added_tokens`` as ``{id: content}``, checked: valid ids, one content per id, and
    no id that ``model.vocab`` gives to another token (a collision)."""
    added = data.get("added_tokens") or []
    if not isinstance(added, list):
        raise TokenizerInputError(f"{path}: added_tokens must be a list", path=path,
                                  field="added_tokens", expected="a list of objects")
    vocab_by_id = {tid: tok for tok, tid in vocab.items()}
    out: dict[int, str] = {}
    for n, entry in enumerate(added):
        tid = entry.get("id") if isinstance(entry, dict) else None
        content = entry.get("content") if isinstance(entry, dict) else None
        if not _is_id(tid) or not 0 <= tid < MAX_VOCAB_SIZE or not isinstance(content, str):
            raise TokenizerInputError(
                f"{path}: added_tokens[{n}] = {entry!r:.80} needs an integer 'id' in "
                f"[0, {MAX_VOCAB_SIZE}) and a 'content' string", path=path,
                field=f"added_tokens[{n}]", expected="{'id': int >= 0, 'content': str}")
        for other, what in ((out.get(tid), "added_tokens"), (vocab_by_id.get(tid), "model.vocab")):
            if other is not None and other != content:
                raise TokenizerInputError(
                    f"{path}: id {tid} is {content!r} in added_tokens but {other!r} in {what} "
                    "(colliding ids)", path=path, field=f"added_tokens[{n}]",
                    expected="one token per id")
        out[tid] = content
    return out


def hf_vocab_keys(directory: str | Path) -> list[bytes | str | None]:
    """Per-id keys of a Hugging Face ``tokenizer.json`` BPE vocabulary: the token's
    bytes, an added token's name, or None for an id the file does not define.

    Refuses (:class:`TokenizerInputError`, naming file and field) duplicate, negative
    or absurdly large ids, tokens listed twice and added tokens colliding with others."""
    path = Path(directory) / HF_TOKENIZER_FILE
    data = read_json_object(path)
    model = data.get("model")
    if (not isinstance(model, dict) or model.get("type") != "BPE"
            or not isinstance(model.get("vocab"), dict)):
        kind = model.get("type") if isinstance(model, dict) else model
        raise TokenizerInputError(
            f"{path}: model type {kind!r} is not supported for cross-tokenizer "
            "drafting (BPE vocabularies only: byte-level or SentencePiece-style)", path=path,
            field="model.type", expected="BPE")
    byte_level = "ByteLevel" in _component_types([data.get("pre_tokenizer"), data.get("decoder")])
    decoder = gpt2_byte_decoder() if byte_level else None
    vocab = _vocab_ids(model["vocab"], path)
    added = _added_tokens(data, vocab, path)
    size = 1 + max([*vocab.values(), *added], default=-1)
    keys: list[bytes | str | None] = [None] * size
    for token, tid in vocab.items():
        keys[tid] = _regular_key(token, tid, decoder, path)
    for tid, content in added.items():  # added tokens are atomic control tokens: keyed by name
        keys[tid] = content
    return keys
