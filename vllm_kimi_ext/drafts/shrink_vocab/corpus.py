"""Text corpora for token counting: JSONL / JSON arrays / plain text, optionally gzipped.

Record formats understood without configuration (:data:`DEFAULT_FIELDS`, first present
wins): ``prompt`` / ``text`` / ``question`` / ``content`` strings, ``turns`` (a list of
strings), ShareGPT ``conversations`` (``[{"from": ..., "value": ...}]``) and OpenAI
``messages`` (``[{"role": ..., "content": str | [{"type": "text", "text": ...}]}]``).
A corpus can also name its own field (``--field FILE:FIELD``).

A file is refused with one line naming it (:class:`CorpusError`) when it is missing,
binary, not UTF-8, a broken gzip stream or has an invalid JSON line; :func:`sniff_corpus`
runs those checks on the first 64 KiB before any tokenizer is loaded. Reading shows a
tqdm progress bar over the file's bytes.

Standard library only (plus tqdm when a bar is shown).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from vllm_kimi_ext.user_input import UserInputError

__all__ = ["DEFAULT_FIELDS", "CorpusError", "iter_documents", "sniff_corpus"]

#: Record fields tried, in order, when no field is given.
DEFAULT_FIELDS = ("prompt", "text", "question", "turns", "content", "conversations",
                  "messages")
_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
_SNIFF_BYTES = 64 * 1024
_GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)


class CorpusError(UserInputError):
    """A corpus file that cannot be read as text records (names the file and line)."""


def _open_binary(path: Path) -> BinaryIO:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


def _compressed_position(fh: BinaryIO) -> int:
    """Bytes of the file on disk consumed so far (the compressed offset for .gz)."""
    raw = getattr(fh, "fileobj", None)
    try:
        return (raw or fh).tell()
    except (OSError, ValueError):
        return 0


def sniff_corpus(path: str | Path) -> None:
    """Refuse a corpus that is missing, binary, not UTF-8 or not gzip as its name says,
    judging from its first 64 KiB (cheap: runs before the tokenizer is loaded)."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus {path} does not exist or is not a file", file=path,
                          expected="a readable corpus file")
    try:
        with _open_binary(path) as fh:
            head = fh.read(_SNIFF_BYTES)
    except _GZIP_ERRORS as exc:
        raise CorpusError(f"corpus {path}: not a valid gzip file ({exc})", file=path,
                          expected="gzip-compressed text (the name ends in .gz)") from None
    nul = head.find(b"\x00")
    if nul >= 0:
        raise CorpusError(f"corpus {path}: binary file (NUL byte at offset {nul}); expected "
                          "UTF-8 text, JSONL or JSON", file=path, expected="UTF-8 text")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # not just a character cut at the 64 KiB boundary
            raise CorpusError(f"corpus {path}: not UTF-8 text (invalid byte at offset "
                              f"{exc.start})", file=path, expected="UTF-8 text") from None


def _decode(raw: bytes, path: Path, lineno: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorpusError(f"corpus {path} line {lineno}: not UTF-8 text (invalid byte at "
                          f"column {exc.start + 1})", file=path,
                          expected="UTF-8 text") from None


def _lines(path: Path, bar) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of every line, the bar advanced by on-disk bytes."""
    last = 0
    try:
        with _open_binary(path) as fh:
            for lineno, raw in enumerate(fh, 1):
                if bar is not None and lineno % 256 == 0:
                    pos = _compressed_position(fh)
                    bar.update(pos - last)
                    last = pos
                yield lineno, _decode(raw, path, lineno)
    except _GZIP_ERRORS as exc:
        raise CorpusError(f"corpus {path}: gzip stream is broken or truncated ({exc})",
                          file=path, expected="a complete gzip file") from None
    if bar is not None:
        bar.update(max(0, bar.total - last) if bar.total else 0)


def _is_jsonl(path: Path) -> bool:
    suffix = Path(path.name.removesuffix(".gz")).suffix.lower()
    if suffix in _JSONL_SUFFIXES:
        return True
    if suffix == ".txt":
        return False
    for _, line in _lines(path, None):  # sniff: first non-blank line is a JSON object
        if line.strip():
            try:
                return isinstance(json.loads(line), dict)
            except ValueError:
                return False
    return False


def _part_text(item: Any) -> str | None:
    """One turn's text: a string, ``{"content": str}``, ``{"value": str}`` (ShareGPT) or
    ``{"content": [{"type": "text", "text": str}, ...]}`` (OpenAI content parts)."""
    if isinstance(item, str):
        return item
    if not isinstance(item, dict):
        return None
    content = item.get("content", item.get("value", item.get("text")))
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") if isinstance(p, dict) else p for p in content]
        parts = [p for p in parts if isinstance(p, str)]
        return "\n".join(parts) if parts else None
    return None


def record_texts(value: Any) -> list[str] | None:
    """The strings of a record field (a string, or a list of turns); None if none."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        out = [t for t in map(_part_text, value) if t is not None]
        return out or None
    return None


def _texts_of(record: Any, fields: tuple[str, ...]) -> list[str] | None:
    if not isinstance(record, dict):
        return None
    for name in fields:
        if name in record:
            texts = record_texts(record[name])
            if texts is not None:
                return texts
    return None


def _json_records(path: Path, bar) -> Iterator[Any]:
    """Records of a JSONL file, or of a file holding one JSON array (ShareGPT dumps)."""
    lines = _lines(path, bar)
    first = None
    for lineno, line in lines:
        if line.strip():
            first = (lineno, line)
            break
    if first is None:
        return
    if first[1].lstrip().startswith("["):  # one JSON array, not JSON lines
        text = first[1] + "".join(line for _, line in lines)
        try:
            data = json.load(io.StringIO(text))
        except ValueError as exc:
            raise CorpusError(f"corpus {path}: not a valid JSON array ({exc})", file=path,
                              expected="JSON lines or one JSON array of records") from None
        yield from data
        return
    for lineno, line in [first, *lines]:
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except ValueError as exc:
            raise CorpusError(f"corpus {path}: line {lineno} is not valid JSON ({exc})",
                              file=path, expected="one JSON object per line") from None


def iter_documents(path: str | Path, field: str | None = None, text_unit: str = "line", *,
                   progress: bool | None = False) -> Iterator[list[str] | None]:
    """One item per record of a corpus file: its texts, or ``None`` for a
    record without a usable field (counted as skipped).

    JSONL (``.jsonl`` / ``.ndjson`` / ``.json``, or any file whose first line is a JSON
    object), or one JSON array: ``field``, else the first of :data:`DEFAULT_FIELDS`
    present. Plain text: one document per non-blank line (``text_unit="line"``) or the
    whole file (``"file"``). A ``.gz`` suffix is decompressed. ``progress``: a tqdm bar
    over the file's bytes (None: only on a terminal).
    """
    path = Path(path)
    if text_unit not in ("line", "file"):
        raise CorpusError(f"text_unit must be 'line' or 'file', got {text_unit!r}")
    sniff_corpus(path)
    bar = None
    if progress is not False:
        from tqdm import tqdm

        bar = tqdm(total=os.path.getsize(path), desc=path.name, unit="B", unit_scale=True,
                   disable=None if progress is None else False, leave=False)
    try:
        if _is_jsonl(path):
            fields = (field,) if field else DEFAULT_FIELDS
            for record in _json_records(path, bar):
                yield _texts_of(record, fields)
        elif text_unit == "file":
            text = "".join(line for _, line in _lines(path, bar))
            if text.strip():
                yield [text]
        else:
            for _, line in _lines(path, bar):
                line = line.rstrip("\r\n")
                if line.strip():
                    yield [line]
    finally:
        if bar is not None:
            bar.close()
