"""One error contract for every command: user-input errors derive from
``vllm_kimi_ext.user_input.UserInputError`` and the exit codes are defined once.

Checked over the AST of every module of ``vllm_kimi_ext`` and of the bench harness
(nothing is imported for the scan), plus the class hierarchy of the known error types.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from vllm_kimi_ext.user_input import UserInputError

ROOT = Path(__file__).resolve().parents[2]
SCANNED = [*sorted((ROOT / "vllm_kimi_ext").rglob("*.py")),
           *sorted((ROOT / "bench").rglob("*.py"))]
EXIT_NAMES = {"EXIT_OK", "EXIT_FINDINGS", "EXIT_USAGE", "EXIT_BAD_INPUT", "EXIT_ERRORS"}
#: Exception classes deriving straight from ValueError that are not user input, with why.
NOT_USER_INPUT = {
    "vllm_kimi_ext/facts.py:FactsError": "a shipped profile is broken: a packaging bug",
    "vllm_kimi_ext/tokenizers/compare.py:TokenizerMismatchError":
        "a multi-line findings report (exit 1), not a refused argument",
    "vllm_kimi_ext/tokenizers/json_files.py:_DuplicateKey":
        "private; read_json_object turns it into a TokenizerInputError",
    "bench/harness/schema.py:SchemaError":
        "raised by schema.check (tests); readers call schema.validate and raise UsageError",
    "vllm_kimi_ext/integration/verifier_choice.py:HandoverDataError":
        "a shipped package-data file is broken (a packaging bug); serving logs it and hands "
        "every step over, no command exits on it",
}
#: Every error a command turns into exit 2, by import path.
USER_INPUT_ERRORS = [
    "vllm_kimi_ext.user_input:UsageError",
    "vllm_kimi_ext.train.layout:DataError",
    "vllm_kimi_ext.costmodel.catalog:ProfileError",
    "vllm_kimi_ext.costmodel.catalog:UnknownProfileError",
    "vllm_kimi_ext.envs:EnvError",
    "vllm_kimi_ext.drafts.shrink_vocab.corpus:CorpusError",
    "vllm_kimi_ext.drafts.shrink_vocab.shrink:ShrinkVocabError",
    "vllm_kimi_ext.drafts.tli.maps:TLIConfigError",
    "vllm_kimi_ext.checkpoints.safetensors_headers:SafetensorsHeaderError",
    "vllm_kimi_ext.tokenizers.errors:TokenizerInputError",
    "bench.harness.cli:UsageError",
    "bench.harness.e2e.config:ConfigError",
]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _trees():
    return [(_rel(p), ast.parse(p.read_text(encoding="utf-8"))) for p in SCANNED]


def local_exit_codes(trees) -> list[str]:
    """``EXIT_* = <int>`` (or a tuple of ints) anywhere but ``user_input.py``."""
    hits = []
    for rel, tree in trees:
        if rel == "vllm_kimi_ext/user_input.py":
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign):
                continue
            names = [n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            values = [n for n in ast.walk(node.value) if isinstance(n, ast.Constant)
                      and type(n.value) is int]
            if values and EXIT_NAMES & set(names):
                hits.append(f"{rel}:{node.lineno}: {', '.join(sorted(EXIT_NAMES & set(names)))}")
    return hits


def plain_value_errors(trees) -> list[str]:
    """``class XError(ValueError)`` (a user-input error outside the contract) not listed in
    :data:`NOT_USER_INPUT`."""
    hits = []
    for rel, tree in trees:
        for node in ast.walk(tree):
            if (isinstance(node, ast.ClassDef) and any(
                    isinstance(b, ast.Name) and b.id == "ValueError" for b in node.bases)
                    and f"{rel}:{node.name}" not in NOT_USER_INPUT
                    and not (rel == "vllm_kimi_ext/user_input.py"
                             and node.name == "UserInputError")):
                hits.append(f"{rel}:{node.lineno}: class {node.name}(ValueError)")
    return hits


def test_exit_codes_are_defined_once():
    assert local_exit_codes(_trees()) == []


def test_no_error_type_outside_the_contract():
    assert plain_value_errors(_trees()) == []


def test_allowlist_is_current():
    """An entry of NOT_USER_INPUT whose class is gone or changed fails, so it only shrinks."""
    present = {f"{rel}:{n.name}" for rel, tree in _trees() for n in ast.walk(tree)
               if isinstance(n, ast.ClassDef)
               and any(isinstance(b, ast.Name) and b.id == "ValueError" for b in n.bases)}
    assert set(NOT_USER_INPUT) <= present


@pytest.mark.parametrize("spec", USER_INPUT_ERRORS)
def test_user_input_error_types_share_the_base(spec):
    module, name = spec.split(":")
    assert issubclass(getattr(importlib.import_module(module), name), UserInputError)


def test_the_scans_see_a_planted_local_contract():
    planted = ast.parse("EXIT_OK, EXIT_FINDINGS, EXIT_BAD_INPUT = 0, 1, 2\n"
                        "class UsageError(ValueError):\n    pass\n")
    assert local_exit_codes([("vllm_kimi_ext/x.py", planted)]) == [
        "vllm_kimi_ext/x.py:1: EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK"]
    assert plain_value_errors([("vllm_kimi_ext/x.py", planted)]) == [
        "vllm_kimi_ext/x.py:2: class UsageError(ValueError)"]
