"""Compare two Kimi-format tokenizer directories (target vs. draft).

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

Each difference is a :class:`~vllm_kimi_ext.findings.Finding` whose severity is
``info``, ``compatible`` or ``incompatible``; the verdict is the worst severity.
Reading the directories is :mod:`.kimi_files`' job.  Standard library only, so
the CLI stays cheap to import.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_kimi_ext import facts
from vllm_kimi_ext.findings import Finding

from .kimi_files import SPECIAL_FIELDS, KimiTokenizerFiles, load_tokenizer_dir

__all__ = [
    "FIXED_TEMPLATE_TOKENS",
    "TokenizerMismatchError",
    "TokenizerReport",
    "check_tokenizers",
    "compare_tokenizers",
    "refuse_if_incompatible",
    "template_tokens",
]

#: Tokens Kimi-K2.5's chat format and parsers rely on, checked even when the
#: target's chat template does not spell them out (the model profile's special tokens).
FIXED_TEMPLATE_TOKENS = facts.special_tokens().all

_TEMPLATE_TOKEN_RE = re.compile(r"<\|[A-Za-z0-9_]+\|>|\[[A-Z]{2,5}\]|</?think>")
_SEVERITIES = ("info", "compatible", "incompatible")


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


# ------------------------------------------------------------------------------- report


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


# ------------------------------------------------------------------------------- steps


def _finding(severity: str, code: str, message: str) -> Finding:
    assert severity in _SEVERITIES
    return Finding(code, severity, message)


def _fmt_ids(ids: list[int]) -> str:
    return ", ".join(str(i) for i in ids) if ids else "none"


def _first_rank_mismatch(t: KimiTokenizerFiles, d: KimiTokenizerFiles,
                         diffs: list[int]) -> dict[str, Any]:
    i = diffs[0]
    return {
        "rank": i,
        "target": repr(t.ranks[i]),
        "draft": repr(d.ranks[i]),
        "target_base64": base64.b64encode(t.ranks[i]).decode("ascii"),
        "draft_base64": base64.b64encode(d.ranks[i]).decode("ascii"),
        "differing_ranks": len(diffs),
    }


def _compare_ranks(
    t: KimiTokenizerFiles, d: KimiTokenizerFiles
) -> tuple[list[Finding], dict[str, Any] | None]:
    """Rank files: identical bytes, the same ranks in other bytes, or differing ranks.
    Also returns the first differing rank, if any."""
    if t.rank_sha256 == d.rank_sha256:
        return [_finding(
            "info",
            "ranks_identical",
            f"rank files identical (sha256 {t.rank_sha256[:16]}, {t.n_ranks} ranks)",
        )], None
    out: list[Finding] = []
    first_mismatch = None
    common = min(t.n_ranks, d.n_ranks)
    diffs = [i for i in range(common) if t.ranks[i] != d.ranks[i]]
    if diffs:
        first_mismatch = _first_rank_mismatch(t, d, diffs)
        i = diffs[0]
        out.append(_finding(
            "incompatible",
            "rank_mismatch",
            f"rank files differ (sha256 {t.rank_sha256[:16]} vs {d.rank_sha256[:16]}): "
            f"first differing rank {i}: target {t.ranks[i]!r}, draft {d.ranks[i]!r} "
            f"({len(diffs)} of {common} shared ranks differ)",
        ))
    if d.n_ranks < t.n_ranks:
        out.append(_finding(
            "incompatible",
            "draft_fewer_ranks",
            f"draft rank file has {d.n_ranks} ranks, target {t.n_ranks}: target ids "
            f"{d.n_ranks}..{t.n_ranks - 1} are not the same regular tokens in the draft",
        ))
    elif d.n_ranks > t.n_ranks:
        out.append(_finding(
            "compatible",
            "draft_more_ranks",
            f"draft rank file has {d.n_ranks - t.n_ranks} more ranks than the target's "
            f"{t.n_ranks}",
        ))
    if not diffs and d.n_ranks == t.n_ranks:
        out.append(_finding(
            "compatible",
            "rank_file_bytes_differ",
            f"rank files differ in bytes (sha256 {t.rank_sha256[:16]} vs "
            f"{d.rank_sha256[:16]}) but define the same {t.n_ranks} ranks",
        ))
    return out, first_mismatch


@dataclass(frozen=True)
class _TargetSpecials:
    """The target's special tokens a draft must keep: every named special id, plus
    the tokens its chat template, the fixed Kimi list and its bos/eos/pad/unk use."""

    required: dict[int, str]  # id -> name
    used_in_template: list[str]
    field_of: dict[str, str]  # name -> the first tokenizer_config field naming it

    @classmethod
    def of(cls, t: KimiTokenizerFiles) -> _TargetSpecials:
        t_named = t.named_special()
        used_in_template = template_tokens(t.chat_template, t_named.values())
        field_of: dict[str, str] = {}
        for f in SPECIAL_FIELDS:
            name = t.fields.get(f)
            if name is not None:
                field_of.setdefault(name, f)
        required: dict[int, str] = dict(t_named)
        for name in list(used_in_template) + list(FIXED_TEMPLATE_TOKENS) + list(field_of):
            ids = t.special_ids.get(name)
            if ids:
                required.setdefault(ids[0], name)
        return cls(required, used_in_template, field_of)

    def context(self, name: str) -> str:
        """Why the target needs ``name``, as a parenthesised suffix (or "")."""
        context = []
        if name in self.used_in_template:
            context.append("used by the target's chat template")
        if name in self.field_of:
            context.append(f"target {self.field_of[name]}")
        if name in FIXED_TEMPLATE_TOKENS and name not in self.used_in_template:
            context.append("Kimi chat/tool token")
        return f" ({'; '.join(context)})" if context else ""


def _required_special_mismatch(tid: int, name: str, d: KimiTokenizerFiles,
                               need: _TargetSpecials) -> Finding | None:
    """The finding for a required target special token that the draft does not
    carry at the same id, under the same name, and only there."""
    d_ids = d.special_ids.get(name, [])
    if d.special.get(tid) == name and d_ids == [tid]:
        return None
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
    return _finding(
        "incompatible",
        code,
        f"`{name}`{need.context(name)}: target id {tid} {where}; "
        f"draft id {tid} is {d.describe_id(tid)}",
    )


def _compare_special(t: KimiTokenizerFiles, d: KimiTokenizerFiles,
                     need: _TargetSpecials) -> list[Finding]:
    """Special tokens: required ones must match; other differences are harmless."""
    out = [f for tid in sorted(need.required)
           if (f := _required_special_mismatch(tid, need.required[tid], d, need)) is not None]
    # ids the target keeps reserved (or does not have) but the draft names differently
    drift = [(i, s) for i, s in sorted(d.special.items())
             if i not in need.required and t.special.get(i) != s]
    if drift:
        shown = "; ".join(f"id {i}: draft `{s}`, target {t.describe_id(i)}" for i, s in drift[:3])
        more = f" (+{len(drift) - 3} more)" if len(drift) > 3 else ""
        out.append(_finding(
            "compatible",
            "draft_extra_special",
            f"draft names {len(drift)} id(s) the target keeps reserved or lacks: {shown}{more}",
        ))
    missing_fixed = [
        n for n in FIXED_TEMPLATE_TOKENS if n not in t.special_ids and n in d.special_ids
    ]
    if missing_fixed:
        out.append(_finding(
            "info", "target_lacks_tokens", f"target has no special token {', '.join(missing_fixed)}"
        ))
    not_special = [n for n in need.used_in_template if n not in t.special_ids]
    if not_special:
        out.append(_finding(
            "info",
            "template_plain_text",
            "target chat template spells "
            + ", ".join(f"`{n}`" for n in not_special)
            + " which the target tokenizes as plain text (not special tokens)",
        ))
    if t.special == d.special:
        out.append(_finding(
            "info",
            "special_identical",
            f"special tokens identical ({len(t.special)} ids, {len(t.named_special())} named)",
        ))
    return out


def _compare_special_fields(t: KimiTokenizerFiles, d: KimiTokenizerFiles) -> list[Finding]:
    """bos / eos / pad / unk: the draft's own fields are never used on target ids."""
    out = []
    for f in SPECIAL_FIELDS:
        tn, dn = t.fields.get(f), d.fields.get(f)
        ti, di = t.token_id(tn), d.token_id(dn)
        if tn == dn and ti == di:
            continue
        out.append(_finding(
            "compatible",
            f"{f}_differs",
            f"{f}: target `{tn}` (id {ti}), draft `{dn}` (id {di}); the draft's own field is "
            "not used when the target's ids are fed to it",
        ))
    return out


def _compare_vocab_sizes(t: KimiTokenizerFiles, d: KimiTokenizerFiles) -> list[Finding]:
    """Tokenizer id spaces may differ; ``config.json`` vocab sizes may not."""
    out = []
    if t.vocab_size != d.vocab_size:
        out.append(_finding(
            "compatible",
            "tokenizer_vocab_size_differs",
            f"tokenizer vocab sizes differ: target {t.vocab_size}, draft {d.vocab_size}",
        ))
    tc, dc = t.config_vocab_size, d.config_vocab_size
    if tc is not None and dc is not None:
        if tc != dc:
            out.append(_finding(
                "incompatible",
                "config_vocab_size_mismatch",
                f"config.json vocab_size: target {tc}, draft {dc} (vLLM's draft_model method "
                "requires equal vocab sizes)",
            ))
    elif tc is not None or dc is not None:
        out.append(_finding(
            "info",
            "config_vocab_size_unknown",
            f"config.json vocab_size known for one side only (target {tc}, draft {dc})",
        ))
    for label, s in (("target", t), ("draft", d)):
        if s.config_vocab_size is not None and s.config_vocab_size < s.vocab_size:
            out.append(_finding(
                "info",
                f"{label}_config_vocab_small",
                f"{label} config.json vocab_size {s.config_vocab_size} is smaller than its "
                f"tokenizer's {s.vocab_size} ids",
            ))
    return out


def _compare_chat_templates(t: KimiTokenizerFiles, d: KimiTokenizerFiles) -> list[Finding]:
    """vLLM renders prompts with the target's template: a differing draft one is harmless."""
    out = []
    if t.chat_template is None:
        out.append(_finding(
            "info",
            "target_no_template",
            "target has no chat_template; checked the fixed Kimi token list only",
        ))
    if t.chat_template != d.chat_template:
        out.append(_finding(
            "compatible",
            "chat_template_differs",
            "chat templates differ (vLLM renders prompts with the target's)",
        ))
    else:
        out.append(_finding("info", "chat_template_identical", "chat templates identical"))
    return out


def _verdict(findings: list[Finding]) -> str:
    severities = {f.severity for f in findings}
    if "incompatible" in severities:
        return "incompatible"
    return "compatible" if "compatible" in severities else "identical"


# ---------------------------------------------------------------------------- entry points


def compare_tokenizers(t: KimiTokenizerFiles, d: KimiTokenizerFiles) -> TokenizerReport:
    """Compare two parsed directories: ranks, special tokens, bos/eos/pad/unk,
    vocab sizes, then chat templates (the findings' order)."""
    need = _TargetSpecials.of(t)
    findings, first_mismatch = _compare_ranks(t, d)
    findings += _compare_special(t, d, need)
    findings += _compare_special_fields(t, d)
    findings += _compare_vocab_sizes(t, d)
    findings += _compare_chat_templates(t, d)
    return TokenizerReport(
        verdict=_verdict(findings),
        target_dir=str(t.path),
        draft_dir=str(d.path),
        findings=findings,
        target=t.summary(),
        draft=d.summary(),
        first_rank_mismatch=first_mismatch,
        template_tokens=need.used_in_template,
    )


def check_tokenizers(target_dir: str | Path, draft_dir: str | Path) -> TokenizerReport:
    """Compare a draft's Kimi-format tokenizer directory against the target's.

    Raises :class:`~vllm_kimi_ext.tokenizers.errors.TokenizerInputError` (a
    ``ValueError``) for missing or malformed files; otherwise returns a
    :class:`TokenizerReport`.
    """
    return compare_tokenizers(load_tokenizer_dir(target_dir), load_tokenizer_dir(draft_dir))


def refuse_if_incompatible(target_dir: str | Path, draft_dir: str | Path) -> TokenizerReport:
    """Return the report, or raise :class:`TokenizerMismatchError` listing every
    reason when the draft's tokenizer is incompatible with the target's."""
    report = check_tokenizers(target_dir, draft_dir)
    if report.verdict == "incompatible":
        raise TokenizerMismatchError(report)
    return report
