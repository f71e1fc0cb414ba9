"""Read the vocabulary of a Hugging Face ``tokenizer.json`` (BPE models only).

Two BPE spellings are understood: byte-level (Qwen, Llama-3: every token is
written in GPT-2's byte -> printable-character alphabet) and SentencePiece-style
(Llama-2, Mistral: ``▁`` for a space, ``<0xNN>`` byte-fallback tokens).  Regular
tokens become their byte strings; added tokens are atomic control tokens and keep
their names, so they never match plain text.

Standard library only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import TokenizerInputError

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


def hf_vocab_keys(directory: str | Path) -> list[bytes | str | None]:
    """Per-id keys of a Hugging Face ``tokenizer.json`` BPE vocabulary: the token's
    bytes, an added token's name, or None for an id the file does not define."""
    path = Path(directory) / HF_TOKENIZER_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerInputError(f"{path}: cannot read tokenizer.json ({exc})",
                                  path=path) from exc
    model = data.get("model") or {}
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise TokenizerInputError(
            f"{path}: model type {model.get('type')!r} is not supported for cross-tokenizer "
            "drafting (BPE vocabularies only: byte-level or SentencePiece-style)", path=path)
    byte_level = "ByteLevel" in _component_types([data.get("pre_tokenizer"), data.get("decoder")])
    decoder = gpt2_byte_decoder() if byte_level else None
    vocab: dict[str, int] = model["vocab"]
    added = data.get("added_tokens") or []
    size = 1 + max([*vocab.values(), *(int(a["id"]) for a in added)], default=-1)
    keys: list[bytes | str | None] = [None] * size
    for token, tid in vocab.items():
        keys[tid] = _regular_key(token, tid, decoder, path)
    for entry in added:  # added tokens are atomic control tokens: keyed by name
        keys[int(entry["id"])] = str(entry["content"])
    return keys
