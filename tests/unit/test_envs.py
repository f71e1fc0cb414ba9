"""vllm_kimi_ext.envs: one definition per flag, one truthy rule, README's table."""

from __future__ import annotations

import ast
import os
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


@pytest.mark.parametrize("raw,want", [
    ("", 0), (" ", 0), ("auto", "auto"), (" AUTO ", "auto"), ("off", 0), ("never", 0),
    ("0", 0), ("false", 0), ("1", 1), ("3", 3), (" 16 ", 16), ("007", 7),
    (str(envs.MAX_COUNT), envs.MAX_COUNT),
])
def test_sharded_verify_handoff_is_auto_or_a_request_count(raw, want):
    assert envs.SHARDED_VERIFY_HANDOFF.get({envs.SHARDED_VERIFY_HANDOFF.name: raw}) == want


@pytest.mark.parametrize("flag,raw,expected", [
    *[(envs.SHARDED_VERIFY, raw, "one of 1/true/yes/on")
      for raw in ("2", "maybe", "ture", "-1", "1.0")],
    *[(envs.COUNT_COLLECTIVES, raw, "a step interval") for raw in ("abc", "-5", "2.5", "often")],
    *[(envs.SHARDED_VERIFY_HANDOFF, raw, "auto, off (never; also empty) or a request count")
      for raw in ("on", "yes", "-2", "3.5", "top_p", "batch 4")],
    # numbers: ASCII digits only (Python's int() reads all of these)
    *[(flag, raw, expected)
      for flag, expected in ((envs.COUNT_COLLECTIVES, "a step interval N >= 0 in ASCII digits"),
                             (envs.SHARDED_VERIFY_HANDOFF, "auto, off (never; also empty)"))
      for raw in ("1_000", "\u0663", "\uff15", "+5", "1e3", "0x10", "\u00a05", "5\u2003")],
    # blanks around an on/off word: ASCII only
    *[(envs.SHARDED_VERIFY, raw, "one of 1/true/yes/on") for raw in ("\u00a01", "on\u3000")],
])
def test_invalid_value_is_one_line_naming_variable_value_and_expectation(flag, raw, expected):
    with pytest.raises(envs.EnvError) as err:
        flag.get({flag.name: raw})
    msg = str(err.value)
    assert msg.startswith(f"{flag.name}={raw!r}: expected {expected}")
    assert "\n" not in msg


@pytest.mark.parametrize("flag", [envs.COUNT_COLLECTIVES, envs.SHARDED_VERIFY_HANDOFF])
@pytest.mark.parametrize("raw", [str(envs.MAX_COUNT + 1), "9" * 26, "0" * 30 + "1" * 11])
def test_a_number_above_the_bound_is_refused_naming_the_bound(flag, raw):
    with pytest.raises(envs.EnvError) as err:
        flag.get({flag.name: raw})
    msg = str(err.value)
    assert msg.startswith(f"{flag.name}={raw!r}: expected ") and "\n" not in msg
    assert msg.endswith(f"; N must be <= {envs.MAX_COUNT}"), msg


def test_leading_zeros_within_the_bound_are_a_number():
    flag = envs.COUNT_COLLECTIVES
    assert flag.get({flag.name: "0" * 30 + "12"}) == 12


def test_empty_is_off_for_every_flag_that_has_an_off():
    """README's one rule: empty is off (never "auto", never the default "on")."""
    off = {"bool": False, "steps": 0, "handoff": 0}
    for flag in envs.FLAGS:
        if flag.kind in off:
            assert flag.get({flag.name: ""}) == off[flag.kind], flag.name


_ENABLE_ON = {envs.ENABLE.name: "1"}


@pytest.mark.parametrize("env,warned", [
    # a child without its parent: named, with the parent it needs
    ({**_ENABLE_ON, envs.SHARDED_VERIFY_HANDOFF.name: "4"},
     [(envs.SHARDED_VERIFY_HANDOFF, "'4'", envs.SHARDED_VERIFY)]),
    ({**_ENABLE_ON, envs.SHARDED_VERIFY.name: "off", envs.SHARDED_VERIFY_GRAPHS.name: "0"},
     [(envs.SHARDED_VERIFY_GRAPHS, "'0'", envs.SHARDED_VERIFY)]),
    # any flag without VLLM_KIMI_EXT=1 (unset or off); the first missing parent only
    ({envs.SHARDED_VERIFY.name: "1"}, [(envs.SHARDED_VERIFY, "'1'", envs.ENABLE)]),
    ({envs.ENABLE.name: "0", envs.SHARDED_VERIFY_HANDOFF.name: "auto"},
     [(envs.SHARDED_VERIFY_HANDOFF, "'auto'", envs.ENABLE)]),
    ({envs.COUNT_COLLECTIVES.name: "5", envs.SKIP_DRAFT_CHECK.name: "1"},
     [(envs.COUNT_COLLECTIVES, "'5'", envs.ENABLE), (envs.SKIP_DRAFT_CHECK, "'1'", envs.ENABLE)]),
    # no warning: parents on, a blank child, the project-env variable, a broken parent
    ({**_ENABLE_ON, envs.SHARDED_VERIFY.name: "1", envs.SHARDED_VERIFY_HANDOFF.name: "4"}, []),
    ({envs.SHARDED_VERIFY_HANDOFF.name: " "}, []),
    ({envs.PROJECT_ENV.name: "/opt/env"}, []),
    ({envs.ENABLE.name: "maybe", envs.SHARDED_VERIFY.name: "1"}, []),
])
def test_a_setting_without_its_parent_is_named_in_one_line(env, warned):
    lines = envs.ineffective_warnings(env)
    assert lines == [f"{child.name}={raw} has no effect without {parent.name}=1 and is ignored"
                     for child, raw, parent in warned]
    assert envs.startup_warnings(env) == envs.unknown_warnings(env) + lines


def test_every_flag_but_the_switch_and_the_project_env_needs_the_switch():
    for flag in envs.FLAGS:
        if flag in (envs.ENABLE, envs.PROJECT_ENV):
            assert flag.needs == (), flag.name
        else:
            assert flag.needs[0] is envs.ENABLE, flag.name
            assert all(p.kind == "bool" for p in flag.needs), flag.name
        # the README sentence says what it acts with
        for parent in flag.needs[1:]:
            assert f"with `{parent.name}`" in flag.doc, flag.name


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


def _misspelt(name: str) -> str:
    """``name`` with its last letter doubled (built here, so that no source file spells
    an unknown variable name)."""
    return name + name[-1]


@pytest.mark.parametrize("flag", [f for f in envs.FLAGS if f is not envs.ENABLE])
def test_a_misspelt_variable_is_named_with_the_closest_known_name(flag):
    wrong = _misspelt(flag.name)
    assert envs.unknown_names({wrong: "1", flag.name: "1"}) == [(wrong, flag.name)]
    (line,) = envs.unknown_warnings({wrong: "1"})
    assert (line.startswith(f"{wrong} is not a vllm-kimi-ext variable") and
        f"did you mean {flag.name}?" in line and "\n" not in line)


def test_a_far_off_name_lists_the_known_ones_and_other_prefixes_are_ignored():
    far = envs.PREFIX + "_" + "Q" * 30
    (line,) = envs.unknown_warnings({far: "1", "VLLM_OTHER": "1", "KIMI_EXT_X": "1"})
    assert far in line and envs.SHARDED_VERIFY.name in line
    assert envs.unknown_names({f.name: "1" for f in envs.FLAGS}) == []


def test_the_plugin_warns_about_a_misspelt_name_even_when_off(monkeypatch, caplog):
    from vllm_kimi_ext import plugin

    wrong = _misspelt(envs.ENABLE.name)  # the enabling variable itself, misspelt
    monkeypatch.delenv(envs.ENABLE.name, raising=False)
    monkeypatch.setenv(wrong, "1")
    with caplog.at_level("WARNING", logger="vllm_kimi_ext"):
        plugin.register()
    assert [r.getMessage() for r in caplog.records if wrong in r.getMessage()] == [
        f"vllm-kimi-ext: {wrong} is not a vllm-kimi-ext variable and is ignored "
        f"(did you mean {envs.ENABLE.name}?)"]


def test_vllm_loading_the_plugin_stops_with_one_line_naming_the_variable(tmp_path):
    """What `vllm serve` does first (vllm.plugins.load_general_plugins, outside any
    handler) ends with one line on stderr and exit 2, not a traceback."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from vllm.plugins import load_plugins_by_group; "
            "[f() for f in load_plugins_by_group('vllm.general_plugins').values()]")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(envs.PREFIX)},
           envs.ENABLE.name: "1", envs.SHARDED_VERIFY.name: "maybe",
           "VLLM_TARGET_DEVICE": "cpu"}
    proc = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "vllm-kimi-ext" in ln]
    assert lines == [f"vllm-kimi-ext: error: {envs.SHARDED_VERIFY.name}='maybe': expected one "
                     "of 1/true/yes/on (on) or 0/false/no/off (off)"], proc.stderr
    assert "Traceback" not in proc.stderr
