"""Read a Kimi-format tokenizer directory.

A Kimi-format directory holds a tiktoken rank file (``tiktoken.model``, one
``<base64 token bytes> <rank>`` line per regular token; rank = token id) and a
``tokenizer_config.json`` whose ``added_tokens_decoder`` names the 256 reserved
ids that follow the ranks.  Unnamed reserved ids are ``<|reserved_token_{id}|>``,
as Kimi's own loader calls them.  An optional ``config.json`` gives the model's
``vocab_size`` (top level or under ``text_config``).

Every malformed input raises :class:`~vllm_kimi_ext.tokenizers.errors.TokenizerInputError`
naming the file (and line, for the rank file).  Standard library only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_kimi_ext.user_input import MAX_VOCAB_SIZE

from .errors import TokenizerInputError
from .json_files import read_json_object

__all__ = [
    "NUM_RESERVED_SPECIAL_TOKENS",
    "RANK_FILE_NAMES",
    "SPECIAL_FIELDS",
    "KimiTokenizerFiles",
    "load_tokenizer_dir",
    "parse_rank_file",
]

RANK_FILE_NAMES = ("tiktoken.model", "tokenizer.model")
NUM_RESERVED_SPECIAL_TOKENS = 256
#: tokenizer_config.json fields naming a special token
SPECIAL_FIELDS = ("bos_token", "eos_token", "pad_token", "unk_token")

_RESERVED_RE = re.compile(r"^<\|reserved_token_\d+\|>$")


@dataclass
class KimiTokenizerFiles:
    """One parsed Kimi-format tokenizer directory."""

    path: Path
    rank_file: Path
    rank_sha256: str
    ranks: list[bytes]  # index = rank = token id
    declared_special: dict[int, str]  # added_tokens_decoder as written
    special: dict[int, str]  # effective: declared + reserved fillers in [n, n+256)
    special_ids: dict[str, list[int]]  # name -> ids carrying it (normally one)
    fields: dict[str, str | None]  # bos_token / eos_token / pad_token / unk_token
    chat_template: str | None
    config_vocab_size: int | None

    @property
    def n_ranks(self) -> int:
        return len(self.ranks)

    @property
    def vocab_size(self) -> int:
        """Size of the id space the tokenizer defines (ranks + reserved/added ids)."""
        top = max(self.special, default=-1) + 1
        return max(self.n_ranks + NUM_RESERVED_SPECIAL_TOKENS, top)

    def named_special(self) -> dict[int, str]:
        """Special ids with a real name (not a ``<|reserved_token_N|>`` filler)."""
        return {i: s for i, s in self.special.items() if not _RESERVED_RE.match(s)}

    def token_id(self, name: str | None) -> int | None:
        """Id of a special-token name, or of a regular token with those bytes."""
        if name is None:
            return None
        ids = self.special_ids.get(name)
        if ids:
            return ids[0]
        if not hasattr(self, "_rank_index"):
            self._rank_index = {tok: i for i, tok in enumerate(self.ranks)}
        return self._rank_index.get(name.encode("utf-8"))

    def describe_id(self, token_id: int) -> str:
        if token_id in self.special:
            return f"`{self.special[token_id]}`"
        if 0 <= token_id < self.n_ranks:
            return f"regular token {self.ranks[token_id]!r}"
        return "no token"

    def id_keys(self) -> list[bytes | str | None]:
        """Per id: the rank bytes, the special name (str), or None for a hole."""
        keys: list[bytes | str | None] = list(self.ranks)
        keys += [None] * (self.vocab_size - len(keys))
        for i, s in self.special.items():
            keys[i] = s
        return keys

    def summary(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "rank_file": self.rank_file.name,
            "rank_sha256": self.rank_sha256,
            "n_ranks": self.n_ranks,
            "vocab_size": self.vocab_size,
            "config_vocab_size": self.config_vocab_size,
            "named_special_tokens": len(self.named_special()),
            **{f: self.fields.get(f) for f in SPECIAL_FIELDS},
            **{f + "_id": self.token_id(self.fields.get(f)) for f in SPECIAL_FIELDS},
            "chat_template_sha256": (
                None
                if self.chat_template is None
                else hashlib.sha256(self.chat_template.encode("utf-8")).hexdigest()
            ),
        }


# ---------------------------------------------------------------------------- rank file


def _parse_rank_line(raw: bytes, lineno: int, path: Path) -> tuple[bytes, int]:
    """``(token bytes, rank)`` of one non-blank rank-file line."""
    parts = raw.strip().split()
    shown = raw.decode("utf-8", errors="replace")[:80]
    if len(parts) != 2:
        raise TokenizerInputError(
            f"{path} line {lineno}: expected '<base64 token> <rank>', got {shown!r}",
            path=path,
            line=lineno,
        )
    try:
        tok = base64.b64decode(parts[0], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise TokenizerInputError(
            f"{path} line {lineno}: invalid base64 token {shown.split()[0]!r} ({exc})",
            path=path,
            line=lineno,
        ) from exc
    try:
        rank = int(parts[1])
    except ValueError:
        rank = -1
    if rank < 0 or not parts[1].isdigit():
        raise TokenizerInputError(
            f"{path} line {lineno}: rank {parts[1].decode(errors='replace')!r} "
            "is not a non-negative integer",
            path=path,
            line=lineno,
        )
    return tok, rank


def parse_rank_file(path: str | Path) -> tuple[list[bytes], str]:
    """Parse a tiktoken rank file; return (tokens indexed by rank, sha256 hex).

    Raises :class:`TokenizerInputError` naming the file and line for a malformed
    line, an invalid base64 token, a duplicate token or rank, or a gap in ranks.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TokenizerInputError(f"{path}: cannot read rank file: {exc}", path=path) from exc
    sha = hashlib.sha256(data).hexdigest()
    by_rank: dict[int, tuple[bytes, int]] = {}
    seen: dict[bytes, int] = {}
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        tok, rank = _parse_rank_line(raw, lineno, path)
        if tok in seen:
            raise TokenizerInputError(
                f"{path} line {lineno}: token {tok!r} already listed on line {seen[tok]}",
                path=path,
                line=lineno,
            )
        if rank in by_rank:
            raise TokenizerInputError(
                f"{path} line {lineno}: rank {rank} already used on line {by_rank[rank][1]}",
                path=path,
                line=lineno,
            )
        seen[tok] = lineno
        by_rank[rank] = (tok, lineno)
    if not by_rank:
        raise TokenizerInputError(f"{path}: rank file has no tokens", path=path)
    n = len(by_rank)
    if max(by_rank) != n - 1:
        missing = next(r for r in range(n) if r not in by_rank)
        raise TokenizerInputError(
            f"{path}: ranks must be 0..N-1 without gaps; rank {missing} is missing "
            f"(highest rank {max(by_rank)}, {n} tokens)",
            path=path,
        )
    return [by_rank[r][0] for r in range(n)], sha


# ------------------------------------------------------------------------- config files


def _read_json(path: Path) -> dict[str, Any]:
    return read_json_object(path)


def _token_content(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _chat_template(directory: Path, config: dict[str, Any], config_path: Path) -> str | None:
    tmpl = config.get("chat_template")
    if isinstance(tmpl, str):
        return tmpl
    if isinstance(tmpl, list):  # [{"name": ..., "template": ...}, ...]
        named = {
            t.get("name"): t.get("template")
            for t in tmpl
            if isinstance(t, dict) and isinstance(t.get("template"), str)
        }
        if "default" in named:
            return named["default"]
        if named:
            return next(iter(named.values()))
        raise TokenizerInputError(
            f"{config_path}: chat_template list has no entry with a 'template' string",
            path=config_path,
        )
    if tmpl is not None:
        raise TokenizerInputError(
            f"{config_path}: chat_template must be a string or a list, got {type(tmpl).__name__}",
            path=config_path,
        )
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerInputError(f"{jinja}: cannot read: {exc}", path=jinja) from exc
    return None


def _declared_special(config: dict[str, Any], config_path: Path) -> dict[int, str]:
    """``added_tokens_decoder`` as ``{id: name}``."""
    raw_added = config.get("added_tokens_decoder", {})
    if not isinstance(raw_added, dict):
        raise TokenizerInputError(
            f"{config_path}: added_tokens_decoder must be an object mapping ids to tokens",
            path=config_path,
        )
    declared: dict[int, str] = {}
    for key, value in raw_added.items():
        try:
            tid = int(key)
        except (TypeError, ValueError):
            tid = -1
        if not 0 <= tid < MAX_VOCAB_SIZE:
            raise TokenizerInputError(
                f"{config_path}: added_tokens_decoder key {key!r} is not a token id "
                f"(expected an integer in [0, {MAX_VOCAB_SIZE}))",
                path=config_path, field=f"added_tokens_decoder.{key}",
                expected="a non-negative integer id",
            )
        content = _token_content(value)
        if not content:
            raise TokenizerInputError(
                f"{config_path}: added_tokens_decoder[{key!r}] has no 'content' string",
                path=config_path,
            )
        declared[tid] = content
    return declared


def _effective_special(declared: dict[int, str], n: int, config_path: Path) -> dict[int, str]:
    """The special ids Kimi's loader ends up with after ``n`` ranks: the 256 reserved
    slots (declared name or filler) plus declared ids above them. A declared id below
    ``n`` collides with a regular token (Kimi's loader would drop it silently): refused."""
    colliding = sorted(t for t in declared if t < n)
    if colliding:
        tid = colliding[0]
        raise TokenizerInputError(
            f"{config_path}: added_tokens_decoder id {tid} (`{declared[tid]}`) collides with "
            f"regular token {tid} of the {n}-rank file ({len(colliding)} colliding id(s); "
            f"special ids start at {n})", path=config_path,
            field=f"added_tokens_decoder.{tid}", expected=f"ids >= {n}")
    special: dict[int, str] = {}
    for tid in range(n, n + NUM_RESERVED_SPECIAL_TOKENS):
        special[tid] = declared.get(tid, f"<|reserved_token_{tid}|>")
    for tid, content in declared.items():
        if tid >= n + NUM_RESERVED_SPECIAL_TOKENS:
            special[tid] = content
    return special


def _config_vocab_size(directory: Path) -> int | None:
    """``vocab_size`` of the directory's ``config.json`` (top level or text config)."""
    model_config_path = directory / "config.json"
    if not model_config_path.is_file():
        return None
    model_config = _read_json(model_config_path)
    vs = model_config.get("vocab_size")
    if vs is None and isinstance(model_config.get("text_config"), dict):
        vs = model_config["text_config"].get("vocab_size")
    if vs is not None and (not isinstance(vs, int) or isinstance(vs, bool) or vs <= 0):
        raise TokenizerInputError(
            f"{model_config_path}: vocab_size must be a positive integer, got {vs!r}",
            path=model_config_path,
        )
    return vs


def _find_rank_file(directory: Path) -> Path:
    if not directory.exists():
        raise TokenizerInputError(f"{directory}: no such directory", path=directory)
    if not directory.is_dir():
        raise TokenizerInputError(f"{directory}: not a directory", path=directory)
    rank_file = next((directory / n for n in RANK_FILE_NAMES if (directory / n).is_file()), None)
    if rank_file is None:
        raise TokenizerInputError(
            f"{directory}: no tiktoken rank file (looked for {' and '.join(RANK_FILE_NAMES)})",
            path=directory,
        )
    return rank_file


def load_tokenizer_dir(directory: str | Path) -> KimiTokenizerFiles:
    """Parse a Kimi-format tokenizer directory (see module docstring)."""
    directory = Path(directory)
    rank_file = _find_rank_file(directory)
    ranks, sha = parse_rank_file(rank_file)

    config_path = directory / "tokenizer_config.json"
    if not config_path.is_file():
        raise TokenizerInputError(f"{config_path}: file not found", path=config_path)
    config = _read_json(config_path)
    declared = _declared_special(config, config_path)
    special = _effective_special(declared, len(ranks), config_path)
    special_ids: dict[str, list[int]] = {}
    for tid in sorted(special):
        special_ids.setdefault(special[tid], []).append(tid)

    return KimiTokenizerFiles(
        path=directory,
        rank_file=rank_file,
        rank_sha256=sha,
        ranks=ranks,
        declared_special=declared,
        special=special,
        special_ids=special_ids,
        fields={f: _token_content(config.get(f)) for f in SPECIAL_FIELDS},
        chat_template=_chat_template(directory, config, config_path),
        config_vocab_size=_config_vocab_size(directory),
    )
