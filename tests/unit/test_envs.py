"""vllm_kimi_ext.envs: one definition per flag, one truthy rule, README's table."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_kimi_ext import envs

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "vllm_kimi_ext"


@pytest.mark.parametrize("raw,want", [
    ("1", True), ("true", True), ("TRUE", True), (" yes ", True), ("On", True),
    ("0", False), ("false", False), ("No", False), ("off", False), ("", False), ("  ", False),
])
def test_one_truthy_rule_for_every_boolean_flag(raw, want):
    for flag in envs.FLAGS:
        if flag.kind == "bool":
            assert flag.get({flag.name: raw}) is want, flag.name


@pytest.mark.parametrize("raw,want", [
    ("", 0), ("0", 0), ("off", 0), ("false", 0), ("1", 1), ("true", 1), ("on", 1),
    ("50", 50), (" 7 ", 7),
])
def test_count_collectives_is_a_step_interval(raw, want):
    assert envs.COUNT_COLLECTIVES.get({envs.COUNT_COLLECTIVES.name: raw}) == want


@pytest.mark.parametrize("flag,raw,expected", [
    *[(envs.SHARDED_VERIFY, raw, "one of 1/true/yes/on")
      for raw in ("2", "maybe", "ture", "-1", "1.0")],
    *[(envs.COUNT_COLLECTIVES, raw, "a step interval") for raw in ("abc", "-5", "2.5", "often")],
])
def test_invalid_value_is_one_line_naming_variable_value_and_expectation(flag, raw, expected):
    with pytest.raises(envs.EnvError) as err:
        flag.get({flag.name: raw})
    msg = str(err.value)
    assert msg.startswith(f"{flag.name}={raw!r}: expected {expected}")
    assert "\n" not in msg


def test_unset_flags_give_their_defaults_and_are_read_at_call_time(monkeypatch):
    for flag in envs.FLAGS:
        monkeypatch.delenv(flag.name, raising=False)
        assert flag.get() == flag.default
    monkeypatch.setenv(envs.SHARDED_VERIFY.name, "1")
    assert envs.SHARDED_VERIFY.get() is True
    monkeypatch.setenv(envs.SHARDED_VERIFY.name, "0")
    assert envs.SHARDED_VERIFY.get() is False


def test_check_all_names_every_invalid_variable_in_one_line():
    env = {envs.COUNT_COLLECTIVES.name: "abc", envs.ENABLE.name: "maybe",
           envs.SHARDED_VERIFY.name: "1"}
    with pytest.raises(envs.EnvError) as err:
        envs.check_all(env)
    msg = str(err.value)
    assert "VLLM_KIMI_EXT='maybe'" in msg and "VLLM_KIMI_EXT_COUNT_COLLECTIVES='abc'" in msg
    assert "SHARDED_VERIFY" not in msg and "\n" not in msg
    envs.check_all({envs.SHARDED_VERIFY.name: "yes"})  # valid: no error


def test_names_are_unique_and_prefixed():
    names = [f.name for f in envs.FLAGS]
    assert len(names) == len(set(names))
    assert all(n == envs.PREFIX or n.startswith(envs.PREFIX + "_") for n in names)


def test_readme_table_is_the_generated_one():
    readme = (REPO / "README.md").read_text()
    table = envs.markdown_table()
    assert table in readme, ("README's environment-variable table differs from "
                             "vllm_kimi_ext/envs.py; replace it with the output of "
                             "`python -m vllm_kimi_ext.envs`:\n" + table)


def test_every_variable_the_package_mentions_is_a_flag():
    """A VLLM_KIMI_EXT_* name in the package's code must be defined in envs.py (a
    new flag read with os.environ elsewhere, or a typo, fails here)."""
    known = {f.name for f in envs.FLAGS}
    pattern = re.compile(r"\bVLLM_KIMI_EXT(?:_[A-Z0-9_]*[A-Z0-9])?\b")
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "benchmarks" in path.parts:  # the bench harness: its own, not flags
            continue
        for name in pattern.findall(path.read_text()):
            found.setdefault(name, path.relative_to(REPO))
    assert {n: p for n, p in found.items() if n not in known} == {}


def test_no_module_but_envs_spells_a_flag_name():
    """Reading a flag anywhere but envs.py needs its name as a string literal
    (``os.environ.get("VLLM_KIMI_EXT_...")``, ``CHECK_ENV = "..."``): none may exist."""
    names = {f.name for f in envs.FLAGS}
    offenders = []
    for path in [*PACKAGE.rglob("*.py"), REPO / "noxfile.py"]:
        if path.name == "envs.py" or "benchmarks" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value}")
    assert offenders == []


def test_cli_prints_the_table_and_refuses_arguments():
    ok = subprocess.run([sys.executable, "-m", "vllm_kimi_ext.envs"], capture_output=True,
                        text=True, cwd=REPO)
    assert ok.returncode == 0 and ok.stdout.strip() == envs.markdown_table()
    bad = subprocess.run([sys.executable, "-m", "vllm_kimi_ext.envs", "--x"],
                         capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and "usage" in bad.stderr
