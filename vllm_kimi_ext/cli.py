"""``vllm-kimi-ext`` command line.

Each feature module contributes its subcommands through a ``register(subparsers)``
function listed in ``_SUBCOMMAND_MODULES``; modules are imported when the parser
is built, so they must keep heavy imports (torch, vLLM) inside their handlers.

One exit-code contract for every subcommand, enforced here
(:mod:`vllm_kimi_ext.user_input`): 0 clean, 1 findings, 2 usage error / unreadable
input / internal error. A handler returns 0 or 1 (its verdict) or raises; a
:class:`~vllm_kimi_ext.user_input.UserInputError` or an ``OSError`` becomes one line
on stderr and exit 2, any other exception one line saying it is an internal error
and exit 2. ``--debug`` (before or after the subcommand) prints the traceback too.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from vllm_kimi_ext.user_input import (
    EXIT_CODES_HELP,
    EXIT_USAGE,
    UserInputError,
    is_no_space,
    no_space_message,
    one_line,
)

_SUBCOMMAND_MODULES = (
    "vllm_kimi_ext.costmodel.cli",  # plan
    "vllm_kimi_ext.drafts.cli",  # doctor, draft shrink-vocab, draft tli-check
    "vllm_kimi_ext.tokenizers.cli",  # tokenizer-check
)
#: (command group, ``module:function`` that adds subcommands to it, given the group's
#: subparsers): groups that several packages fill, so that none imports another for its CLI
_GROUP_MODULES = (
    # draft regenerate, capture, train, eval, bill
    ("draft", "vllm_kimi_ext.train.cli:register_draft_subcommands"),
)
_EXIT_INTERRUPTED = 130  # the shell's convention for SIGINT

_DEBUG_HELP = "on an error, print the Python traceback too"


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return [p for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for p in action.choices.values()]


def _add_contract(parser: argparse.ArgumentParser) -> None:
    """Every (sub)command: ``--debug``, the exit codes in its ``--help`` and its own name
    (``_prog``) for error lines."""
    for sub in _subparsers(parser):
        if not any("--debug" in a.option_strings for a in sub._actions):
            # SUPPRESS: absent unless given here, so a top-level --debug survives
            sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help=_DEBUG_HELP)
        sub.epilog = f"{sub.epilog}\n\n{EXIT_CODES_HELP}" if sub.epilog else EXIT_CODES_HELP
        sub.set_defaults(_prog=sub.prog)
        _add_contract(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-kimi-ext",
        description="Tools for speculative decoding of Kimi-K2.5 on PCIe-only GPUs.",
        epilog=EXIT_CODES_HELP,
    )
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a real missing dependency, not an unbuilt feature
                raise
            continue
        module.register(sub)
    for group, ref in _GROUP_MODULES:
        (group_sub,) = [a for a in sub.choices[group]._actions
                        if isinstance(a, argparse._SubParsersAction)]
        module, _, function = ref.partition(":")
        getattr(importlib.import_module(module), function)(group_sub)
    _add_contract(parser)
    return parser


def _error(prog: str, message: str) -> None:
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr)


def _os_error_message(exc: OSError) -> str:
    where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
    reason = exc.strerror or str(exc) or type(exc).__name__
    return f"cannot access{where}: {reason}"


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not complain
    about the closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file descriptor (captured)
        pass


def run_handler(args: argparse.Namespace) -> int:
    """Run ``args.func`` under the exit-code contract (see the module doc)."""
    prog = getattr(args, "_prog", "vllm-kimi-ext")
    debug = bool(getattr(args, "debug", False))
    try:
        code = args.func(args)
        return 0 if code is None else int(code)
    except UserInputError as exc:
        if debug:
            traceback.print_exc()
        _error(prog, str(exc))
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return _EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `| head`: the reader left; nothing more to say
        _silence_stdout()
        return EXIT_USAGE
    except OSError as exc:
        if debug:
            traceback.print_exc()
        _error(prog, no_space_message(exc) if is_no_space(exc) else _os_error_message(exc))
    except Exception as exc:  # noqa: BLE001 - the contract: never a bare traceback
        if debug:
            traceback.print_exc()
        if is_no_space(exc):  # e.g. safetensors' own error type
            _error(prog, no_space_message(exc))
            return EXIT_USAGE
        detail = one_line(str(exc)) or "(no message)"
        print(f"{prog}: internal error: {type(exc).__name__}: {detail} "
              f"(not your input's fault as far as the tool knows; rerun with --debug for "
              f"the traceback and report it)", file=sys.stderr)
    return EXIT_USAGE


def empty_argument(argv: list[str]) -> str | None:
    """The first argument given as an empty string (``--out ""``, ``--out=``, ``""``), named:
    no option of any command means anything by it, and read as a path it would be the
    current folder (``--out ""`` once reported ". exists")."""
    for i, token in enumerate(argv):
        if token.startswith("--") and token.endswith("=") and len(token) > 3:
            return f"argument {token[:-1]}"
        if token == "":
            before = argv[i - 1] if i else ""
            return (f"argument {before}" if before.startswith("-") and before != "--" else
                f"argument {i + 1} of the command line")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    empty = empty_argument(sys.argv[1:] if argv is None else list(argv))
    if empty is not None:
        _error(parser.prog, f"{empty}: empty path or value; expected a path, a name or a "
                            "number")
        return EXIT_USAGE
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error argparse already printed (2)
        if exc.code is None:
            return 0
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        _error(parser.prog, "a COMMAND is required")
        return EXIT_USAGE
    return run_handler(args)


if __name__ == "__main__":
    sys.exit(main())
