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
import math
from pathlib import Path

__all__ = [
    "EXIT_CODES_HELP",
    "EXIT_FINDINGS",
    "EXIT_OK",
    "EXIT_USAGE",
    "MAX_VOCAB_SIZE",
    "UsageError",
    "UserInputError",
    "bounded_float",
    "bounded_int",
    "one_line",
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


# --------------------------------------------------------------------------- #
# argparse types                                                               #
# --------------------------------------------------------------------------- #


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
            value = int(text, 10)
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
            value = float(text)
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
