"""The training-data directory: regenerated samples, hidden-state shards, manifest.

::

    DATA/
      samples.jsonl              one record per request: messages, the served prompt's
                                 token ids, the response's token ids, source, prompt hash
      hidden_states/hs_<i>.safetensors
                                 ``hidden_states`` [tokens, layers, hidden] (the aux
                                 layers, then the last layer), ``token_ids`` [tokens]:
                                 the format vLLM's ExampleHiddenStatesConnector writes
                                 and speculators' offline training reads
      manifest.json              target, generation and capture settings, layer ids,
                                 dtype, one entry per captured sample (prompt hash,
                                 shape, file)

A sample's token sequence is ``prompt_token_ids + output_token_ids``; the loss
covers the output tokens only. Every file is written to a temporary name and
renamed, so an interrupted run leaves only complete files and resumes where it
stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from vllm_kimi_ext.user_input import UserInputError, disk_full_refusal

FORMAT = "vllm-kimi-ext-draft-data/1"
SAMPLES = "samples.jsonl"
MANIFEST = "manifest.json"
HIDDEN_DIR = "hidden_states"
#: One line per shard written (index, file, bytes, sha256), appended as each shard lands:
#: the record of a run that was stopped before it wrote the manifest.
SHARD_LOG = "shards.jsonl"


class DataError(UserInputError):
    """Unreadable or inconsistent training data (one line, names the file)."""


def prompt_hash(messages: list[dict], chat_template_kwargs: dict | None = None) -> str:
    """Stable id of a request: sha256 of its messages and template arguments."""
    blob = json.dumps({"messages": messages, "chat_template_kwargs": chat_template_kwargs or {}},
                      sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:24]


@dataclasses.dataclass
class Sample:
    """One request to the target and what it answered."""

    index: int
    prompt_hash: str
    source: str
    messages: list[dict]
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    response: str = ""
    reasoning: str | None = None
    finish_reason: str | None = None
    #: a multi-turn record: the id of the conversation (hash of its user turns), and
    #: the ``[start, end)`` ranges of ``input_ids`` the loss covers: every assistant
    #: turn as the history renders it, and the last response. None: one turn, the
    #: loss covers the response.
    conversation: str | None = None
    loss_spans: list[list[int]] | None = None
    #: a sample read without its token ids (:func:`read_samples` ``tokens=False``):
    #: (prompt, response) lengths and the byte offset of its line in samples.jsonl
    lengths: tuple[int, int] | None = dataclasses.field(default=None, repr=False,
                                                        compare=False)
    offset: int | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids) if self.lengths is None else self.lengths[0]

    @property
    def output_len(self) -> int:
        return len(self.output_token_ids) if self.lengths is None else self.lengths[1]

    @property
    def input_ids(self) -> list[int]:
        if self.lengths is not None:
            raise RuntimeError(f"sample {self.index} was read without its token ids "
                               "(layout.with_tokens reads them)")
        return list(self.prompt_token_ids) + list(self.output_token_ids)

    @property
    def loss_mask(self) -> list[int]:
        if self.loss_spans is None:
            return [0] * self.prompt_len + [1] * self.output_len
        mask = [0] * self.num_tokens
        for a, b in self.loss_spans:
            mask[a:b] = [1] * (b - a)
        return mask

    @property
    def num_loss_tokens(self) -> int:
        if self.loss_spans is None:
            return self.output_len
        return sum(b - a for a, b in self.loss_spans)

    def loss_tokens_after(self, position: int) -> int:
        """Loss tokens at ``position`` or later (what a cut there drops)."""
        if self.loss_spans is None:
            return min(self.output_len, max(0, self.num_tokens - position))
        return sum(max(0, b - max(a, position)) for a, b in self.loss_spans)

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.output_len

    def to_json(self) -> str:
        rec = dataclasses.asdict(self)
        del rec["lengths"], rec["offset"]
        for key in ("conversation", "loss_spans"):  # single-turn records stay as they were
            if rec[key] is None:
                del rec[key]
        return json.dumps(rec, ensure_ascii=False)

    @classmethod
    def from_dict(cls, rec: dict, where: str) -> Sample:
        names = {f.name for f in dataclasses.fields(cls)} - {"lengths", "offset"}
        missing = [n for n in ("index", "prompt_hash", "prompt_token_ids", "output_token_ids")
                   if n not in rec]
        if missing:
            raise DataError(f"{where}: field(s) {', '.join(missing)} missing")
        rec = {k: v for k, v in rec.items() if k in names}
        if (isinstance(rec["index"], bool) or not isinstance(rec["index"], int)
                or rec["index"] < 0):
            raise DataError(f"{where}: field 'index' is {rec['index']!r}, expected an "
                            "integer >= 0")
        for name in ("prompt_token_ids", "output_token_ids"):
            problem = token_ids_problem(rec[name])
            if problem:
                raise DataError(f"{where}: field {name!r} {problem}")
        rec.setdefault("source", "")
        rec.setdefault("messages", [])
        sample = cls(**rec)
        if sample.loss_spans is not None:
            n = sample.num_tokens
            if not isinstance(sample.loss_spans, list) or not all(
                    isinstance(sp, list) and len(sp) == 2 and all(type(x) is int for x in sp)
                    and 0 <= sp[0] <= sp[1] <= n for sp in sample.loss_spans):
                raise DataError(f"{where}: field loss_spans must be [start, end] pairs "
                                f"inside the sample's {n} tokens")
        return sample


def token_ids_problem(ids: Any, vocab_size: int | None = None) -> str | None:
    """What is wrong with a list of token ids (``None``: nothing): a list of ints in
    ``[0, vocab_size)`` (or below 2**22 when the vocabulary is not known)."""
    from vllm_kimi_ext.user_input import MAX_VOCAB_SIZE

    if not isinstance(ids, list):
        return f"is a {type(ids).__name__}, expected a list of token ids"
    limit = vocab_size or MAX_VOCAB_SIZE
    for pos, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int):
            return f"item {pos} is {t!r}, expected an integer token id"
        if not 0 <= t < limit:
            return f"item {pos} is {t}, expected a token id in [0, {limit})"
    return None


def hidden_path(data_dir: str | Path, index: int) -> Path:
    return Path(data_dir) / HIDDEN_DIR / f"hs_{index}.safetensors"


def _lines(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """``(line number, byte offset, line)`` of the non-blank lines, read as a stream."""
    with open(path, "rb") as fh:
        offset = 0
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                yield lineno, offset, line
            offset += len(line)


def iter_samples(data_dir: str | Path, *, tokens: bool = True) -> Iterator[Sample]:
    """The samples of ``data_dir/samples.jsonl`` in file order, one line at a time.
    ``tokens=False``: without their token ids (lengths and the line's offset kept;
    :func:`with_tokens` reads them back), so a whole data set's metadata fits in
    memory. A torn last line (an interrupted run) is dropped; any other bad line is
    refused."""
    path = Path(data_dir) / SAMPLES
    if not path.is_file():
        raise DataError(f"{path}: no such file (run `vllm-kimi-ext draft regenerate` first)")
    torn = None
    for lineno, offset, line in _lines(path):
        if torn is not None:
            raise DataError(f"{path}:{torn[0]}: not valid JSON ({torn[1]})")
        try:
            rec = json.loads(line)
        except ValueError as exc:
            torn = (lineno, exc)
            continue
        sample = Sample.from_dict(rec, f"{path}:{lineno}")
        if not tokens:
            sample.lengths = (len(sample.prompt_token_ids), len(sample.output_token_ids))
            sample.offset = offset
            sample.prompt_token_ids = sample.output_token_ids = []
            sample.messages = []
        yield sample


def read_samples(data_dir: str | Path, *, tokens: bool = True) -> list[Sample]:
    """Every sample of ``data_dir/samples.jsonl`` (in index order); see
    :func:`iter_samples`. Readers of a large set pass ``tokens=False``."""
    out = sorted(iter_samples(data_dir, tokens=tokens), key=lambda s: s.index)
    if len({s.index for s in out}) != len(out):
        raise DataError(f"{Path(data_dir) / SAMPLES}: duplicate sample index")
    return out


def with_tokens(data_dir: str | Path, sample: Sample) -> Sample:
    """``sample`` with its token ids (read from its line when it was read without)."""
    if sample.lengths is None:
        return sample
    path = Path(data_dir) / SAMPLES
    with open(path, "rb") as fh:
        fh.seek(sample.offset)
        line = fh.readline()
    try:
        full = Sample.from_dict(json.loads(line), f"{path}@{sample.offset}")
    except ValueError as exc:
        raise DataError(f"{path}: the line of sample {sample.index} changed ({exc})") from None
    if full.index != sample.index or full.num_tokens != sample.num_tokens:
        raise DataError(f"{path}: the line of sample {sample.index} changed while in use")
    return full


def append_samples(data_dir: str | Path, samples: Iterable[Sample]) -> None:
    """Append samples to ``samples.jsonl`` (one flushed line each). A full disk cuts the
    file back to its last whole line and refuses (:class:`DiskFullError`)."""
    path = Path(data_dir) / SAMPLES
    path.parent.mkdir(parents=True, exist_ok=True)
    _drop_torn_tail(path)
    good = path.stat().st_size if path.exists() else 0
    lines = [(s.to_json() + "\n").encode("utf-8") for s in samples]
    try:
        with (disk_full_refusal(path, sum(map(len, lines)), what="appending samples"),
              open(path, "ab") as fh):
            for line in lines:
                fh.write(line)
                fh.flush()
                good = fh.tell()
    except BaseException:
        with contextlib.suppress(OSError), open(path, "r+b") as fh:
            fh.truncate(good)  # nothing half-written: the last whole line ends the file
        raise


def _drop_torn_tail(path: Path) -> None:
    """Cut a last line without its newline (an interrupted write) before appending."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    with open(path, "r+b") as fh:
        fh.truncate(data.rfind(b"\n") + 1)


def write_json_atomic(path: str | Path, obj: Any) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    text = json.dumps(obj, indent=1, ensure_ascii=False) + "\n"
    with disk_full_refusal(path, len(text.encode()), cleanup=[tmp]):
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)


def read_manifest(data_dir: str | Path) -> dict:
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        return {}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise DataError(f"{path}: holds a JSON {type(manifest).__name__}, expected an object",
                        file=str(path))
    if manifest.get("format") != FORMAT:
        raise DataError(f"{path}: field 'format' is {manifest.get('format')!r}, expected "
                        f"{FORMAT!r}")
    for key in ("generation", "capture"):
        if manifest.get(key) is not None and not isinstance(manifest[key], dict):
            _bad_field(path, key, manifest[key], "an object")
    if manifest.get("capture"):
        _check_capture_section(manifest["capture"], path)
    return manifest


def _bad_field(path: Path, field: str, value: Any, expected: str) -> None:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise DataError(f"{path}: field {field!r} is {shown}, expected {expected} (edited or "
                    "damaged; run `draft capture` again on a new --data)", file=str(path),
                    field=field, expected=expected)


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _check_capture_section(cap: dict, path: Path) -> None:
    """The capture section's fields that readers use, where present, have their types:
    layer ids ascending integers (the aux ids the same without the last), a hidden size
    >= 1, shard entries objects with an integer index, size and a sha256 string."""
    for key in ("layer_ids", "aux_layer_ids"):
        ids = cap.get(key)
        if ids is not None and (not isinstance(ids, list) or not all(map(_is_count, ids))
                                or ids != sorted(set(ids))):
            _bad_field(path, f"capture.{key}", ids, "ascending layer ids (integers >= 0)")
    ids = cap.get("layer_ids")
    if ids is not None and len(ids) < 2:
        _bad_field(path, "capture.layer_ids", ids, "at least 2 ids (aux layers, then the last)")
    if ids is not None and cap.get("aux_layer_ids") not in (None, ids[:-1]):
        _bad_field(path, "capture.aux_layer_ids", cap["aux_layer_ids"],
                   f"{ids[:-1]} (layer_ids without the last)")
    hidden = cap.get("hidden_size")
    if hidden is not None and (not _is_count(hidden) or hidden < 1):
        _bad_field(path, "capture.hidden_size", hidden, "an integer >= 1")
    entries = cap.get("samples")
    if entries is not None and not isinstance(entries, list):
        _bad_field(path, "capture.samples", entries, "a list of shard entries")
    for pos, entry in enumerate(entries or []):
        where = f"capture.samples[{pos}]"
        if not isinstance(entry, dict) or not _is_count(entry.get("index")):
            _bad_field(path, where, entry, "an object with an integer 'index' >= 0")
        if "bytes" in entry and not _is_count(entry["bytes"]):
            _bad_field(path, f"{where}.bytes", entry["bytes"], "an integer >= 0")
        if "sha256" in entry and not isinstance(entry["sha256"], str):
            _bad_field(path, f"{where}.sha256", entry["sha256"], "a hex string")


@contextlib.contextmanager
def manifest_lock(data_dir: str | Path) -> Iterator[None]:
    """An exclusive lock on the data directory's manifest (processes capturing shards
    of one directory update it in turn)."""
    import fcntl

    with open(Path(data_dir) / ".manifest.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def update_manifest(data_dir: str | Path, **sections: Any) -> dict:
    """Merge ``sections`` into the manifest (created if absent) and write it."""
    manifest = read_manifest(data_dir) or {"format": FORMAT}
    manifest.update(sections)
    write_json_atomic(Path(data_dir) / MANIFEST, manifest)
    return manifest


def safetensors_shapes(path: str | Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (dtype, shape)}`` from a safetensors header, or ``{}`` if unreadable
    (a file torn by an interrupted run counts as absent)."""
    from vllm_kimi_ext.checkpoints.safetensors_headers import read_safetensors_header

    try:
        return read_safetensors_header(path)
    except (OSError, ValueError):
        return {}


def captured(data_dir: str | Path, sample: Sample, num_layers: int,
             hidden_size: int) -> bool:
    """Is the sample's shard present, complete and of the expected shape?"""
    header = safetensors_shapes(hidden_path(data_dir, sample.index))
    hs = header.get("hidden_states")
    ids = header.get("token_ids")
    if not hs or not ids:
        return False
    expected = (sample.num_tokens, num_layers, hidden_size)
    return tuple(hs[1]) == expected and tuple(ids[1]) == (sample.num_tokens,)


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 23), b""):
            h.update(block)
    return h.hexdigest()


def shard_record(data_dir: str | Path, index: int) -> dict:
    """``{"index", "file", "bytes", "sha256", "shape", "finite"}`` of the shard on disk
    now: its size and checksum, the ``hidden_states`` shape and whether every value is
    finite (what train and eval check up front, without reading the shard again)."""
    path = hidden_path(data_dir, index)
    shape = (safetensors_shapes(path).get("hidden_states") or (None, None))[1]
    return {"index": index, "file": str(path.relative_to(data_dir)),
            "bytes": path.stat().st_size, "sha256": file_sha256(path),
            "shape": list(shape) if shape is not None else None,
            "finite": shard_is_finite(path)}


def shard_is_finite(path: str | Path, rows: int = 4096) -> bool:
    """Are all of a shard's hidden states finite? Read ``rows`` tokens at a time (a
    Kimi-scale shard is ~1 GB)."""
    import torch
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        sl = fh.get_slice("hidden_states")
        n = sl.get_shape()[0]
        return all(bool(torch.isfinite(sl[a:a + rows]).all()) for a in range(0, n, rows))


#: Bad shards a refusal names one by one before it only counts the rest.
NAMED_BAD_SHARDS = 20


def shard_problem(data_dir: str | Path, sample: Sample, num_layers: int, hidden_size: int,
                  record: dict | None, *, rehash: bool = False) -> str | None:
    """What is wrong with ``sample``'s shard against its capture record (``None``:
    nothing; a sample without shard and record is "not captured", not a problem):
    unreadable header, wrong shape, size or (``rehash``) checksum other than recorded,
    non-finite values as recorded (or, ``rehash``, as read now)."""
    path = hidden_path(data_dir, sample.index)
    if not path.is_file():
        return "recorded by capture but missing" if record else None
    header = safetensors_shapes(path)
    hs, ids = header.get("hidden_states"), header.get("token_ids")
    if not hs or not ids:
        return "unreadable safetensors header (a torn or foreign file)"
    want = (sample.num_tokens, num_layers, hidden_size)
    if tuple(hs[1]) != want or tuple(ids[1]) != (sample.num_tokens,):
        return f"hidden_states shape {list(hs[1])}, expected {list(want)}"
    if not record:
        return "not in the capture records (an interrupted capture; run it again)"
    size = path.stat().st_size
    if size != record.get("bytes"):
        return f"{size} bytes, recorded {record.get('bytes')}"
    if record.get("finite") is False:
        return "holds NaN or infinite values (recorded by capture)"
    if rehash:
        if file_sha256(path) != record.get("sha256"):
            return "sha256 differs from the recorded one (rewritten since capture)"
        if not shard_is_finite(path):
            return "holds NaN or infinite values"
    return None


def check_shards(data_dir: str | Path, samples: list[Sample], num_layers: int,
                 hidden_size: int, *, rehash: bool = False, flag: str = "--data"
                 ) -> tuple[list[Sample], list[Sample]]:
    """``(captured, not_captured)``: every shard checked against the capture records
    before any work (:func:`shard_problem`); any bad shard refuses the whole set, naming
    the first :data:`NAMED_BAD_SHARDS` and counting the rest."""
    records = shard_records(data_dir)
    bad, have, missing = [], [], []
    for s in samples:
        problem = shard_problem(data_dir, s, num_layers, hidden_size, records.get(s.index),
                                rehash=rehash)
        if problem:
            bad.append(f"{hidden_path(data_dir, s.index).name}: {problem}")
        elif hidden_path(data_dir, s.index).is_file():
            have.append(s)
        else:
            missing.append(s)
    if bad:
        more = len(bad) - NAMED_BAD_SHARDS
        raise DataError(
            f"{flag} {data_dir}: {len(bad)} bad hidden-state shard(s) in {HIDDEN_DIR}/: "
            + "; ".join(bad[:NAMED_BAD_SHARDS]) + (f"; and {more} more" if more > 0 else "")
            + " (run `draft capture` again: it rewrites every shard that differs from its "
            "record or holds non-finite values)",
            file=str(Path(data_dir) / HIDDEN_DIR), field=flag)
    return have, missing


def content_digest(data_dir: str | Path, samples: list[Sample]) -> str:
    """The identity of the training data, independent of where it lies: each sample's
    prompt hash, length and recorded shard sha256 (a moved folder keeps it, rewritten
    contents change it)."""
    records = shard_records(data_dir)
    rows = [[s.prompt_hash, s.num_tokens, (records.get(s.index) or {}).get("sha256")]
            for s in samples]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def append_shard_records(data_dir: str | Path, records: Iterable[dict]) -> None:
    path = Path(data_dir) / HIDDEN_DIR / SHARD_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    _drop_torn_tail(path)
    with open(path, "a", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def shard_records(data_dir: str | Path) -> dict[int, dict]:
    """The recorded size and checksum of every shard: the manifest's capture entries,
    then the shard log (a later line wins: the shard was written again)."""
    out: dict[int, dict] = {}
    for entry in (read_manifest(data_dir).get("capture") or {}).get("samples") or []:
        if "sha256" in entry and "bytes" in entry:  # types checked by read_manifest
            out[entry["index"]] = entry
    log = Path(data_dir) / HIDDEN_DIR / SHARD_LOG
    if log.is_file():
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
                out[int(rec["index"])] = rec
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line: that shard counts as unrecorded
    return out


def shard_matches(data_dir: str | Path, index: int, record: dict | None) -> bool:
    """Is shard ``index`` on disk the one recorded (same size, same sha256)?"""
    path = hidden_path(data_dir, index)
    if not record or not path.is_file():
        return False
    try:
        if path.stat().st_size != record.get("bytes"):
            return False
        return file_sha256(path) == record.get("sha256")
    except OSError:
        return False


def iter_training_records(data_dir: str | Path, samples: list[Sample] | None = None
                          ) -> Iterator[tuple[Sample, dict]]:
    """``(sample, {"hidden_states", "token_ids"})`` for each captured sample; refuses a
    shard whose token ids differ from the sample's."""
    import torch
    from safetensors.torch import load_file

    for s in samples if samples is not None else read_samples(data_dir):
        path = hidden_path(data_dir, s.index)
        if not path.is_file():
            continue
        tensors = load_file(str(path))
        if tensors["token_ids"].tolist() != s.input_ids:
            raise DataError(f"{path}: token_ids differ from sample {s.index} of {SAMPLES}")
        tensors["token_ids"] = tensors["token_ids"].to(torch.long)
        yield s, tensors
