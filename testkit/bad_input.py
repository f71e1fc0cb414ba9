"""Machinery of the table-driven bad-input suite (``tests/unit/test_bad_input.py``).

A :class:`Case` is one thing a user can pass to a command: a ``build`` function that
writes the inputs into a per-case :class:`Workspace` and returns the paths it made,
the command line (``argv``, with ``{name}`` placeholders filled from those paths), the
exit code the contract demands (0 clean, 1 findings, 2 usage / unreadable input) and
the words the output must contain; optionally the doctor finding ``codes`` the
``--json`` report must carry and paths that must be ``absent`` afterwards (nothing
half-written). :func:`run_case` runs it in-process through
:func:`vllm_kimi_ext.cli.main` (or ``entry``, for tools with their own ``main``)
with stdout and stderr captured.

The inputs start from small checkpoints and tokenizers written once per session
(:class:`Bases`, from :mod:`testkit.checkpoints` and friends) and
copied per case; the edit helpers below break them one way each.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["Bases", "Case", "DROP", "Result", "Workspace", "edit_config", "edit_tensors",
           "run_case", "write_safetensors_raw"]

DROP = object()  # edit_config: remove the key


@dataclasses.dataclass(frozen=True)
class Case:
    id: str  # "<tool>/<what is wrong>"
    argv: tuple[str, ...]
    code: int
    words: tuple[str, ...]
    build: Callable[[Workspace], dict[str, str]] = lambda ws: {}
    codes: tuple[str, ...] = ()  # doctor finding codes the --json report must carry
    absent: tuple[str, ...] = ()  # placeholders of paths that must not exist afterwards
    entry: Callable[[list[str]], int] | None = None  # default: vllm_kimi_ext.cli.main

    @property
    def tool(self) -> str:
        return self.id.split("/", 1)[0]


@dataclasses.dataclass
class Result:
    code: int
    out: str
    err: str
    argv: list[str]
    paths: dict[str, str]

    @property
    def text(self) -> str:
        return self.out + self.err


# --------------------------------------------------------------------------- #
# Session fixtures                                                             #
# --------------------------------------------------------------------------- #

TARGET_RANKS = 512  # tokenizer ranks of every base; vocabulary = ranks + 256 specials
TARGET_LAYERS = 6  # default EAGLE-3 taps (2, 3, 3) are in range
REDUCED_VOCAB = 300


def _target_spec():
    from .checkpoints import TinyKimiSpec

    return TinyKimiSpec(num_hidden_layers=TARGET_LAYERS, num_ranks=TARGET_RANKS)


def _write_base(name: str, path: Path) -> None:
    import dataclasses as dc

    from .checkpoints import TinyEagle3Spec, write_tiny_eagle3, write_tiny_kimi_k25
    from .draft_scenarios import write_tiny_dflash
    from .tli_scenarios import write_hf_bytelevel_tokenizer
    from .tokenizers import build_ranks, write_kimi_tokenizer

    spec = _target_spec()
    if name == "target":
        write_tiny_kimi_k25(path, spec)
    elif name == "eagle3":
        write_tiny_eagle3(path, spec)
    elif name == "eagle3-reduced":
        write_tiny_eagle3(path, spec, TinyEagle3Spec(draft_vocab_size=REDUCED_VOCAB))
    elif name == "dflash":
        write_tiny_dflash(path, spec)
    elif name == "mtp":
        write_tiny_kimi_k25(path, dc.replace(spec, num_hidden_layers=2), with_mtp=True)
    elif name == "kimi-tok":
        write_kimi_tokenizer(path, n_ranks=TARGET_RANKS)
    elif name == "hf-tok":
        ranks = build_ranks(TARGET_RANKS)
        write_hf_bytelevel_tokenizer(path, ranks[:400] + [b"zzqx#", b"qqqj#"],
                                     added={402: "<|im_end|>", 403: "<think>"})
    else:
        raise KeyError(f"no base input {name!r}")


class Bases:
    """Inputs written once (lazily) and shared by every case, read-only."""

    def __init__(self, root: Path):
        self.root = root
        self._made: dict[str, Path] = {}

    def get(self, name: str) -> Path:
        if name not in self._made:
            path = self.root / name
            _write_base(name, path)
            self._made[name] = path
        return self._made[name]


class Workspace:
    """One case's scratch directory, the shared :class:`Bases` and pytest's monkeypatch."""

    def __init__(self, tmp: Path, bases: Bases, monkeypatch: Any = None):
        self.tmp, self.bases, self.monkeypatch = tmp, bases, monkeypatch

    def copy(self, base: str, name: str | None = None) -> Path:
        dest = self.tmp / (name or base)
        shutil.copytree(self.bases.get(base), dest)
        return dest

    def base(self, name: str) -> Path:
        """A shared base, not to be modified."""
        return self.bases.get(name)

    def write(self, name: str, content: str | bytes) -> Path:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        return path


# --------------------------------------------------------------------------- #
# Breaking inputs                                                              #
# --------------------------------------------------------------------------- #


def edit_config(directory: Path, file: str = "config.json", **changes: Any) -> None:
    """Set (or, with :data:`DROP`, remove) config keys; a dotted key reaches into a
    sub-object (``**{"dflash_config.mask_token_id": DROP}``)."""
    path = directory / file
    cfg = json.loads(path.read_text())
    for key, value in changes.items():
        *parents, leaf = key.split(".")
        node = cfg
        for p in parents:
            node = node.setdefault(p, {})
        if value is DROP:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    path.write_text(json.dumps(cfg))


def edit_tensors(directory: Path, drop: tuple[str, ...] = (), **replace: Any) -> None:
    """Rewrite ``model.safetensors`` without ``drop`` and with ``replace`` (name ->
    tensor, or a function of the current tensor)."""
    from safetensors.torch import load_file, save_file

    path = directory / "model.safetensors"
    tensors = load_file(path)
    for name in drop:
        del tensors[name]
    for name, value in replace.items():
        tensors[name] = value(tensors[name]) if callable(value) else value
    save_file(tensors, path, metadata={"format": "pt"})


def write_safetensors_raw(path: Path, header: Any, data: bytes = b"",
                          header_len: int | None = None) -> Path:
    """A safetensors-shaped file with exactly this header (any JSON, or raw bytes)."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(raw) if header_len is None else header_len
    path.write_bytes(n.to_bytes(8, "little") + raw + data)
    return path


# --------------------------------------------------------------------------- #
# Running                                                                      #
# --------------------------------------------------------------------------- #


def run_case(case: Case, ws: Workspace) -> Result:
    from vllm_kimi_ext.cli import main

    paths = {k: str(v) for k, v in case.build(ws).items()}
    argv = [a.format(**paths) for a in case.argv]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = (case.entry or main)(argv)
    return Result(code, out.getvalue(), err.getvalue(), argv, paths)
