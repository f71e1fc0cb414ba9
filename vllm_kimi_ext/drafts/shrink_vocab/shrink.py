"""Reduce a full-vocabulary EAGLE-3 head to a frequent-token draft vocabulary.

The public Kimi-K2.5 EAGLE-3 heads predict over the target's full vocabulary
(``vocab_size`` of the model profile, :func:`vllm_kimi_ext.facts.target_dims`):
every draft step ends in a ``[hidden, vocab]`` ``lm_head`` matmul and a
vocabulary-wide argmax. EAGLE-3 supports a reduced draft vocabulary
(``draft_vocab_size`` rows in ``lm_head`` plus a ``d2t`` map back to target ids,
``d2t[i] = target_id - i``); vLLM 0.34.0 reads it natively.
:func:`shrink_vocab` builds such a head from a full one, without retraining:

1. tokens are counted on one or more corpora tokenized with the *target's*
   tokenizer;
2. the kept set is every *forced* id (the tokenizer's special and added tokens,
   the tokens the chat template emits, bos/eos/pad of the tokenizer and of the
   head's config) plus the most frequent remaining ids (ties broken by the
   lower id, so the result is deterministic) up to ``size``;
3. the output head is the input with ``lm_head.weight`` cut to the kept rows
   (ascending target id), ``d2t`` (int64 ``[size]``) and ``t2d`` (bool
   ``[vocab]``) added and ``draft_vocab_size`` set in ``config.json``, next to
   ``coverage.json`` / ``coverage.md`` (share of corpus tokens the kept set
   covers, per corpus file and overall).

Everything that can be checked cheaply is checked before the corpora are read
(:func:`check_inputs`: the output path, the head's config and safetensors headers
against the file sizes, each corpus file's first bytes). The output directory is
written in a temporary sibling directory and renamed into place at the end
(:mod:`.output_dir`): on any error, SIGTERM included, nothing is left behind, and the
leftovers of a SIGKILLed run are removed by the next one. Corpora: :mod:`.corpus`.

Nothing here imports vLLM; torch and safetensors are imported when writing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from vllm_kimi_ext.checkpoints.safetensors_headers import TensorIndex
from vllm_kimi_ext.user_input import UserInputError, tree_bytes

from .corpus import DEFAULT_FIELDS, CorpusError, iter_documents, sniff_corpus
from .output_dir import clean_stale, write_directory_atomically

__all__ = [
    "DEFAULT_FIELDS",
    "DEFAULT_SIZE",
    "CorpusCoverage",
    "CoverageReport",
    "ShrinkVocabError",
    "chat_template_token_ids",
    "check_inputs",
    "count_corpus",
    "forced_token_ids",
    "select_kept_ids",
    "shrink_vocab",
]

DEFAULT_SIZE = 32000
_WEIGHT_INDEX = "model.safetensors.index.json"
_JINJA_TAG = re.compile(r"\{%.*?%\}|\{\{.*?\}\}|\{#.*?#\}", re.DOTALL)


class ShrinkVocabError(UserInputError):
    """The input cannot be reduced (the message names the mismatch)."""


class TokenizerLike(Protocol):
    all_special_ids: Sequence[int]

    def encode(self, text: str) -> list[int]: ...

    def __len__(self) -> int: ...


# --------------------------------------------------------------------------- #
# Report                                                                       #
# --------------------------------------------------------------------------- #


@dataclasses.dataclass
class CorpusCoverage:
    """Token coverage of the kept set on one corpus file."""

    path: str
    records: int
    skipped_records: int
    tokens: int
    covered_tokens: int
    distinct_tokens: int

    @property
    def coverage(self) -> float:
        return self.covered_tokens / self.tokens if self.tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "coverage": self.coverage}


@dataclasses.dataclass
class CoverageReport:
    """What :func:`shrink_vocab` kept and how much of the corpora it covers."""

    head: str
    out_dir: str
    vocab_size: int
    size: int
    num_forced: int  # special / added / chat-template / bos-eos-pad ids kept unconditionally
    num_forced_unseen: int  # forced ids that never occur in the corpora
    num_by_frequency: int  # size - num_forced
    corpora: list[CorpusCoverage]
    kept_ids: list[int] = dataclasses.field(repr=False)

    @property
    def tokens(self) -> int:
        return sum(c.tokens for c in self.corpora)

    @property
    def covered_tokens(self) -> int:
        return sum(c.covered_tokens for c in self.corpora)

    @property
    def coverage(self) -> float:
        return self.covered_tokens / self.tokens if self.tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "head": self.head,
            "out_dir": self.out_dir,
            "vocab_size": self.vocab_size,
            "size": self.size,
            "num_forced": self.num_forced,
            "num_forced_unseen": self.num_forced_unseen,
            "num_by_frequency": self.num_by_frequency,
            "overall": {"tokens": self.tokens, "covered_tokens": self.covered_tokens,
                        "coverage": self.coverage},
            "corpora": [c.to_dict() for c in self.corpora],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def to_markdown(self) -> str:
        lines = [
            "# Draft vocabulary coverage",
            "",
            f"- head: `{Path(self.head).name}`",
            (f"- draft vocabulary: {self.size} of {self.vocab_size} target tokens "
             f"({self.num_forced} forced special/template tokens, "
             f"{self.num_by_frequency} by frequency)"),
            f"- forced tokens never seen in the corpora: {self.num_forced_unseen}",
            (f"- overall coverage: **{self.coverage:.2%}** "
             f"({self.covered_tokens} of {self.tokens} corpus tokens)"),
            "",
            "| corpus | records | skipped | tokens | covered | coverage |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for c in self.corpora:
            lines.append(f"| `{Path(c.path).name}` | {c.records} | {c.skipped_records} | "
                         f"{c.tokens} | {c.covered_tokens} | {c.coverage:.2%} |")
        lines.append(f"| **overall** | {sum(c.records for c in self.corpora)} | "
                     f"{sum(c.skipped_records for c in self.corpora)} | {self.tokens} | "
                     f"{self.covered_tokens} | {self.coverage:.2%} |")
        return "\n".join(lines) + "\n"

    def format_text(self) -> str:
        out = [(f"kept {self.size} of {self.vocab_size} tokens ({self.num_forced} forced, "
                f"{self.num_by_frequency} by frequency) -> {self.out_dir}"),
               (f"coverage overall {self.coverage:.2%} "
                f"({self.covered_tokens}/{self.tokens} tokens)")]
        out += [f"  {c.path}: {c.coverage:.2%} ({c.covered_tokens}/{c.tokens} tokens, "
                f"{c.records} records)" for c in self.corpora]
        return "\n".join(out)


# --------------------------------------------------------------------------- #
# Corpora                                                                      #
# --------------------------------------------------------------------------- #


@dataclasses.dataclass
class _Counted:
    path: str
    counts: Counter
    records: int
    skipped: int


def count_corpus(
    path: str | Path,
    encode: Callable[[str], list[int]],
    vocab_size: int,
    *,
    field: str | None = None,
    text_unit: str = "line",
    progress: bool | None = None,
) -> _Counted:
    """Token counts of one corpus file (tqdm progress bar over its bytes; ``None``:
    shown on a terminal only)."""
    path = Path(path)
    counts: Counter = Counter()
    records = skipped = 0
    try:
        for texts in iter_documents(path, field, text_unit, progress=progress):
            if texts is None:
                skipped += 1
                continue
            records += 1
            for text in texts:
                counts.update(encode(text))
    except CorpusError as exc:
        raise ShrinkVocabError(str(exc), file=exc.file, expected=exc.expected) from None
    bad = [t for t in counts if not 0 <= int(t) < vocab_size]
    if bad:
        raise ShrinkVocabError(
            f"corpus {path}: the tokenizer produced id {min(bad) if min(bad) < 0 else max(bad)} "
            f"outside the head's vocabulary [0, {vocab_size})")
    if records == 0:
        tried = f"field {field!r}" if field else "fields " + ", ".join(DEFAULT_FIELDS)
        raise ShrinkVocabError(
            f"empty corpus: {path} has no usable records ({skipped} record(s) without "
            f"{tried})" if skipped else f"empty corpus: {path} has no records")
    return _Counted(str(path), counts, records, skipped)


# --------------------------------------------------------------------------- #
# Kept set                                                                     #
# --------------------------------------------------------------------------- #


def _added_tokens(tokenizer: Any) -> dict[int, str]:
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    out = {}
    for tid, tok in dict(decoder).items():
        content = getattr(tok, "content", tok)
        if isinstance(content, str):
            out[int(tid)] = content
    return out


def _template_sources(template: Any) -> list[str]:
    if isinstance(template, str):
        return [template]
    if isinstance(template, dict):
        return [t for t in template.values() if isinstance(t, str)]
    if isinstance(template, list):  # [{"name": ..., "template": ...}]
        return [t.get("template") for t in template
                if isinstance(t, dict) and isinstance(t.get("template"), str)]
    return []


def chat_template_token_ids(tokenizer: Any, chat_template: Any = None) -> set[int]:
    """Ids the chat template emits: every added token whose text occurs in the
    template (also inside quoted Jinja literals), plus the tokens of the
    template's literal text outside Jinja tags (role names, separators)."""
    template = chat_template if chat_template is not None else getattr(
        tokenizer, "chat_template", None)
    ids: set[int] = set()
    for source in _template_sources(template):
        ids.update(tid for tid, content in _added_tokens(tokenizer).items()
                   if content and content in source)
        for literal in _JINJA_TAG.split(source):
            if literal:
                ids.update(int(t) for t in tokenizer.encode(literal))
    return ids


def forced_token_ids(
    tokenizer: Any, head_config: dict | None = None, chat_template: Any = None
) -> set[int]:
    """Ids kept whatever their frequency: the tokenizer's special and added
    tokens, the chat template's tokens, bos/eos/pad of the tokenizer and of the
    head's config."""
    forced = {int(t) for t in getattr(tokenizer, "all_special_ids", None) or []}
    forced |= set(_added_tokens(tokenizer))
    forced |= chat_template_token_ids(tokenizer, chat_template)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        for source in (tokenizer, head_config or {}):
            value = source.get(name) if isinstance(source, dict) else getattr(source, name, None)
            values = value if isinstance(value, (list, tuple)) else [value]
            forced.update(int(v) for v in values if v is not None)
    return forced


def select_kept_ids(counts: Counter, forced: Iterable[int], size: int,
                    vocab_size: int) -> list[int]:
    """``forced`` plus the most frequent other ids (ties: lower id first), sorted."""
    forced = set(forced)
    if len(forced) > size:
        raise ShrinkVocabError(
            f"{len(forced)} special/chat-template tokens must be kept but --size is {size}")
    by_freq = sorted((t for t in range(vocab_size) if t not in forced),
                     key=lambda t: (-counts.get(t, 0), t))
    return sorted(forced | set(by_freq[: size - len(forced)]))


# --------------------------------------------------------------------------- #
# Head                                                                         #
# --------------------------------------------------------------------------- #


def _read_head(head_dir: Path) -> tuple[dict, TensorIndex, str, int]:
    """Validated (config, tensor index, lm_head tensor name, vocab size)."""
    cfg_path = head_dir / "config.json"
    if not head_dir.is_dir():
        raise ShrinkVocabError(f"head {head_dir} is not a directory", file=head_dir,
                               expected="an EAGLE-3 head directory")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ShrinkVocabError(f"head {head_dir}: cannot read config.json ({exc})",
                               file=cfg_path, expected="a JSON config") from None
    if not isinstance(cfg, dict):
        raise ShrinkVocabError(f"head {cfg_path}: holds a JSON {type(cfg).__name__}, expected "
                               "an object of config fields", file=cfg_path)
    try:
        index = TensorIndex.from_dir(head_dir)
    except (OSError, ValueError) as exc:
        raise ShrinkVocabError(f"head {head_dir}: cannot read safetensors ({exc})",
                               file=head_dir, expected="complete safetensors files") from None
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list):
        raise ShrinkVocabError(f"head {cfg_path}: architectures must be a list of class names, "
                               f"got {archs!r}", file=cfg_path, field="architectures")
    if not any("eagle3" in str(a).lower() for a in archs):
        raise ShrinkVocabError(
            f"head {head_dir} is not an EAGLE-3 head: architectures {archs} contain no "
            f"'Eagle3' class")
    if index.find("fc.weight") is None:
        raise ShrinkVocabError(
            f"head {head_dir} is not an EAGLE-3 head: no fc.weight tensor "
            f"(the aux-hidden-state fusion layer)")
    vocab = cfg.get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab <= 0:
        raise ShrinkVocabError(f"head {head_dir}: config.json has no valid vocab_size ({vocab!r})")
    dvocab = cfg.get("draft_vocab_size")
    reduced_tensors = [n for n in ("d2t", "t2d") if index.find(n) is not None]
    if reduced_tensors or (dvocab is not None and dvocab != vocab):
        what = (f"has {' and '.join(reduced_tensors)}" if reduced_tensors
                else f"has draft_vocab_size {dvocab} < vocab_size {vocab}")
        raise ShrinkVocabError(
            f"head {head_dir} is already reduced ({what}); shrink a full-vocabulary head")
    lm_head = index.find("lm_head.weight")
    if lm_head is None:
        raise ShrinkVocabError(f"head {head_dir} has no lm_head.weight tensor")
    shape = index.shape(lm_head)
    if len(shape) != 2 or shape[0] != vocab:
        raise ShrinkVocabError(
            f"head {head_dir}: lm_head.weight has {shape[0] if shape else 0} rows (shape "
            f"{list(shape)}) but config vocab_size is {vocab}")
    return cfg, index, lm_head, vocab


def _write_head(head_dir: Path, tmp: Path, cfg: dict, index: TensorIndex, lm_head: str,
                kept: list[int], vocab: int) -> None:
    import torch
    from safetensors import safe_open

    from vllm_kimi_ext.outputs import save_safetensors

    kept_t = torch.tensor(kept, dtype=torch.int64)
    d2t = kept_t - torch.arange(len(kept), dtype=torch.int64)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[kept_t] = True
    lm_file = index.file(lm_head)
    files = sorted(head_dir.glob("*.safetensors"))
    for file in files:
        with safe_open(str(file), framework="pt") as fh:
            metadata = fh.metadata()
            names = list(fh.keys())
            tensors = {name: fh.get_tensor(name) for name in names}
        if file == lm_file:
            tensors[lm_head] = tensors[lm_head].index_select(0, kept_t).contiguous()
            tensors["d2t"] = d2t
            tensors["t2d"] = t2d
        save_safetensors(tensors, tmp / file.name, metadata=metadata or {"format": "pt"})
        del tensors
    weight_index = head_dir / _WEIGHT_INDEX
    if weight_index.is_file():
        data = json.loads(weight_index.read_text())
        data.setdefault("weight_map", {}).update({"d2t": lm_file.name, "t2d": lm_file.name})
        data.get("metadata", {}).pop("total_size", None)  # sizes changed
        (tmp / _WEIGHT_INDEX).write_text(json.dumps(data, indent=2) + "\n")
    new_cfg = dict(cfg)
    new_cfg["draft_vocab_size"] = len(kept)
    (tmp / "config.json").write_text(json.dumps(new_cfg, indent=2) + "\n")
    skip = {"config.json", _WEIGHT_INDEX, "coverage.json", "coverage.md"}
    for item in head_dir.iterdir():
        if item.name in skip or item.suffix == ".safetensors":
            continue
        if item.is_dir():
            shutil.copytree(item, tmp / item.name, symlinks=False)
        else:
            shutil.copy2(item, tmp / item.name)


def _write_coverage(tmp: Path, report: CoverageReport) -> None:
    (tmp / "coverage.json").write_text(report.to_json() + "\n")
    (tmp / "coverage.md").write_text(report.to_markdown())


# --------------------------------------------------------------------------- #
# Entry point                                                                  #
# --------------------------------------------------------------------------- #


def shrink_vocab(
    head_dir: str | Path,
    tokenizer: TokenizerLike,
    corpora: Sequence[str | Path] | str | Path,
    size: int = DEFAULT_SIZE,
    out_dir: str | Path | None = None,
    field: str | None = None,
    *,
    force: bool = False,
    text_unit: str = "line",
    chat_template: Any = None,
    progress: bool | None = None,
    fields_by_file: Mapping[str, str] | None = None,
) -> CoverageReport:
    """Write a ``size``-token EAGLE-3 head to ``out_dir`` (see the module doc).

    ``tokenizer``: the target's tokenizer, any object with ``encode(str) ->
    list[int]`` (what it returns is counted: pass one that adds no BOS),
    ``all_special_ids`` and ``__len__``; ``added_tokens_decoder``,
    ``chat_template`` and ``bos/eos/pad_token_id`` are used when present.
    ``chat_template`` overrides the tokenizer's. ``field`` names the record field of
    every JSON corpus, ``fields_by_file`` (corpus path as given -> field) of single
    ones. Raises :class:`ShrinkVocabError` naming the mismatch; on any error
    ``out_dir`` is left as it was (absent, or the previous directory under ``force``).
    """
    head_dir, out_dir, corpora, (cfg, index, lm_head, vocab) = check_inputs(
        head_dir, corpora, out_dir, force=force, fields_by_file=fields_by_file)
    _check_tokenizer_and_size(tokenizer, vocab, size)
    fields = {str(p): (fields_by_file or {}).get(str(p), field) for p in corpora}
    counted, total = _count_corpora(corpora, tokenizer, vocab, fields=fields,
                                    text_unit=text_unit, progress=progress)
    forced = {t for t in forced_token_ids(tokenizer, cfg, chat_template) if 0 <= t < vocab}
    kept = select_kept_ids(total, forced, size, vocab)
    kept_set = set(kept)
    report = CoverageReport(
        head=str(head_dir), out_dir=str(out_dir), vocab_size=vocab, size=size,
        num_forced=len(forced), num_forced_unseen=sum(1 for t in forced if not total.get(t)),
        num_by_frequency=size - len(forced),
        corpora=[CorpusCoverage(
            path=c.path, records=c.records, skipped_records=c.skipped,
            tokens=sum(c.counts.values()),
            covered_tokens=sum(n for t, n in c.counts.items() if t in kept_set),
            distinct_tokens=len(c.counts)) for c in counted],
        kept_ids=kept)

    def write(tmp: Path) -> None:
        _write_head(head_dir, tmp, cfg, index, lm_head, kept, vocab)
        _write_coverage(tmp, report)

    # the output is the head with fewer lm_head rows: at most the head's size (an estimate
    # for a full disk's message)
    write_directory_atomically(out_dir, write, force=force, exists_error=_exists_error,
                               needed=tree_bytes(head_dir))
    return report


def _exists_error(out_dir: Path) -> ShrinkVocabError:
    return ShrinkVocabError(f"output directory {out_dir} exists (use --force to replace it)",
                            file=out_dir, expected="a new directory, or --force")


def check_inputs(head_dir: str | Path, corpora: Sequence[str | Path] | str | Path,
                 out_dir: str | Path | None, *, force: bool = False,
                 fields_by_file: Mapping[str, str] | None = None,
                 ) -> tuple[Path, Path, list[Path], tuple[dict, TensorIndex, str, int]]:
    """Everything checkable before a tokenizer is loaded or a corpus read: the output
    path (also cleans this tool's stale temporary directories next to it), the head,
    the corpus files' first bytes. Returns ``(head, out, corpora, head contents)``."""
    if out_dir is not None:  # first: a killed run's moved-aside output is restored
        for line in clean_stale(_existing_ancestor(Path(out_dir).parent)):
            print(f"shrink-vocab: {line}", file=sys.stderr)
    head_dir, out_dir, corpora = _check_paths(head_dir, corpora, out_dir, force)
    unknown = sorted(set(fields_by_file or {}) - {str(p) for p in corpora})
    if unknown:
        raise ShrinkVocabError(
            f"--field {unknown[0]}:... names a file that is not a --corpus "
            f"({', '.join(map(str, corpora))})", field="--field",
            expected="FILE:FIELD with FILE given as --corpus")
    head = _read_head(head_dir)
    for path in corpora:
        try:
            sniff_corpus(path)
        except CorpusError as exc:
            raise ShrinkVocabError(str(exc), file=exc.file, expected=exc.expected) from None
    return head_dir, out_dir, corpora, head


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_out_dir(head_dir: Path, out_dir: Path, force: bool) -> None:
    """``out_dir`` can be created (or replaced with ``force``) and is apart from the head."""
    head_r, out_r = head_dir.resolve(), out_dir.resolve()
    if out_r == head_r:
        raise ShrinkVocabError(f"output directory {out_dir} is the input head", file=out_dir)
    if head_r in out_r.parents:
        raise ShrinkVocabError(
            f"output directory {out_dir} is inside the head directory {head_dir}: the head's "
            "files are copied into the output; choose a directory outside it", file=out_dir,
            expected="a directory outside the head")
    if out_r in head_r.parents:
        raise ShrinkVocabError(
            f"output directory {out_dir} contains the head directory {head_dir}: replacing it "
            "would delete the head; choose another directory", file=out_dir,
            expected="a directory that does not contain the head")
    if out_dir.exists() and not out_dir.is_dir():
        raise ShrinkVocabError(f"output {out_dir} exists and is not a directory",
                               file=out_dir, expected="a directory path")
    if out_dir.exists() and not force:
        raise _exists_error(out_dir)
    anc = _existing_ancestor(out_dir.parent)
    if not anc.is_dir():
        raise ShrinkVocabError(
            f"output directory {out_dir} cannot be created: {anc} is a file, not a directory",
            file=out_dir, expected="a path under a directory")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise ShrinkVocabError(f"output directory {out_dir} cannot be created: no write "
                               f"permission in {anc}", file=out_dir,
                               expected="a writable location")


def _check_paths(head_dir: str | Path, corpora: Sequence[str | Path] | str | Path,
                 out_dir: str | Path | None, force: bool) -> tuple[Path, Path, list[Path]]:
    """``(head_dir, out_dir, corpora)`` as paths / a list, or the reason they are refused."""
    if out_dir is None:
        raise ShrinkVocabError("out_dir is required")
    head_dir, out_dir = Path(head_dir), Path(out_dir)
    corpora = [Path(corpora)] if isinstance(corpora, (str, Path)) else [Path(c) for c in corpora]
    if not corpora:
        raise ShrinkVocabError("empty corpus: no corpus file given")
    _check_out_dir(head_dir, out_dir, force)
    return head_dir, out_dir, corpora


def _check_tokenizer_and_size(tokenizer: TokenizerLike, vocab: int, size: int) -> None:
    n_tok = len(tokenizer)
    if n_tok != vocab:
        raise ShrinkVocabError(
            f"tokenizer has {n_tok} tokens (len(tokenizer)) but the head's vocab_size is "
            f"{vocab}: it is not the target's tokenizer")
    if not isinstance(size, int) or size <= 0 or size >= vocab:
        raise ShrinkVocabError(
            f"size must be a positive number smaller than the head's vocab_size {vocab}, "
            f"got {size}")


def _count_corpora(corpora: list[Path], tokenizer: TokenizerLike, vocab: int, *,
                   fields: Mapping[str, str | None], text_unit: str,
                   progress: bool | None) -> tuple[list[_Counted], Counter]:
    """Per-corpus counts and their total; refuses corpora that yield no token."""
    counted = [count_corpus(p, tokenizer.encode, vocab, field=fields.get(str(p)),
                            text_unit=text_unit, progress=progress) for p in corpora]
    total: Counter = Counter()
    for c in counted:
        total.update(c.counts)
    if sum(total.values()) == 0:
        raise ShrinkVocabError(
            "empty corpus: the corpora tokenize to 0 tokens ("
            + ", ".join(c.path for c in counted) + ")")
    return counted, total
