"""What a command-line user can get wrong, and the exit codes every command shares.

Every ``vllm-kimi-ext`` command follows one contract (:data:`EXIT_CODES_HELP`):

- ``0`` clean: the inputs were checked (or the output written) and nothing is wrong;
- ``1`` findings: the inputs were read and are wrong for serving (the command's
  report says why);
- ``2`` no verdict: a usage error, an input that cannot be read, or an unexpected
  internal error. One line on stderr names the file, the field and what was expected;
  ``--debug`` adds the traceback.

A reader or checker raises :class:`UserInputError` (or a subclass) for anything a user
can pass; :func:`vllm_kimi_ext.cli.main` turns it into that one line and exit 2.
The argparse ``type=`` helpers here refuse NaN, infinities and out-of-range numbers
while the arguments are parsed, before any work starts.

Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = [
    "EXIT_CODES_HELP",
    "EXIT_FINDINGS",
    "EXIT_OK",
    "EXIT_USAGE",
    "MAX_VOCAB_SIZE",
    "DiskFullError",
    "UsageError",
    "UserInputError",
    "bounded_float",
    "bounded_int",
    "check_free_space",
    "disk_full_refusal",
    "human_bytes",
    "integer",
    "is_no_space",
    "no_space_message",
    "number",
    "one_line",
    "tree_bytes",
]

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2

#: The largest vocabulary (and so token id + 1) any input may declare: 2**22 ids is 16x
#: Kimi-K2.5's 163840 and above every public tokenizer; more is a typo or a broken file,
#: refused before any table of that size is built.
MAX_VOCAB_SIZE = 1 << 22

EXIT_CODES_HELP = (
    "exit codes: 0 clean (checked, nothing wrong / output written); "
    "1 findings (the inputs are wrong for serving; the report says why); "
    "2 usage error, unreadable input or internal error (one line on stderr; "
    "--debug shows the traceback)"
)


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) made one space."""
    return " ".join(str(text).split())


def one_line_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make ``parser`` report a usage error as one line (``PROG: error: REASON``, exit 2)
    instead of argparse's usage dump, which would bury the reason."""
    import sys

    def error(message: str):
        print(f"{parser.prog}: error: {one_line(message)}", file=sys.stderr)
        sys.exit(EXIT_USAGE)

    parser.error = error
    return parser


class UserInputError(ValueError):
    """An input a user passed is missing, unreadable or malformed.

    ``file`` and ``field`` say where (either may be None), ``expected`` what a valid
    value looks like. The message is complete on its own (it should name all three);
    the attributes are for programs (``--json`` output, tests).
    """

    def __init__(self, message: str, *, file: str | Path | None = None,
                 field: str | None = None, expected: str | None = None):
        super().__init__(message)
        self.file = None if file is None else str(file)
        self.field = field
        self.expected = expected


class UsageError(UserInputError):
    """Arguments that do not fit together (what argparse cannot express)."""


class DiskFullError(UserInputError):
    """The disk (or quota) filled while an output was written; its temporary files are
    gone and the output is as it was before the command."""


def human_bytes(n: float) -> str:
    """``n`` bytes in decimal units (``57.3 KB``, ``1.2 GB``)."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000.0
    raise AssertionError


def _free_bytes(path: Path) -> int | None:
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


#: The errors that mean "no room": a full device, an exhausted quota.
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
#: How libraries that do not raise ``OSError`` word them (safetensors' Rust I/O errors end
#: in "(os error 28)"; the strerror texts for any library that only keeps the message).
_NO_SPACE_WORDS = tuple(f"(os error {code})" for code in _NO_SPACE) + tuple(
    os.strerror(code) for code in _NO_SPACE)


def is_no_space(exc: BaseException | None) -> bool:
    """Does ``exc`` (or an exception it was raised from) say the disk or quota is full?
    A :class:`UserInputError` never does: it is already the one-line refusal."""
    seen = 0
    while exc is not None and seen < 8 and not isinstance(exc, UserInputError):
        if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
            return True
        if not isinstance(exc, OSError) and any(w in str(exc) for w in _NO_SPACE_WORDS):
            return True
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        seen += 1
    return False


@contextlib.contextmanager
def disk_full_refusal(path: str | Path, needed: int | None, *,
                      cleanup: Iterable[str | Path] = (), what: str = "writing"
                      ) -> Iterator[argparse.Namespace]:
    """Within the block, a full disk becomes a :class:`DiskFullError` naming ``path``,
    the space ``needed`` (bytes; ``None``: not known) and the space free, after the
    ``cleanup`` paths (temporary files and folders) are removed. Other errors pass.
    The block may set ``.needed`` on the object it gets once it knows better."""
    state = argparse.Namespace(needed=needed)
    try:
        yield state
    except Exception as exc:
        if not is_no_space(exc):
            raise
        for p in cleanup:
            _remove(Path(p))
        free, needed = _free_bytes(Path(path)), state.needed
        need = (f"about {human_bytes(needed)} needed" if needed is not None else
            "more space needed")
        have = f", {human_bytes(free)} free" if free is not None else ""
        raise DiskFullError(
            f"{path}: no space left on the device while {what} ({need}{have}); free space or "
            "choose another folder and run the command again (its partial files were "
            "removed)", file=str(path), expected=need) from None


def no_space_message(exc: BaseException) -> str:
    """One line for a full disk that no writer turned into its own refusal: the file when
    the error names one, the space free there."""
    where = getattr(exc, "filename", None)
    free = _free_bytes(Path(where)) if where else None
    space = f" ({human_bytes(free)} free)" if free is not None else ""
    return (f"{where or 'an output'}: no space left on the device{space}: {one_line(exc)}; "
            "free space or choose another folder and run the command again")


def check_free_space(path: str | Path, needed: int, what: str = "writing") -> None:
    """Refuse before writing when ``needed`` bytes are more than the space free where
    ``path`` goes."""
    free = _free_bytes(Path(path))
    if free is not None and needed > free:
        raise DiskFullError(f"{path}: {human_bytes(needed)} needed for {what}, "
                            f"{human_bytes(free)} free; free space or choose another folder",
                            file=str(path), expected=f"{human_bytes(needed)} free")


def tree_bytes(path: str | Path) -> int:
    """Bytes of the files under ``path`` (a file: its size); 0 if absent."""
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    total = 0
    for root, _, files in os.walk(p):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, f)).st_size
    return total


# --------------------------------------------------------------------------- #
# argparse types                                                               #
# --------------------------------------------------------------------------- #


def _ascii_number(text: str) -> str:
    """``text`` if it may be read as a number: ASCII only, no ``_`` (Python's ``int()`` and
    ``float()`` also read ``1_000``, ``٣`` and full-width digits); ValueError otherwise."""
    if not isinstance(text, str) or not text.isascii() or "_" in text:
        raise ValueError(f"not a number in ASCII digits: {text!r}")
    return text


def integer(text: str) -> int:
    """An argparse ``type=``: a base-10 integer in ASCII digits (argparse names it
    "invalid integer value")."""
    return int(_ascii_number(text), 10)


def number(text: str) -> float:
    """An argparse ``type=``: a number in ASCII (NaN and infinities are left to the
    command's own range checks)."""
    return float(_ascii_number(text))


def _bound_text(lo, hi, lo_open: bool = False) -> str:
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{lo}, {hi}]"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo}"
    return f"<= {hi}"


def bounded_int(lo: int | None = None, hi: int | None = None, *, what: str = "an integer"):
    """An argparse ``type=`` accepting integers in ``[lo, hi]`` (either bound optional)."""

    def parse(text: str) -> int:
        try:
            value = integer(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(
                f"expected {what} {_bound_text(lo, hi)}, got {value}")
        return value

    parse.__name__ = what  # argparse names the type in its messages
    return parse


def bounded_float(lo: float | None = None, hi: float | None = None, *,
                  lo_open: bool = False, what: str = "a number"):
    """An argparse ``type=`` accepting finite numbers in ``[lo, hi]`` (``(lo, hi]`` with
    ``lo_open``); NaN and infinities are refused."""

    def parse(text: str) -> float:
        try:
            value = number(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected {what} (a finite number), got {text!r}")
        if ((lo is not None and (value <= lo if lo_open else value < lo))
                or (hi is not None and value > hi)):
            raise argparse.ArgumentTypeError(
                f"expected {what} {_bound_text(lo, hi, lo_open)}, got {text}")
        return value

    parse.__name__ = what
    return parse
