"""``nox -s upstream-check``'s driver: pins read from vLLM's pre-commit config, which changed
files each hook gets, which vLLM tests each patch adds, junit outcomes, and its bad inputs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from testkit import upstream_check as uc

CONFIG = """\
repos:
- repo: https://github.com/astral-sh/ruff-pre-commit
  rev: f368fb366ff7f2f808dd324b83a6d32267799e19  # frozen: v0.17.2
  hooks:
  - id: ruff-check
- repo: https://github.com/crate-ci/typos
  rev: 9023c1f779400877cafdd98052113fc777e2cfdc  # frozen: v1.51.1
  hooks:
  - id: typos
- repo: local
  hooks:
  - id: mypy
    entry: python tools/pre_commit/mypy.py "3.11"
    language: python
    additional_dependencies: ["mypy==1.20.2", regex, types-PyYAML, "pydantic==2.13.5"]
"""


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "A", "GIT_AUTHOR_EMAIL": "a@example.org",
           "GIT_COMMITTER_NAME": "A", "GIT_COMMITTER_EMAIL": "a@example.org",
           "HOME": str(repo), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=env).stdout


def test_pins_come_from_the_pre_commit_config(tmp_path):
    (tmp_path / uc.PRE_COMMIT_CONFIG).write_text(CONFIG)
    assert uc.pinned_requirements(tmp_path) == [
        "ruff==0.17.2", "typos==1.51.1", "mypy==1.20.2", "regex", "types-PyYAML",
        "pydantic==2.13.5", "PyYAML"]


def test_hook_files_follow_files_exclude_and_types():
    files = ["vllm/a.py", "vllm/third_party/b.py", "tests/test_c.py", ".buildkite/x.yaml",
             "README.md"]
    ruff = {"id": "ruff-check", **uc.HOOK_DEFAULTS["ruff-check"]}
    assert uc.hook_files(ruff, files, "vllm/third_party/.*") == ["vllm/a.py", "tests/test_c.py"]
    tethering = {"id": "t", "files": r"^(tests/.*\.py|\.buildkite/.*\.yaml)$"}
    assert uc.hook_files(tethering, files, "") == ["tests/test_c.py", ".buildkite/x.yaml"]
    only_vllm = {"id": "v", "types": ["python"], "files": "^vllm/", "exclude": "third_party"}
    assert uc.hook_files(only_vllm, files, "") == ["vllm/a.py"]


def test_each_patch_runs_the_tests_it_adds(tmp_path):
    repo = tmp_path / "vllm"
    (repo / "tests" / "b").mkdir(parents=True)
    (repo / "tests" / "b" / "test_old.py").write_text("def test_kept():\n    pass\n")
    _git(repo.parent, "init", "-q", "-b", "baseline", str(repo))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    _git(repo, "tag", uc.BASELINE_TAG)
    _git(repo, "checkout", "-qb", uc.FORK_BRANCH)
    (repo / "tests" / "a").mkdir()
    (repo / "tests" / "a" / "test_new.py").write_text("def test_x():\n    pass\n")
    (repo / "tests" / "a" / "helpers.py").write_text("X = 1\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "[A] first")
    with open(repo / "tests" / "b" / "test_old.py", "a") as fh:
        fh.write("\n\ndef test_added():\n    pass\n")
    _git(repo, "commit", "-qam", "[B] second")
    first, second = uc.patch_tests(repo)
    assert (first.number, first.subject, first.nodes, first.support) == (
        "0001", "[A] first", ["tests/a/test_new.py"], ["tests/a/helpers.py"])
    assert second.nodes == ["tests/b/test_old.py::test_added"]
    assert uc.changed_files(repo) == ["tests/a/helpers.py", "tests/a/test_new.py",
                                      "tests/b/test_old.py"]


def test_junit_outcomes_fold_parametrized_cases(tmp_path):
    junit = tmp_path / "r.xml"
    junit.write_text(
        '<testsuites><testsuite>'
        '<testcase file="tests/t.py" name="test_a[1]"/>'
        '<testcase file="tests/t.py" name="test_a[2]"><failure message="x"/></testcase>'
        '<testcase file="tests/t.py" name="test_b"><skipped/></testcase>'
        '<testcase file="tests/t.py" name="test_c"/>'
        '</testsuite></testsuites>')
    assert uc._outcomes(junit) == {"tests/t.py::test_a": "failed",
                                   "tests/t.py::test_b": "skipped",
                                   "tests/t.py::test_c": "passed"}


def test_junit_results_keep_the_first_line_of_each_message(tmp_path):
    junit = tmp_path / "r.xml"
    junit.write_text(
        '<testsuites><testsuite>'
        '<testcase file="tests/t.py" name="test_a"><failure message="AssertionError: x&#10;'
        'more"/></testcase>'
        '<testcase file="tests/t.py" name="test_b"><skipped message="needs CUDA"/></testcase>'
        '<testcase file="tests/t.py" name="test_c"><error>ImportError: y</error></testcase>'
        '</testsuite></testsuites>')
    assert uc._results(junit) == {"tests/t.py::test_a": ("failed", "AssertionError: x"),
                                  "tests/t.py::test_b": ("skipped", "needs CUDA"),
                                  "tests/t.py::test_c": ("failed", "ImportError: y")}


def test_junit_results_say_what_failed_in_a_spawned_process(tmp_path):
    # torch.multiprocessing's header names no error; the child's last exception line does
    junit = tmp_path / "r.xml"
    junit.write_text(
        '<testsuites><testsuite>'
        '<testcase file="tests/t.py" name="test_a"><failure message="torch.multiprocessing.'
        'spawn.ProcessRaisedException: &#10;&#10;-- Process 1 terminated with the following '
        'error:&#10;Traceback (most recent call last):&#10;  File &quot;x.py&quot;, line 3, '
        'in _worker&#10;    from a import b&#10;ImportError: cannot import name \'b\' from '
        '\'a\'"/></testcase>'
        '</testsuite></testsuites>')
    assert uc._results(junit) == {
        "tests/t.py::test_a": ("failed", "torch.multiprocessing.spawn.ProcessRaisedException: "
                               "ImportError: cannot import name 'b' from 'a'")}

def test_junit_results_say_what_a_header_only_first_line_announces(tmp_path):
    junit = tmp_path / "r.xml"
    junit.write_text(
        '<testsuites><testsuite>'
        '<testcase file="tests/t.py" name="test_a"><failure message="pydantic_core.'
        'ValidationError: 1 validation error for SpeculativeConfig [+2 more lines; full '
        'report in element text]">def test_a():&#10;E   pydantic_core.ValidationError: 1 '
        'validation error for SpeculativeConfig&#10;E     Value error, Model architectures '
        '[\'X\'] are not supported&#10;E       For further information</failure></testcase>'
        '<testcase file="tests/t.py" name="test_b"><failure message="AssertionError: '
        'Regex pattern did not match.&#10;  Regex: \'a\'&#10;  Input: \'b\'"/></testcase>'
        '<testcase file="tests/t.py" name="test_c"><failure message="AssertionError: '
        'Regex pattern did not match."/></testcase>'
        '</testsuite></testsuites>')
    assert uc._results(junit) == {
        "tests/t.py::test_a": ("failed", "pydantic_core.ValidationError: 1 validation error "
                               "for SpeculativeConfig Value error, Model architectures "
                               "['X'] are not supported"),
        "tests/t.py::test_b": ("failed", "AssertionError: Regex pattern did not match. "
                               "Input: 'b'"),
        "tests/t.py::test_c": ("failed", "AssertionError: Regex pattern did not match.")}


P, F, S = ("passed", ""), ("failed", "AssertionError: stock"), ("skipped", "lacks X")


@pytest.mark.parametrize(("patched", "stock", "findings"), [
    ({"a": P, "b": P}, {"a": F, "b": P}, []),  # the fix fails on stock, a pin passes on both
    ({"a": P}, {"a": F}, []),
    # a skip on stock is not a failure there, even next to one that fails
    ({"a": P}, {"a": S}, ["a: skipped on stock v0.34.0 (lacks X)",
                          "no test fails on stock v0.34.0"]),
    ({"a": P, "b": P}, {"a": F, "b": S}, ["b: skipped on stock v0.34.0 (lacks X)"]),
    ({"a": P}, {"a": P}, ["no test fails on stock v0.34.0"]),
    ({"a": P, "b": P}, {"a": F}, ["b: did not run on stock v0.34.0"]),
    ({"a": P, "b": S}, {"a": F, "b": F}, ["b: skipped on the patched tree (lacks X)"]),
    ({"a": F}, {"a": F}, ["a: failed on the patched tree (AssertionError: stock)"]),
    ({}, {}, ["no test of this patch ran on the patched tree",
              "no test fails on stock v0.34.0"]),
])
def test_pass_fail_rule(patched, stock, findings):
    assert uc.patch_verdict(patched, stock) == findings


def test_one_patch_with_a_finding_fails_the_check_and_shows_stock_messages(capsys):
    rows = [{"patch": "0001", "subject": "[A] a", "tests": ["t.py"], "patched": {"t::a": "passed"},
             "stock": {"t::a": {"outcome": "failed", "message": "ValueError: refused"}},
             "findings": [], "ok": True},
            {"patch": "0002", "subject": "[B] b", "tests": ["u.py"], "patched": {"u::b": "passed"},
             "stock": {"u::b": {"outcome": "skipped", "message": "lacks X"}},
             "findings": ["u::b: skipped on stock v0.34.0"], "ok": False}]
    assert uc.print_tests(rows) == 1
    out = capsys.readouterr().out
    assert "stock failed  t::a: ValueError: refused" in out
    assert "0002 FINDING [B] b" in out and "FINDING u::b: skipped on stock v0.34.0" in out
    assert uc.print_tests(rows[:1]) == 0


@pytest.mark.parametrize(("argv", "message"), [
    ([], "usage: upstream_check"),
    (["lint", "x"], "usage: upstream_check"),
    (["pins", "{missing}"], "no .pre-commit-config.yaml (not a vLLM tree)"),
    (["hooks", "{tree}"], "hooks: expected TREE and one more argument"),
    (["pins", "{no_pins}"], "no frozen version for astral-sh/ruff-pre-commit"),
])
def test_bad_inputs_exit_2_with_one_line(tmp_path, capsys, argv, message):
    tree, no_pins = tmp_path / "tree", tmp_path / "no_pins"
    for d, text in ((tree, CONFIG), (no_pins, "repos: []\n")):
        d.mkdir()
        (d / uc.PRE_COMMIT_CONFIG).write_text(text)
    argv = [a.format(missing=tmp_path / "missing", tree=tree, no_pins=no_pins) for a in argv]
    assert uc.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("upstream-check: ") and err.count("\n") == 1


# `nox -s upstream-check -- ARGS`: the session takes none; each is refused in one line.
@pytest.mark.parametrize(("posargs", "message"), [
    (["--author", ""], "unknown argument '--author'"),
    ([""], "empty argument ''"),
    (["  "], "empty argument '  '"),
    (["--stock"], "unknown argument '--stock'"),
    (["tests/v1"], "unknown argument 'tests/v1'"),
])
def test_session_arguments_are_refused_in_one_line(posargs, message):
    with pytest.raises(uc.UsageError) as err:
        uc.session_args(posargs)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert "takes no arguments" in str(err.value)


def test_no_session_arguments_is_accepted():
    uc.session_args([])


def test_session_refuses_arguments_before_any_work(tmp_path):
    """Through nox itself: the refusal comes before the check's environment is made."""
    nox = shutil.which("nox")
    if nox is None:
        pytest.skip("nox is not on PATH")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [nox, "-f", str(root / "noxfile.py"), "-s", "upstream-check",
         "--", "--author", ""], capture_output=True, text=True, timeout=120,
        env={**os.environ, "VLLM_KIMI_EXT_ENV": str(tmp_path / "no-env")})
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if "upstream-check: " in line]
    assert len(lines) == 1 and "unknown argument '--author'" in lines[0]
    assert "creating project environment" not in proc.stderr
    assert not (tmp_path / "no-env").exists()


@pytest.mark.parametrize(("hooks", "tests", "failure"), [
    (0, 0, None),
    (1, 0, "upstream-check: a hook failed"),
    (0, 1, "upstream-check: a per-patch test check failed"),
    (1, 1, "upstream-check: a hook failed; a per-patch test check failed"),
])
def test_session_fails_on_either_step(hooks, tests, failure):
    assert uc.session_failure(hooks, tests) == failure


def _junit(path: Path, outcomes: dict[str, str]) -> None:
    cases = "".join(
        f'<testcase file="{node.split("::")[0]}" name="{node.split("::")[1]}">'
        + ("<failure message=\"AssertionError: stock\"/>" if o == "failed" else "")
        + "</testcase>" for node, o in outcomes.items())
    path.write_text(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")


@pytest.mark.parametrize(("stock", "rc", "ok"), [
    ({"tests/a.py::test_a": "failed", "tests/b.py::test_b": "failed"}, 0, [True, True]),
    # patch 0002's only test passes on stock: the whole check fails
    ({"tests/a.py::test_a": "failed", "tests/b.py::test_b": "passed"}, 1, [True, False]),
])
def test_run_tests_exit_code_follows_each_patch(tmp_path, monkeypatch, capsys, stock, rc,
                                                 ok):
    """run_tests end to end (pytest, git and the stock worktree replaced by their results):
    its exit code and report follow every patch's verdict."""
    patches = [uc.PatchTests("0001", "[A] a", ["tests/a.py"], [], ["tests/a.py"]),
               uc.PatchTests("0002", "[B] b", ["tests/b.py"], [], ["tests/b.py"])]
    patched = dict.fromkeys(stock, "passed")
    monkeypatch.setattr(uc, "patch_tests", lambda tree: patches)
    monkeypatch.setattr(uc, "_git", lambda tree, *args: "")
    monkeypatch.setattr(uc, "_git_bytes", lambda tree, spec: b"")
    monkeypatch.setattr(uc, "_pytest", lambda tree, nodes, junit, extra: _junit(
        junit, stock if tree.name == "stock" else patched) or 0)
    report = tmp_path / "report.json"
    assert uc.run_tests(tmp_path / "tree", report) == rc
    rows = json.loads(report.read_text())
    assert [r["ok"] for r in rows] == ok
    out = capsys.readouterr().out
    assert ("FINDING no test fails on stock v0.34.0" in out) is (rc == 1)
