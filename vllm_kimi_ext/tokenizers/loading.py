"""Any supported tokenizer directory as per-id keys, whatever its format.

A key says what an id *means*: ``bytes`` for a regular token (its byte string),
``str`` for a special or added token (its name), ``None`` for an id that must
never be matched (a hole).  Two tokenizers agree on an id's meaning exactly when
their keys are equal, so the keys are what cross-tokenizer drafting intersects.

Formats: Kimi-format directories (:mod:`.kimi_files`) and Hugging Face
``tokenizer.json`` BPE vocabularies (:mod:`.hf_json`).  Standard library only.
"""

from __future__ import annotations

from pathlib import Path

from .errors import TokenizerInputError
from .hf_json import HF_TOKENIZER_FILE, hf_vocab_keys
from .kimi_files import RANK_FILE_NAMES, load_tokenizer_dir

__all__ = ["Key", "drop_reserved", "tokenizer_kind", "vocab_keys"]

Key = bytes | str | None

_RESERVED_PREFIX = "<|reserved_token_"


def tokenizer_kind(directory: str | Path) -> str | None:
    """``"kimi"`` (tiktoken rank file), ``"hf"`` (tokenizer.json) or None."""
    d = Path(directory)
    if any((d / n).is_file() for n in RANK_FILE_NAMES):
        return "kimi"
    if (d / HF_TOKENIZER_FILE).is_file():
        return "hf"
    return None


def vocab_keys(directory: str | Path) -> list[Key]:
    """Per-id keys (bytes / special name / None) of a tokenizer directory.

    Raises :class:`TokenizerInputError` for a directory without a readable
    tokenizer."""
    kind = tokenizer_kind(directory)
    if kind == "kimi":
        return load_tokenizer_dir(directory).id_keys()
    if kind == "hf":
        return hf_vocab_keys(directory)
    raise TokenizerInputError(
        f"{directory}: no tokenizer found (needs a Kimi-format tiktoken.model or a Hugging "
        "Face tokenizer.json)", path=directory)


def drop_reserved(keys: list[Key]) -> list[Key]:
    """``keys`` with Kimi's unnamed reserved slots (``<|reserved_token_N|>``) made
    holes: a filler name means "unused", not a token two vocabularies share."""
    return [None if isinstance(k, str) and k.startswith(_RESERVED_PREFIX) else k for k in keys]
