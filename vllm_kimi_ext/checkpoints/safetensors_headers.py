"""Safetensors files read from their headers only, and checked the way the loader checks them.

A safetensors file is an 8-byte little-endian header length ``N``, ``N`` bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [start, end]}, "__metadata__": {...}}``)
and the tensor data, back to back. The safetensors loader refuses a file whose
offsets leave gaps or overlap, whose byte ranges disagree with dtype x shape, or whose
size is not exactly ``8 + N + last end`` ("incomplete metadata, file not fully
covered"): a truncated download fails only when the model is loaded.
:func:`read_header` applies the same rules without reading any tensor, so the draft
doctor and ``shrink-vocab`` name the file and the tensor before anything is served or
written.

Standard library only (plus :mod:`vllm_kimi_ext.user_input`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from pathlib import Path

from vllm_kimi_ext.user_input import UserInputError

__all__ = [
    "WEIGHT_INDEX",
    "SafetensorsHeader",
    "SafetensorsHeaderError",
    "TensorEntry",
    "TensorIndex",
    "WeightProblem",
    "read_header",
    "read_safetensors_header",
    "scan_weights",
]

WEIGHT_INDEX = "model.safetensors.index.json"
#: Bits per element of the dtypes safetensors defines (sub-byte floats included).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E4M3FNUZ": 8, "F8_E5M2": 8,
    "F8_E5M2FNUZ": 8, "F8_E8M0": 8, "E8M0": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "U16": 16, "I16": 16, "F16": 16, "BF16": 16, "U32": 32, "I32": 32, "F32": 32,
    "U64": 64, "I64": 64, "F64": 64, "C64": 64,
}
_MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors loader's own limit
_INT_FORMATS = {"I64": "q", "I32": "i", "I16": "h", "I8": "b", "U8": "B", "BOOL": "?"}
#: Float dtypes -> (bytes per element, exponent mask): an IEEE value is NaN or infinite
#: exactly when all its exponent bits are set (F8_E4M3 has no infinity; its NaN sets
#: exponent and mantissa, the 7 low bits). The FNUZ formats (NaN = 0x80) are not listed.
_NON_FINITE_MASKS = {"F16": (2, 0x7C00), "BF16": (2, 0x7F80), "F32": (4, 0x7F800000),
                     "F64": (8, 0x7FF0000000000000), "F8_E5M2": (1, 0x7C), "F8_E4M3": (1, 0x7F)}


class SafetensorsHeaderError(UserInputError):
    """A safetensors file whose header the loader would refuse (names file and tensor)."""


@dataclasses.dataclass(frozen=True)
class TensorEntry:
    dtype: str
    shape: tuple[int, ...]
    file: Path
    start: int  # data_offsets, relative to the end of the header
    end: int


@dataclasses.dataclass(frozen=True)
class SafetensorsHeader:
    path: Path
    header_len: int
    entries: dict[str, TensorEntry]
    file_size: int

    @property
    def expected_size(self) -> int:
        """The exact file size the data offsets require."""
        return 8 + self.header_len + max((e.end for e in self.entries.values()), default=0)


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry(path: Path, name: str, meta) -> TensorEntry:
    """One header entry, validated (dtype, shape, offsets, byte count)."""

    def bad(what: str) -> SafetensorsHeaderError:
        return SafetensorsHeaderError(f"{path}: tensor {name!r}: {what}", file=path, field=name,
                                      expected="a valid safetensors header entry")

    if not isinstance(meta, dict):
        raise bad(f"header entry is {type(meta).__name__}, expected an object")
    dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
    if not isinstance(dtype, str):
        raise bad(f"dtype {dtype!r} is not a dtype name")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise bad(f"shape {shape!r} is not a list of non-negative integers")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(_is_count(o) for o in offsets) or offsets[0] > offsets[1]):
        raise bad(f"data_offsets {offsets!r} is not [start, end] with 0 <= start <= end")
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        raise bad(f"dtype {dtype!r} is not a safetensors dtype "
                  f"({', '.join(sorted(DTYPE_BITS))})")
    nbytes = (math.prod(shape) * bits + 7) // 8
    if offsets[1] - offsets[0] != nbytes:
        raise bad(f"data_offsets {offsets} span {offsets[1] - offsets[0]} bytes but "
                  f"{dtype} x {shape} needs {nbytes}")
    return TensorEntry(dtype, tuple(shape), path, offsets[0], offsets[1])


def _check_contiguous(path: Path, entries: dict[str, TensorEntry]) -> None:
    """The loader's rule: sorted by offset, tensors start where the previous one ended."""
    end = 0
    for name, e in sorted(entries.items(), key=lambda kv: (kv[1].start, kv[1].end)):
        if e.start != end:
            gap = "overlaps the previous tensor" if e.start < end else "leaves a gap"
            raise SafetensorsHeaderError(
                f"{path}: tensor {name!r}: data_offsets [{e.start}, {e.end}] {gap} (the "
                f"previous tensor ends at {end}; safetensors stores tensors back to back)",
                file=path, field=name, expected="contiguous data_offsets")
        end = e.end


def read_header(path: str | Path) -> SafetensorsHeader:
    """The validated header of one safetensors file (raises :class:`SafetensorsHeaderError`
    naming the file and tensor; ``OSError`` if it cannot be opened)."""
    path = Path(path)
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        raw_len = fh.read(8)
        if len(raw_len) != 8:
            raise SafetensorsHeaderError(
                f"{path}: not a safetensors file ({size} bytes, shorter than the 8-byte "
                "header length)", file=path, expected="a safetensors file")
        (hlen,) = struct.unpack("<Q", raw_len)
        if hlen > _MAX_HEADER_BYTES or hlen > size - 8:
            raise SafetensorsHeaderError(
                f"{path}: header length {hlen} does not fit the file's {size} bytes "
                "(truncated, or not a safetensors file)", file=path,
                expected="a header length within the file")
        raw = fh.read(hlen)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SafetensorsHeaderError(f"{path}: header is not JSON ({exc})", file=path,
                                     expected="a JSON header") from None
    if not isinstance(header, dict):
        raise SafetensorsHeaderError(f"{path}: header is {type(header).__name__}, expected "
                                     "a JSON object", file=path, expected="a JSON object")
    meta = header.get("__metadata__")
    if meta is not None and not isinstance(meta, dict):
        raise SafetensorsHeaderError(f"{path}: __metadata__ is {type(meta).__name__}, "
                                     "expected an object", file=path, field="__metadata__")
    entries = {name: _entry(path, name, m) for name, m in header.items()
               if name != "__metadata__"}
    _check_contiguous(path, entries)
    return SafetensorsHeader(path, hlen, entries, size)


def read_safetensors_header(path: str | Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (dtype, shape)}`` from a safetensors file's header."""
    return {n: (e.dtype, e.shape) for n, e in read_header(path).entries.items()}


# --------------------------------------------------------------------------- #
# A directory of weights                                                       #
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class WeightProblem:
    kind: str  # "missing" | "index" | "header" | "size"
    file: str
    message: str


def _size_problem(h: SafetensorsHeader) -> WeightProblem | None:
    if h.file_size == h.expected_size:
        return None
    how = "truncated" if h.file_size < h.expected_size else "longer than its header says"
    return WeightProblem("size", str(h.path), (
        f"{h.path} is {h.file_size} bytes but its header's data offsets need exactly "
        f"{h.expected_size} ({how}; the safetensors loader refuses it: re-download or "
        "re-export the file)"))


def _index_problems(directory: Path) -> list[WeightProblem]:
    """``model.safetensors.index.json``: readable, and every file it names present."""
    index = directory / WEIGHT_INDEX
    if not index.is_file():
        return []
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return [WeightProblem("index", str(index), f"{index} is not valid JSON ({exc})")]
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str)
                                                   for v in weight_map.values()):
        return [WeightProblem("index", str(index), (
            f"{index}: weight_map is missing or not an object of tensor name -> file name"))]
    missing = sorted({f for f in weight_map.values() if not (directory / f).is_file()})
    if missing:
        return [WeightProblem("missing", str(index), (
            f"{index} names {len(missing)} weight file(s) that are absent: "
            f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"))]
    return []


def scan_weights(directory: str | Path) -> tuple[TensorIndex, list[WeightProblem]]:
    """Every ``*.safetensors`` file of ``directory`` indexed; what is wrong with them
    listed (no file, unreadable headers, sizes that disagree with their headers, an
    index naming absent files) instead of raised."""
    directory = Path(directory)
    entries: dict[str, TensorEntry] = {}
    problems = _index_problems(directory)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        others = sorted(p.name for p in directory.glob("*")
                        if p.suffix in (".bin", ".pt", ".pth", ".gguf"))
        found = (f" (found {', '.join(others[:3])}: the checks read safetensors headers only)"
            if others else "")
        problems.append(WeightProblem("missing", str(directory), (
            f"{directory} has no *.safetensors weight file{found}")))
    for file in files:
        try:
            header = read_header(file)
        except SafetensorsHeaderError as exc:
            problems.append(WeightProblem("header", str(file), str(exc)))
            continue
        except OSError as exc:
            problems.append(WeightProblem("header", str(file), f"{file}: cannot read ({exc})"))
            continue
        size = _size_problem(header)
        if size is not None:
            problems.append(size)
        entries.update(header.entries)
    return TensorIndex(entries), problems


class TensorIndex:
    """Tensor names, dtypes and shapes of a directory's ``*.safetensors`` files,
    read from their headers only."""

    def __init__(self, entries: dict[str, TensorEntry] | None = None):
        self.entries = entries or {}

    @classmethod
    def from_dir(cls, path: str | Path) -> TensorIndex:
        """The index; raises :class:`SafetensorsHeaderError` for the first problem
        :func:`scan_weights` finds (a missing file, a bad header, a wrong size)."""
        index, problems = scan_weights(path)
        if problems:
            p = problems[0]
            raise SafetensorsHeaderError(p.message, file=p.file,
                                         expected="complete safetensors weight files")
        return index

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def names(self) -> list[str]:
        return list(self.entries)

    def shape(self, name: str) -> tuple[int, ...] | None:
        entry = self.entries.get(name)
        return entry.shape if entry else None

    def dtype(self, name: str) -> str | None:
        entry = self.entries.get(name)
        return entry.dtype if entry else None

    def file(self, name: str) -> Path:
        return self.entries[name].file

    def find(self, suffix: str) -> str | None:
        """The one tensor named ``suffix`` or ending in ``.suffix``."""
        if suffix in self.entries:
            return suffix
        hits = [n for n in self.entries if n.endswith("." + suffix)]
        return hits[0] if len(hits) == 1 else None

    def first_non_finite(self, name: str, chunk_elements: int = 1 << 24) -> int | None:
        """The flat index of the first NaN or infinite element of a float tensor, or
        ``None`` (also for non-float dtypes); read in chunks, bit patterns only."""
        import numpy as np

        e = self.entries[name]
        spec = _NON_FINITE_MASKS.get(e.dtype)
        if spec is None:
            return None
        size, mask = spec
        utype = np.dtype({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[size])
        utype = utype.newbyteorder("<")
        done, remaining = 0, e.end - e.start
        with open(e.file, "rb") as fh:
            (hlen,) = struct.unpack("<Q", fh.read(8))
            fh.seek(8 + hlen + e.start)
            while remaining > 0:
                raw = fh.read(min(remaining, chunk_elements * size))
                if not raw or len(raw) % size:
                    raise ValueError(f"{e.file}: {name} is truncated")
                values = np.frombuffer(raw, dtype=utype)
                hits = np.flatnonzero((values & utype.type(mask)) == mask)
                if hits.size:
                    return done + int(hits[0])
                done += values.size
                remaining -= len(raw)
        return None

    def read_ints(self, name: str) -> list[int]:
        """The values of a small integer or bool tensor (``d2t``, ``t2d``)."""
        e = self.entries[name]
        fmt = _INT_FORMATS.get(e.dtype)
        if fmt is None:
            raise ValueError(f"{name} has dtype {e.dtype}, expected an integer type")
        with open(e.file, "rb") as fh:
            (hlen,) = struct.unpack("<Q", fh.read(8))
            fh.seek(8 + hlen + e.start)
            raw = fh.read(e.end - e.start)
        if len(raw) != e.end - e.start:
            raise ValueError(f"{e.file}: {name} is truncated")
        return [int(v) for v in struct.unpack(f"<{len(raw) // struct.calcsize(fmt)}{fmt}", raw)]
