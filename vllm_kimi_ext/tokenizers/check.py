"""Compare two Kimi-format tokenizer directories (target vs. draft).

A Kimi-format directory holds a tiktoken rank file (``tiktoken.model``, one
``<base64 token bytes> <rank>`` line per regular token; rank = token id) and a
``tokenizer_config.json`` whose ``added_tokens_decoder`` names the 256 reserved
ids that follow the ranks.  Unnamed reserved ids are ``<|reserved_token_{id}|>``,
as Kimi's own loader calls them.

Verdicts (see ``docs/tokenizers.md``):

- ``identical``: same rank file bytes, same special-token maps, same bos/eos/pad/unk,
  same chat template and same ``config.json`` vocab size (when present).
- ``compatible``: every id the target can emit or its chat template uses means the
  same thing in the draft (same bytes for ranks, same name for named special
  tokens, in both directions id->string and string->id); what differs cannot
  change what a target id means (draft-only names for ids the target keeps
  reserved, the draft's own bos/eos fields, its chat template, rank-file bytes
  that parse to the same ranks).
- ``incompatible``: anything else, e.g. a differing rank, a target special token
  renamed or moved in the draft, fewer ranks in the draft, or different
  ``config.json`` vocab sizes (vLLM's ``draft_model`` method requires equal sizes).

Only the standard library is used, so the CLI stays cheap to import.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_kimi_ext.findings import Finding

__all__ = [
    "FIXED_TEMPLATE_TOKENS",
    "NUM_RESERVED_SPECIAL_TOKENS",
    "RANK_FILE_NAMES",
    "KimiTokenizerFiles",
    "TokenizerInputError",
    "TokenizerMismatchError",
    "TokenizerReport",
    "check_tokenizers",
    "load_tokenizer_dir",
    "parse_rank_file",
    "refuse_if_incompatible",
    "template_tokens",
]

RANK_FILE_NAMES = ("tiktoken.model", "tokenizer.model")
NUM_RESERVED_SPECIAL_TOKENS = 256

#: Tokens Kimi-K2.5's chat format and parsers rely on, checked even when the
#: target's chat template does not spell them out.
FIXED_TEMPLATE_TOKENS = (
    "[BOS]",
    "[EOS]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<think>",
    "</think>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|media_begin|>",
    "<|media_content|>",
    "<|media_end|>",
    "<|media_pad|>",
)

_RESERVED_RE = re.compile(r"^<\|reserved_token_\d+\|>$")
_TEMPLATE_TOKEN_RE = re.compile(r"<\|[A-Za-z0-9_]+\|>|\[[A-Z]{2,5}\]|</?think>")
_SPECIAL_FIELDS = ("bos_token", "eos_token", "pad_token", "unk_token")
_SEVERITIES = ("info", "compatible", "incompatible")


class TokenizerInputError(ValueError):
    """A tokenizer directory is missing a file or has a malformed one."""

    def __init__(self, message: str, *, path: str | Path | None = None, line: int | None = None):
        super().__init__(message)
        self.path = None if path is None else str(path)
        self.line = line


class TokenizerMismatchError(ValueError):
    """Raised by :func:`refuse_if_incompatible`; carries the full report."""

    def __init__(self, report: TokenizerReport):
        self.report = report
        self.reasons = list(report.reasons)
        lines = "\n".join(f"  - {r}" for r in self.reasons)
        super().__init__(
            f"draft tokenizer {report.draft_dir} is incompatible with target tokenizer "
            f"{report.target_dir} ({len(self.reasons)} reason(s)):\n{lines}"
        )


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
    notes: list[str] = field(default_factory=list)

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
            **{f: self.fields.get(f) for f in _SPECIAL_FIELDS},
            **{f + "_id": self.token_id(self.fields.get(f)) for f in _SPECIAL_FIELDS},
            "chat_template_sha256": (
                None
                if self.chat_template is None
                else hashlib.sha256(self.chat_template.encode("utf-8")).hexdigest()
            ),
        }


# ------------------------------------------------------------------------------ loading


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
        line = raw.strip()
        if not line:
            continue
        parts = line.split()
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


def _read_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TokenizerInputError(f"{path}: cannot read: {exc}", path=path) from exc
    except UnicodeDecodeError as exc:
        raise TokenizerInputError(f"{path}: not UTF-8 text ({exc})", path=path) from exc
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TokenizerInputError(
            f"{path} line {exc.lineno} column {exc.colno}: invalid JSON: {exc.msg}",
            path=path,
            line=exc.lineno,
        ) from exc
    if not isinstance(obj, dict):
        raise TokenizerInputError(f"{path}: expected a JSON object at top level", path=path)
    return obj


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


def load_tokenizer_dir(directory: str | Path) -> KimiTokenizerFiles:
    """Parse a Kimi-format tokenizer directory (see module docstring)."""
    directory = Path(directory)
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
    ranks, sha = parse_rank_file(rank_file)
    n = len(ranks)

    config_path = directory / "tokenizer_config.json"
    if not config_path.is_file():
        raise TokenizerInputError(f"{config_path}: file not found", path=config_path)
    config = _read_json(config_path)
    raw_added = config.get("added_tokens_decoder", {})
    if not isinstance(raw_added, dict):
        raise TokenizerInputError(
            f"{config_path}: added_tokens_decoder must be an object mapping ids to tokens",
            path=config_path,
        )
    notes: list[str] = []
    declared: dict[int, str] = {}
    for key, value in raw_added.items():
        try:
            tid = int(key)
        except (TypeError, ValueError):
            tid = -1
        if tid < 0:
            raise TokenizerInputError(
                f"{config_path}: added_tokens_decoder key {key!r} is not a token id",
                path=config_path,
            )
        content = _token_content(value)
        if not content:
            raise TokenizerInputError(
                f"{config_path}: added_tokens_decoder[{key!r}] has no 'content' string",
                path=config_path,
            )
        declared[tid] = content

    special: dict[int, str] = {}
    for tid in range(n, n + NUM_RESERVED_SPECIAL_TOKENS):
        special[tid] = declared.get(tid, f"<|reserved_token_{tid}|>")
    for tid, content in declared.items():
        if tid < n:
            notes.append(
                f"added_tokens_decoder id {tid} (`{content}`) is below the {n} ranks; "
                "Kimi's loader ignores it"
            )
        elif tid >= n + NUM_RESERVED_SPECIAL_TOKENS:
            special[tid] = content
    special_ids: dict[str, list[int]] = {}
    for tid in sorted(special):
        special_ids.setdefault(special[tid], []).append(tid)

    fields = {f: _token_content(config.get(f)) for f in _SPECIAL_FIELDS}
    chat_template = _chat_template(directory, config, config_path)

    config_vocab_size = None
    model_config_path = directory / "config.json"
    if model_config_path.is_file():
        model_config = _read_json(model_config_path)
        vs = model_config.get("vocab_size")
        if vs is None and isinstance(model_config.get("text_config"), dict):
            vs = model_config["text_config"].get("vocab_size")
        if vs is not None:
            if not isinstance(vs, int) or isinstance(vs, bool) or vs <= 0:
                raise TokenizerInputError(
                    f"{model_config_path}: vocab_size must be a positive integer, got {vs!r}",
                    path=model_config_path,
                )
            config_vocab_size = vs

    return KimiTokenizerFiles(
        path=directory,
        rank_file=rank_file,
        rank_sha256=sha,
        ranks=ranks,
        declared_special=declared,
        special=special,
        special_ids=special_ids,
        fields=fields,
        chat_template=chat_template,
        config_vocab_size=config_vocab_size,
        notes=notes,
    )


def template_tokens(template: str | None, special_names: Any = ()) -> list[str]:
    """Special-looking tokens a chat template spells out, in order of first use:
    every given special name found in the text plus ``<|...|>``, ``[XXX]`` and
    ``<think>``-style markers."""
    if not template:
        return []
    found: dict[str, int] = {}
    for m in _TEMPLATE_TOKEN_RE.finditer(template):
        found.setdefault(m.group(0), m.start())
    for name in special_names:
        pos = template.find(name)
        if pos >= 0:
            found.setdefault(name, pos)
    return [t for t, _ in sorted(found.items(), key=lambda kv: (kv[1], kv[0]))]


# ---------------------------------------------------------------------------- comparing


@dataclass
class TokenizerReport:
    verdict: str  # "identical" | "compatible" | "incompatible"
    target_dir: str
    draft_dir: str
    findings: list[Finding]
    target: dict[str, Any]
    draft: dict[str, Any]
    first_rank_mismatch: dict[str, Any] | None = None
    template_tokens: list[str] = field(default_factory=list)

    @property
    def reasons(self) -> list[str]:
        """The findings that decide the verdict (for ``identical``: what was checked)."""
        level = {"identical": "info"}.get(self.verdict, self.verdict)
        return [f.message for f in self.findings if f.severity == level]

    @property
    def ok(self) -> bool:
        return self.verdict != "incompatible"

    def codes(self, severity: str | None = None) -> list[str]:
        return [f.code for f in self.findings if severity is None or f.severity == severity]

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "reasons": self.reasons,
            # severity first: the key order this report has always printed
            "findings": [{"severity": f.severity, **f.to_dict()} for f in self.findings],
            "target": self.target,
            "draft": self.draft,
            "first_rank_mismatch": self.first_rank_mismatch,
            "template_tokens": self.template_tokens,
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, **kwargs)

    def format_text(self) -> str:
        def side(label: str, s: dict[str, Any]) -> str:
            return (
                f"  {label} {s['path']}: {s['n_ranks']} ranks, vocab {s['vocab_size']}"
                + (f" (config.json {s['config_vocab_size']})" if s["config_vocab_size"] else "")
                + f", sha256 {s['rank_sha256'][:16]}"
            )

        lines = [f"tokenizer-check: {self.verdict.upper()}", side("target", self.target)]
        lines.append(side("draft ", self.draft))
        lines.append("reasons:")
        lines += [f"  - {r}" for r in self.reasons]
        others = [
            f for f in self.findings if f.severity != "info" and f.message not in self.reasons
        ]
        if others:
            lines.append("other differences (harmless for the target):")
            lines += [f"  - {f.message}" for f in others]
        return "\n".join(lines)


def _fmt_ids(ids: list[int]) -> str:
    return ", ".join(str(i) for i in ids) if ids else "none"


def _compare(t: KimiTokenizerFiles, d: KimiTokenizerFiles) -> TokenizerReport:
    findings: list[Finding] = []

    def add(severity: str, code: str, message: str) -> None:
        assert severity in _SEVERITIES
        findings.append(Finding(code, severity, message))

    # -- rank files -----------------------------------------------------------------
    first_mismatch = None
    if t.rank_sha256 == d.rank_sha256:
        add(
            "info",
            "ranks_identical",
            f"rank files identical (sha256 {t.rank_sha256[:16]}, {t.n_ranks} ranks)",
        )
    else:
        common = min(t.n_ranks, d.n_ranks)
        diffs = [i for i in range(common) if t.ranks[i] != d.ranks[i]]
        if diffs:
            i = diffs[0]
            first_mismatch = {
                "rank": i,
                "target": repr(t.ranks[i]),
                "draft": repr(d.ranks[i]),
                "target_base64": base64.b64encode(t.ranks[i]).decode("ascii"),
                "draft_base64": base64.b64encode(d.ranks[i]).decode("ascii"),
                "differing_ranks": len(diffs),
            }
            add(
                "incompatible",
                "rank_mismatch",
                f"rank files differ (sha256 {t.rank_sha256[:16]} vs {d.rank_sha256[:16]}): "
                f"first differing rank {i}: target {t.ranks[i]!r}, draft {d.ranks[i]!r} "
                f"({len(diffs)} of {common} shared ranks differ)",
            )
        if d.n_ranks < t.n_ranks:
            add(
                "incompatible",
                "draft_fewer_ranks",
                f"draft rank file has {d.n_ranks} ranks, target {t.n_ranks}: target ids "
                f"{d.n_ranks}..{t.n_ranks - 1} are not the same regular tokens in the draft",
            )
        elif d.n_ranks > t.n_ranks:
            add(
                "compatible",
                "draft_more_ranks",
                f"draft rank file has {d.n_ranks - t.n_ranks} more ranks than the target's "
                f"{t.n_ranks}",
            )
        if not diffs and d.n_ranks == t.n_ranks:
            add(
                "compatible",
                "rank_file_bytes_differ",
                f"rank files differ in bytes (sha256 {t.rank_sha256[:16]} vs "
                f"{d.rank_sha256[:16]}) but define the same {t.n_ranks} ranks",
            )

    # -- special tokens ---------------------------------------------------------------
    t_named = t.named_special()
    used_in_template = template_tokens(t.chat_template, t_named.values())
    field_of: dict[str, str] = {}
    for f in _SPECIAL_FIELDS:
        name = t.fields.get(f)
        if name is not None:
            field_of.setdefault(name, f)
    required: dict[int, str] = dict(t_named)
    for name in list(used_in_template) + list(FIXED_TEMPLATE_TOKENS) + list(field_of):
        ids = t.special_ids.get(name)
        if ids:
            required.setdefault(ids[0], name)

    for tid in sorted(required):
        name = required[tid]
        d_ids = d.special_ids.get(name, [])
        d_at = d.special.get(tid)
        if d_at == name and d_ids == [tid]:
            continue
        context = []
        if name in used_in_template:
            context.append("used by the target's chat template")
        if name in field_of:
            context.append(f"target {field_of[name]}")
        if name in FIXED_TEMPLATE_TOKENS and name not in used_in_template:
            context.append("Kimi chat/tool token")
        ctx = f" ({'; '.join(context)})" if context else ""
        if not d_ids:
            where = "is not a special token of the draft"
        elif tid in d_ids:
            others = [i for i in d_ids if i != tid]
            where = f"is also draft id(s) {_fmt_ids(others)}"
        else:
            where = f"is draft id {_fmt_ids(d_ids)}"
        code = "special_moved" if d_ids and tid not in d_ids else "special_renamed"
        if d_ids and tid in d_ids:
            code = "special_duplicated"
        add(
            "incompatible",
            code,
            f"`{name}`{ctx}: target id {tid} {where}; draft id {tid} is {d.describe_id(tid)}",
        )

    # ids the target keeps reserved (or does not have) but the draft names differently
    drift = [
        (i, s) for i, s in sorted(d.special.items()) if i not in required and t.special.get(i) != s
    ]
    if drift:
        shown = "; ".join(f"id {i}: draft `{s}`, target {t.describe_id(i)}" for i, s in drift[:3])
        more = f" (+{len(drift) - 3} more)" if len(drift) > 3 else ""
        add(
            "compatible",
            "draft_extra_special",
            f"draft names {len(drift)} id(s) the target keeps reserved or lacks: {shown}{more}",
        )
    missing_fixed = [
        n for n in FIXED_TEMPLATE_TOKENS if n not in t.special_ids and n in d.special_ids
    ]
    if missing_fixed:
        add(
            "info", "target_lacks_tokens", f"target has no special token {', '.join(missing_fixed)}"
        )
    not_special = [n for n in used_in_template if n not in t.special_ids]
    if not_special:
        add(
            "info",
            "template_plain_text",
            "target chat template spells "
            + ", ".join(f"`{n}`" for n in not_special)
            + " which the target tokenizes as plain text (not special tokens)",
        )
    if t.special == d.special:
        add(
            "info",
            "special_identical",
            f"special tokens identical ({len(t.special)} ids, {len(t_named)} named)",
        )

    # -- bos / eos / pad / unk --------------------------------------------------------
    for f in _SPECIAL_FIELDS:
        tn, dn = t.fields.get(f), d.fields.get(f)
        ti, di = t.token_id(tn), d.token_id(dn)
        if tn == dn and ti == di:
            continue
        add(
            "compatible",
            f"{f}_differs",
            f"{f}: target `{tn}` (id {ti}), draft `{dn}` (id {di}); the draft's own field is "
            "not used when the target's ids are fed to it",
        )

    # -- vocab sizes ----------------------------------------------------------------
    if t.vocab_size != d.vocab_size:
        add(
            "compatible",
            "tokenizer_vocab_size_differs",
            f"tokenizer vocab sizes differ: target {t.vocab_size}, draft {d.vocab_size}",
        )
    tc, dc = t.config_vocab_size, d.config_vocab_size
    if tc is not None and dc is not None:
        if tc != dc:
            add(
                "incompatible",
                "config_vocab_size_mismatch",
                f"config.json vocab_size: target {tc}, draft {dc} (vLLM's draft_model method "
                "requires equal vocab sizes)",
            )
    elif tc is not None or dc is not None:
        add(
            "info",
            "config_vocab_size_unknown",
            f"config.json vocab_size known for one side only (target {tc}, draft {dc})",
        )
    for label, s in (("target", t), ("draft", d)):
        if s.config_vocab_size is not None and s.config_vocab_size < s.vocab_size:
            add(
                "info",
                f"{label}_config_vocab_small",
                f"{label} config.json vocab_size {s.config_vocab_size} is smaller than its "
                f"tokenizer's {s.vocab_size} ids",
            )

    # -- chat template ---------------------------------------------------------------
    if t.chat_template is None:
        add(
            "info",
            "target_no_template",
            "target has no chat_template; checked the fixed Kimi token list only",
        )
    if t.chat_template != d.chat_template:
        add(
            "compatible",
            "chat_template_differs",
            "chat templates differ (vLLM renders prompts with the target's)",
        )
    else:
        add("info", "chat_template_identical", "chat templates identical")

    for label, s in (("target", t), ("draft", d)):
        for note in s.notes:
            add("info", f"{label}_note", f"{label}: {note}")

    severities = {f.severity for f in findings}
    verdict = (
        "incompatible"
        if "incompatible" in severities
        else "compatible"
        if "compatible" in severities
        else "identical"
    )
    return TokenizerReport(
        verdict=verdict,
        target_dir=str(t.path),
        draft_dir=str(d.path),
        findings=findings,
        target=t.summary(),
        draft=d.summary(),
        first_rank_mismatch=first_mismatch,
        template_tokens=used_in_template,
    )


def check_tokenizers(target_dir: str | Path, draft_dir: str | Path) -> TokenizerReport:
    """Compare a draft's Kimi-format tokenizer directory against the target's.

    Raises :class:`TokenizerInputError` (a ``ValueError``) for missing or
    malformed files; otherwise returns a :class:`TokenizerReport`.
    """
    return _compare(load_tokenizer_dir(target_dir), load_tokenizer_dir(draft_dir))


def refuse_if_incompatible(target_dir: str | Path, draft_dir: str | Path) -> TokenizerReport:
    """Return the report, or raise :class:`TokenizerMismatchError` listing every
    reason when the draft's tokenizer is incompatible with the target's."""
    report = check_tokenizers(target_dir, draft_dir)
    if report.verdict == "incompatible":
        raise TokenizerMismatchError(report)
    return report
