"""The exit-code contract of the bench entry points (``bench/run_all.py``,
``bench/e2e/runner.py``) and the argument checks they share.

- ``0`` clean; ``1`` the run found something (a failed section, a launch that did not run,
  a comparison without matching levels: each entry point's ``--help`` says which);
- ``2`` usage error, unreadable input or internal error: one line on stderr naming the
  argument or file, the field and what was expected, never a traceback (``--debug`` adds it).

Everything a user can pass is checked before anything is started or written: an entry
point raises :class:`UsageError` (or a subclass, such as the e2e config's ``ConfigError``;
both derive from the package's ``vllm_kimi_ext.user_input.UserInputError``, the one
user-input error type of every command) and :func:`run_cli` turns it into that line.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from vllm_kimi_ext.user_input import (  # noqa: F401 - re-exported for the entry points
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_USAGE,
    UserInputError,
    one_line,
)

EXIT_INTERRUPTED = 130  # the shell's convention for SIGINT

DEBUG_HELP = "on an error, print the Python traceback too"


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors: ``PROG: error: MESSAGE (see PROG --help)``, exit 2
    (argparse's own prints the whole usage first)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {one_line(message)} (see {self.prog} "
                              "--help)\n")


class UsageError(UserInputError):
    """Something a user passed (an argument, a config file) is wrong; the message names
    the argument or file, the field and what was expected."""


def exit_codes_help(findings: str) -> str:
    """The epilog line of an entry point; ``findings`` says what exit 1 means there."""
    return (f"exit status: 0 clean; 1 {findings}; 2 usage error, unreadable input or internal "
            "error (one line on stderr; --debug shows the traceback)")


def add_debug(parser: argparse.ArgumentParser, *, sub: bool = False) -> None:
    """``--debug`` on ``parser``; on a subparser its default is absent (SUPPRESS) so that a
    ``--debug`` given before the subcommand survives."""
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP,
                        **({"default": argparse.SUPPRESS} if sub else {}))


def run_cli(prog: str, parse: Callable[[list[str]], argparse.Namespace],
            body: Callable[[argparse.Namespace], int], argv: list[str] | None) -> int:
    """Parse ``argv`` (checks made while parsing may raise too) and run ``body`` under the
    contract in the module docstring."""
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv  # known before parsing, for errors raised while parsing
    error: BaseException
    try:
        args = parse(argv)
        debug = bool(getattr(args, "debug", debug))
        return int(body(args))
    except SystemExit as exc:  # --help (0), or argparse printed its usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except UserInputError as exc:  # UsageError, or a product reader's refusal
        error, message = exc, one_line(exc)
    except OSError as exc:
        where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
        error = exc
        message = f"cannot access{where}: {exc.strerror or one_line(exc) or type(exc).__name__}"
    except Exception as exc:  # noqa: BLE001 - the contract: never a bare traceback
        error = exc
        message = (f"internal error: {type(exc).__name__}: {one_line(exc) or '(no message)'} "
                   "(rerun with --debug for the traceback and report it)")
    if debug:
        traceback.print_exception(type(error), error, error.__traceback__)
    print(f"{prog}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


# ---------------------------------------------------------------------------------------------
# argparse types: refuse NaN, infinities and out-of-range numbers while parsing
# ---------------------------------------------------------------------------------------------


def positive_int(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


positive_int.__name__ = "a positive integer"


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected seconds (a number > 0), got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected seconds (a finite number > 0), got {text}")
    return value


positive_seconds.__name__ = "seconds"


def int_list(text: str) -> list[int]:
    """``"1,4,16"`` -> [1, 4, 16]: positive integers, at least one."""
    items = [x.strip() for x in text.split(",")]
    if not any(items) or not all(items):
        raise argparse.ArgumentTypeError(
            f"expected a comma list of positive integers such as 1,4,16, got {text!r}")
    return [positive_int(x) for x in items]


int_list.__name__ = "a comma list of integers"


def name_list(text: str) -> list[str]:
    """``"a,b"`` -> ["a", "b"]: non-empty names, at least one."""
    items = [x.strip() for x in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"expected a comma list of names, got {text!r}")
    return items


name_list.__name__ = "a comma list of names"


def name_eq_value(option: str, item: str, what: str = "PATH") -> tuple[str, str]:
    """``NAME=VALUE`` of a repeatable option, both parts non-empty."""
    name, sep, value = item.partition("=")
    name, value = name.strip().lstrip("@"), value.strip()
    if not sep or not name or not value:
        raise UsageError(f"{option} {item!r}: expected NAME={what}")
    return name, value


# ---------------------------------------------------------------------------------------------
# paths
# ---------------------------------------------------------------------------------------------


def check_output_dir(option: str, path: Path) -> None:
    """``path`` can be (or already is) a directory this process may write: not a file, not
    under a file, its first existing ancestor writable."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path}: is a file, expected a directory")
    check_creatable(option, path, kind="directory")


def check_output_file(option: str, path: Path) -> None:
    """``path`` can be written as a file: not a directory, its parent not under a file."""
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a directory, expected a file name")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{option} {path}: not writable")
    check_creatable(option, path.parent, kind="file")


def check_creatable(option: str, path: Path, kind: str) -> None:
    """No ancestor of ``path`` is a file and the first existing one is writable."""
    target = path.absolute()
    probe = target
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"{option} {path}: {probe} is a file, so no {kind} can be made "
                         "under it (expected a directory path)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: " + ("directory not writable" if probe == target
                                                 else f"cannot create it, {probe} is not "
                                                 "writable"))


def check_input_file(option: str, path: Path) -> None:
    if not path.exists():
        raise UsageError(f"{option} {path}: no such file")
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a directory, expected a file")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{option} {path}: not readable")


def read_text(option: str, path: Path) -> str:
    """The UTF-8 text of an input file (its problems as :class:`UsageError`)."""
    check_input_file(option, path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{option} {path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot read: {exc.strerror or exc}") from None


def read_json(option: str, path: Path) -> object:
    import json

    text = read_text(option, path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{option} {path}: not valid JSON: {exc.msg} at line {exc.lineno} "
                         f"column {exc.colno}") from None


def looks_like_local_path(ref: str) -> bool:
    """A model reference written as a path (rather than a hub id such as ``org/name``)."""
    return ref.startswith(("/", "./", "../", "~")) or ref in (".", "..")
