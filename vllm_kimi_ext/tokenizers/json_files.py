"""Read a tokenizer JSON file as one object, refusing what JSON readers accept silently.

``json.loads`` keeps the last of two equal keys in an object without a word; in a
tokenizer file that is a token listed twice (``tokenizer.json`` ``model.vocab``) or an
id declared twice (``tokenizer_config.json`` ``added_tokens_decoder``), so
:func:`read_json_object` refuses it, naming the file and the key. Standard library only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import TokenizerInputError

__all__ = ["read_json_object"]


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; :class:`TokenizerInputError` (file, line) otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TokenizerInputError(f"{path}: not UTF-8 text ({exc})", path=path) from exc
    except OSError as exc:
        raise TokenizerInputError(f"{path}: cannot read: {exc}", path=path) from exc
    try:
        obj = json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise TokenizerInputError(
            f"{path}: key {exc.args[0]!r} appears twice in one JSON object (a token or id "
            "listed twice; JSON readers keep the last one silently)", path=path,
            field=str(exc.args[0]), expected="each key once") from None
    except json.JSONDecodeError as exc:
        raise TokenizerInputError(
            f"{path} line {exc.lineno} column {exc.colno}: invalid JSON: {exc.msg}",
            path=path, line=exc.lineno) from exc
    if not isinstance(obj, dict):
        raise TokenizerInputError(f"{path}: expected a JSON object at top level", path=path)
    return obj
