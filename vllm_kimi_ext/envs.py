"""Every ``VLLM_KIMI_EXT*`` environment variable, defined once.

Each :class:`Flag` carries its name, kind, default and the sentence README's
environment-variable table is generated from (``python -m vllm_kimi_ext.envs``
prints the table; ``tests/unit/test_envs.py`` fails when README differs).

Values are read at call time (``FLAG.get()``), never cached: a variable set just
before ``vllm serve``, or by a test, takes effect at the next read.

One truthy rule for every on/off flag: ``1``, ``true``, ``yes``, ``on`` are on;
``0``, ``false``, ``no``, ``off`` and the empty string are off (any case,
surrounding ASCII blanks ignored); the empty string is "off" for every variable
that has an off. Numbers are ASCII digits only (no sign, ``_``, exponent or other
script's digits: Python's ``int()`` would read ``1_000`` and ``٣``) and at most
:data:`MAX_COUNT`. Anything else raises :class:`EnvError`, a one-line message
naming the variable, its value and what was expected: a typo never silently means
"off". A set ``VLLM_KIMI_EXT*`` name that is none of the flags is named with the
closest known one (:func:`unknown_warnings`); a flag set where the flag it needs
(``Flag.needs``) is off is named too (:func:`ineffective_warnings`): it would do
nothing, silently.

Stdlib only (``noxfile.py`` imports it before any environment exists).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from typing import Any

from vllm_kimi_ext.user_input import UserInputError

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")
_BOOL_EXPECTED = ("one of " + "/".join(TRUE_WORDS) + " (on) or " + "/".join(FALSE_WORDS[:-1])
    + " (off)")
#: What is stripped around a value: ASCII blanks only (a no-break space is a typo).
_BLANKS = " \t\r\n"
#: The largest N a count variable takes (a billion steps or requests: more is a typo).
MAX_COUNT = 1_000_000_000


class EnvError(UserInputError):
    """An environment variable of this package holds a value it cannot mean."""


def _word(raw: str) -> str:
    return raw.strip(_BLANKS).lower()


def _count(name: str, raw: str, word: str, expected: str) -> int:
    """``word`` as a count in [0, MAX_COUNT]: ASCII digits only."""
    if not (word.isascii() and word.isdigit()):
        raise EnvError(f"{name}={raw!r}: expected {expected}")
    if len(word.lstrip("0")) > len(str(MAX_COUNT)) or int(word) > MAX_COUNT:
        raise EnvError(f"{name}={raw!r}: expected {expected}; N must be <= {MAX_COUNT}")
    return int(word)


def _parse_bool(name: str, raw: str) -> bool:
    word = _word(raw)
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise EnvError(f"{name}={raw!r}: expected {_BOOL_EXPECTED}")


def _parse_steps(name: str, raw: str) -> int:
    word = _word(raw)
    if word in TRUE_WORDS[1:]:
        return 1
    if word in FALSE_WORDS:
        return 0
    return _count(name, raw, word, "a step interval N >= 0 in ASCII digits (0, off or empty: "
                  "disabled; on: every step)")


def _parse_path(name: str, raw: str) -> str | None:
    return raw.strip(_BLANKS) or None


def _parse_handoff(name: str, raw: str) -> str | int:
    """``"auto"``, or the smallest request count N >= 1 (0, off, empty = never)."""
    word = _word(raw)
    if word == "auto":
        return "auto"
    if word in FALSE_WORDS or word == "never":
        return 0
    return _count(name, raw, word, "auto, off (never; also empty) or a request count N >= 1 "
                  "in ASCII digits")


_PARSERS = {"bool": _parse_bool, "steps": _parse_steps, "path": _parse_path,
            "handoff": _parse_handoff}
_VALUES = {"bool": "on / off", "steps": "N steps", "path": "directory",
           "handoff": "auto / off / N requests"}


@dataclasses.dataclass(frozen=True)
class Flag:
    """One environment variable: ``get()`` reads and parses it now."""

    name: str
    kind: str  # "bool" | "steps" | "path" | "handoff"
    default: Any
    doc: str
    #: the default as the README table shows it
    shown_default: str = ""
    #: the on/off flags this one acts only with (a set value is ignored without them)
    needs: tuple[Flag, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in _PARSERS:
            raise ValueError(f"{self.name}: unknown kind {self.kind!r}")

    def get(self, environ: Mapping[str, str] | None = None) -> Any:
        """The parsed value (the default when unset); :class:`EnvError` when invalid."""
        environ = os.environ if environ is None else environ
        raw = environ.get(self.name)
        if raw is None:
            return self.default
        return _PARSERS[self.kind](self.name, raw)


ENABLE = Flag(
    "VLLM_KIMI_EXT", "bool", False,
    "enable the plugin (entry point `vllm.general_plugins: kimi_ext`); every variable below "
    "but `VLLM_KIMI_EXT_ENV` acts only with it", "off")
ALLOW_MISMATCH = Flag(
    "VLLM_KIMI_EXT_ALLOW_MISMATCH", "bool", False,
    "downgrade the vLLM-version / patch-series refusal to a warning (bisecting only)", "off",
    needs=(ENABLE,))
COUNT_COLLECTIVES = Flag(
    "VLLM_KIMI_EXT_COUNT_COLLECTIVES", "steps", 0,
    "count collectives per phase (target / draft / verify) in each worker and log per-step "
    "averages every N steps (`on` = every step)", "0 = off", needs=(ENABLE,))
CHECK_DRAFT_AGREEMENT = Flag(
    "VLLM_KIMI_EXT_CHECK_DRAFT_AGREEMENT", "bool", False,
    "debug: all-gather the draft token ids after each step of an un-sharded draft "
    "(`draft_tensor_parallel_size: 1`) and fail loudly if TP ranks disagree", "off",
    needs=(ENABLE,))
SHARDED_VERIFY = Flag(
    "VLLM_KIMI_EXT_SHARDED_VERIFY", "bool", False,
    "verify drafts over vocabulary shards instead of all-gathering logits (experimental; "
    "every ineligible step falls back to stock, counted per reason)", "off", needs=(ENABLE,))
SHARDED_VERIFY_GRAPHS = Flag(
    "VLLM_KIMI_EXT_SHARDED_VERIFY_GRAPHS", "bool", True,
    "with `VLLM_KIMI_EXT_SHARDED_VERIFY`: capture the verification step's CUDA graphs at "
    "warm-up for a fixed list of padded request counts and replay them (steps no graph "
    "fits run eagerly, counted; off: run every step eagerly)", "on",
    needs=(ENABLE, SHARDED_VERIFY))
SHARDED_VERIFY_HANDOFF = Flag(
    "VLLM_KIMI_EXT_SHARDED_VERIFY_HANDOFF", "handoff", "auto",
    "with `VLLM_KIMI_EXT_SHARDED_VERIFY` and vLLM's `--enable-batch-sharded-sampling` both "
    "on: which top-p / min-p verification steps go to batch-sharded sampling instead: `auto` "
    "from the crossover batch priced from the measured verify-step report for the runner's "
    "k and the step's temperature (every step where it is not priced), `N` steps of N or "
    "more requests, `off` (or empty) none (other steps always stay sharded)", "auto",
    needs=(ENABLE, SHARDED_VERIFY))
REPLICATE_DRAFT_EMBEDDING = Flag(
    "VLLM_KIMI_EXT_REPLICATE_DRAFT_EMBEDDING", "bool", False,
    "keep a whole copy of a sharded EAGLE / EAGLE-3 / MTP draft's input embedding on every "
    "rank: one all-reduce fewer per draft token for (1 - 1/TP) x vocab x hidden more "
    "weights per rank (logged); other methods are refused", "off", needs=(ENABLE,))
SKIP_DRAFT_CHECK = Flag(
    "VLLM_KIMI_EXT_SKIP_DRAFT_CHECK", "bool", False,
    "skip the configuration-time draft checks (`vllm-kimi-ext doctor` runs the same checks "
    "by hand)", "off", needs=(ENABLE,))
PROJECT_ENV = Flag(
    "VLLM_KIMI_EXT_ENV", "path", None,
    "nox: the project environment that `apply-patches` creates and every session runs in",
    "`.venv`")

FLAGS: tuple[Flag, ...] = (ENABLE, ALLOW_MISMATCH, COUNT_COLLECTIVES, CHECK_DRAFT_AGREEMENT,
                           SHARDED_VERIFY, SHARDED_VERIFY_GRAPHS, SHARDED_VERIFY_HANDOFF,
                           REPLICATE_DRAFT_EMBEDDING,
                           SKIP_DRAFT_CHECK, PROJECT_ENV)
PREFIX = ENABLE.name


def check_all(environ: Mapping[str, str] | None = None) -> None:
    """Parse every flag that is set; one :class:`EnvError` naming all invalid ones."""
    problems = []
    for flag in FLAGS:
        try:
            flag.get(environ)
        except EnvError as exc:
            problems.append(str(exc))
    if problems:
        raise EnvError("; ".join(problems))


def unknown_names(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """``(name, closest known name or None)`` for every set variable that starts with
    ``VLLM_KIMI_EXT`` but is none of :data:`FLAGS` (a typo would otherwise pass silently)."""
    import difflib

    environ = os.environ if environ is None else environ
    known = [f.name for f in FLAGS]
    out = []
    for name in sorted(environ):
        if name.startswith(PREFIX) and name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            out.append((name, close[0] if close else None))
    return out


def ineffective_warnings(environ: Mapping[str, str] | None = None) -> list[str]:
    """One warning line per flag set (to a non-blank value) while a flag it needs is off:
    the setting does nothing, and nothing else would say so. A needed flag holding an
    invalid value is left to :func:`check_all`."""
    environ = os.environ if environ is None else environ
    lines = []
    for flag in FLAGS:
        raw = environ.get(flag.name)
        if raw is None or not raw.strip(_BLANKS):
            continue
        for parent in flag.needs:
            try:
                on = parent.get(environ)
            except EnvError:
                break
            if not on:
                lines.append(f"{flag.name}={raw!r} has no effect without {parent.name}=1 "
                             "and is ignored")
                break
    return lines


def startup_warnings(environ: Mapping[str, str] | None = None) -> list[str]:
    """What the plugin logs when it is loaded: unknown names, then ineffective settings."""
    return unknown_warnings(environ) + ineffective_warnings(environ)


def unknown_warnings(environ: Mapping[str, str] | None = None) -> list[str]:
    """One warning line per unknown ``VLLM_KIMI_EXT*`` variable."""
    lines = []
    for name, close in unknown_names(environ):
        hint = (f"did you mean {close}?" if close else
            "known: " + ", ".join(f.name for f in FLAGS))
        lines.append(f"{name} is not a vllm-kimi-ext variable and is ignored ({hint})")
    return lines


def markdown_table() -> str:
    """README's environment-variable table."""
    rows = ["| Environment variable | Values (default) | Effect |", "|---|---|---|"]
    for f in FLAGS:
        rows.append(f"| `{f.name}` | {_VALUES[f.kind]} ({f.shown_default}) | {f.doc} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """``python -m vllm_kimi_ext.envs``: print README's table."""
    args = sys.argv[1:] if argv is None else argv
    if args:
        print("usage: python -m vllm_kimi_ext.envs  (prints README's environment-variable "
              "table)", file=sys.stderr)
        return 2
    print(markdown_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
