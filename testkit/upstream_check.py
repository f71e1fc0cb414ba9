"""``nox -s upstream-check``: vLLM's own pre-commit hooks and per-patch tests on the series.

Standard library only (PyYAML is imported lazily, by ``hooks`` only): the ``hooks`` step runs
in the check's own environment (the tool versions pinned by vLLM 0.34.0's
``.pre-commit-config.yaml``), the ``tests`` step in the project environment (it imports vLLM).

    python -m testkit.upstream_check pins  TREE           # what to install
    python -m testkit.upstream_check hooks TREE BIN_DIR   # run the hooks
    python -m testkit.upstream_check tests TREE REPORT    # per-patch tests

``TREE`` is the prepared vLLM tree (tag ``v0.34.0`` = the sdist, branch ``kimi-ext`` = one
commit per patch). Exit status: 0 clean, 1 findings (a hook failed, a test failed on the
patched tree or passed on the stock one), 2 usage or unreadable input.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

BASELINE_TAG = "v0.34.0"
FORK_BRANCH = "kimi-ext"
PRE_COMMIT_CONFIG = ".pre-commit-config.yaml"
#: Repositories of .pre-commit-config.yaml whose hook is a PyPI package of the same
#: version (the `# frozen: vX.Y.Z` comment next to the pinned commit).
PINNED_REPOS = {"astral-sh/ruff-pre-commit": "ruff", "crate-ci/typos": "typos"}
#: pre-commit `types` / `types_or` tags, by file suffix (only those the hooks use).
TYPE_SUFFIXES = {
    "python": (".py",), "pyi": (".pyi",), "jupyter": (".ipynb",), "rust": (".rs",),
    "proto": (".proto",), "png": (".png",), "c++": (".cpp", ".cc", ".h", ".hpp", ".cuh"),
    "cuda": (".cu", ".cuh"), "markdown": (".md",), "yaml": (".yaml", ".yml"),
    "json": (".json",), "shell": (".sh",),
}
#: File filters that remote hooks declare in their own repository's .pre-commit-hooks.yaml
#: (pre-commit merges them under the config's entries).
HOOK_DEFAULTS = {
    "ruff-check": {"types_or": ["python", "pyi", "jupyter"]},
    "ruff-format": {"types_or": ["python", "pyi", "jupyter"]},
    "clang-format": {"types_or": ["c++", "cuda"]},
    "markdownlint-cli2": {"types": ["markdown"]},
    "actionlint": {"files": r"^\.github/workflows/"},
    "shellcheck": {"types": ["shell"]},
}
#: Hooks that need something this check does not have, with the reason.
CANNOT_RUN = {
    "clang-format": "needs clang-format (a node of the pre-commit mirror); C++/CUDA only",
    "markdownlint-cli2": "needs Node.js and the markdownlint-cli2 package from npm",
    "actionlint": "needs the actionlint Go binary",
    "shellcheck": "needs the shellcheck binary",
    "pip-compile": "resolves requirements against the package index (network, uv)",
    "png-lint": "needs ImageMagick",
    "test-nonroot-entrypoint": "needs a Docker image",
    "validate-docker-versions": "needs dockerfile-parse and the docker/ build context",
    "check-kv-connector-lock": "resolves the KV-connector lock against the package index",
    "rust-cargo-autoinherit": "needs cargo", "rust-cargo-sort": "needs cargo",
    "rust-cargo-fmt": "needs cargo",
}


class UsageError(Exception):
    """Bad arguments or an unreadable tree (exit 2)."""


def session_args(posargs: list[str]) -> None:
    """``nox -s upstream-check -- ARGS``: the session takes no arguments; refuse any
    (an empty one named as such) before anything is installed or run."""
    for arg in posargs:
        kind = "empty argument" if not arg.strip() else "unknown argument"
        raise UsageError(f"{kind} {arg!r}: the session takes no arguments "
                         "(it checks the series of the tree apply-patches prepared)")


def session_failure(hooks_rc: int, tests_rc: int) -> str | None:
    """What fails the session, from the two steps' exit codes (None: it passes). A
    per-patch finding (exit 1 of ``tests``: a new test that passes on stock or fails
    patched) fails it as much as a hook does."""
    why = [what for what, rc in (("a hook failed", hooks_rc),
                                 ("a per-patch test check failed", tests_rc)) if rc]
    return "upstream-check: " + "; ".join(why) if why else None


def _git(tree: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True)
    if proc.returncode:
        raise UsageError(f"git {' '.join(args)} failed in {tree}: {proc.stderr.strip()}")
    return proc.stdout


def series_commits(tree: Path) -> list[tuple[str, str]]:
    """(sha, subject) of each patch commit, in order."""
    out = _git(tree, "log", "--reverse", "--format=%H %s", f"{BASELINE_TAG}..{FORK_BRANCH}")
    return [tuple(line.split(" ", 1)) for line in out.splitlines()]  # type: ignore[misc]


def changed_files(tree: Path) -> list[str]:
    """Files the series adds or changes (deleted ones are not checked)."""
    out = _git(tree, "diff", "--name-only", "--diff-filter=d", "--no-renames",
               f"{BASELINE_TAG}..{FORK_BRANCH}")
    return out.splitlines()


# --------------------------------------------------------------------------- #
# pins                                                                          #
# --------------------------------------------------------------------------- #


def pinned_requirements(tree: Path) -> list[str]:
    """pip requirements of the hooks, read from the tree's .pre-commit-config.yaml:
    ruff and typos at their frozen versions, mypy's hook with its stated extras, and
    the PyYAML and regex the local check hooks declare."""
    path = tree / PRE_COMMIT_CONFIG
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror})") from exc
    reqs = []
    for repo, package in PINNED_REPOS.items():
        m = re.search(rf"- repo: https://github\.com/{re.escape(repo)}\n\s+rev: \S+\s+#\s*"
                      r"frozen: v?([\w.]+)", text)
        if not m:
            raise UsageError(f"{path}: no frozen version for {repo}")
        reqs.append(f"{package}=={m.group(1)}")
    m = re.search(r"entry: python tools/pre_commit/mypy\.py.*?additional_dependencies: "
                  r"\[(.*?)\]", text, re.S)
    if not m:
        raise UsageError(f"{path}: no additional_dependencies for the mypy hook")
    reqs += [d.strip().strip("\"'") for d in m.group(1).split(",") if d.strip()]
    return list(dict.fromkeys([*reqs, "PyYAML", "regex"]))


# --------------------------------------------------------------------------- #
# hooks                                                                         #
# --------------------------------------------------------------------------- #


@dataclass
class HookResult:
    hook: str
    status: str  # pass | FAIL | not run | not applicable
    why: str = ""
    output: str = ""


def _types_match(path: str, types: list[str]) -> bool:
    return any(path.endswith(TYPE_SUFFIXES.get(t, ("\0",))) for t in types)


def hook_files(hook: dict, files: list[str], global_exclude: str) -> list[str]:
    """The changed files pre-commit would pass to ``hook``."""
    out = []
    for f in files:
        if global_exclude and re.search(global_exclude, f):
            continue
        if hook.get("files") and not re.search(hook["files"], f):
            continue
        if hook.get("exclude") and re.search(hook["exclude"], f):
            continue
        if hook.get("types") and not all(_types_match(f, [t]) for t in hook["types"]):
            continue
        if hook.get("types_or") and not _types_match(f, hook["types_or"]):
            continue
        out.append(f)
    return out


def _run(cmd: list[str], tree: Path, env: dict) -> tuple[int, str]:
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _signoff_findings(tree: Path) -> list[str]:
    """The signoff-commit hook, for the series: each commit message carries
    ``Signed-off-by:`` its author."""
    out = []
    for sha, subject in series_commits(tree):
        author = _git(tree, "log", "-1", "--format=%an <%ae>", sha).strip()
        body = _git(tree, "log", "-1", "--format=%B", sha)
        if f"Signed-off-by: {author}" not in body:
            out.append(f"{subject}: no 'Signed-off-by: {author}'")
    return out


def _hook_command(hook: dict, files: list[str], python: str) -> list[str] | None:
    """The command line for a hook this check knows how to run, or None."""
    hid = hook["id"]
    if hid == "ruff-check":
        return ["ruff", "check", "--output-format", "concise", *files]
    if hid == "ruff-format":
        return ["ruff", "format", "--check", *files]
    if hid == "typos":
        return ["typos", "--force-exclude", *files]
    entry = hook.get("entry", "")
    if hook.get("language") == "script":
        return ["bash", *entry.split(), *(files if hook.get("pass_filenames", True) else [])]
    if hook.get("language") == "python" and entry.startswith("python "):
        args = re.findall(r'"[^"]*"|\S+', entry)[1:]
        return [python, *[a.strip('"') for a in args],
                *(files if hook.get("pass_filenames", True) else [])]
    return None


def run_hooks(tree: Path, bin_dir: Path) -> list[HookResult]:
    import yaml  # the check's environment has it (pinned_requirements)

    config = yaml.safe_load((tree / PRE_COMMIT_CONFIG).read_text())
    files = changed_files(tree)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    python = str(bin_dir / "python")
    results: list[HookResult] = []
    for repo in config["repos"]:
        for hook in repo["hooks"]:
            hook = {**HOOK_DEFAULTS.get(hook["id"], {}), **hook}
            hid = hook.get("alias", hook["id"])
            stages = hook.get("stages") or config.get("default_stages") or []
            if hid == "signoff-commit":
                found = _signoff_findings(tree)
                results.append(HookResult(hid, "FAIL" if found else "pass",
                                          "commit-msg stage: checked on each series commit",
                                          "\n".join(found)))
                continue
            if hid == "suggestion":
                results.append(HookResult(hid, "not applicable", "prints a hint only"))
                continue
            if stages and "manual" not in stages and "pre-commit" not in stages:
                results.append(HookResult(hid, "not applicable", f"stages {stages}"))
                continue
            matched = files if hook.get("always_run") else hook_files(
                hook, files, config.get("exclude", ""))
            if not matched:
                why = "no file the series changes matches it"
                if hook["id"] in CANNOT_RUN:
                    why += f" (could not run here: {CANNOT_RUN[hook['id']]})"
                results.append(HookResult(hid, "not applicable", why))
                continue
            if hid == "check-filenames":
                spaced = [f for f in files if " " in f]
                results.append(HookResult(hid, "FAIL" if spaced else "pass", "",
                                          "\n".join(spaced)))
                continue
            cmd = None if hook["id"] in CANNOT_RUN else _hook_command(hook, matched, python)
            if cmd is None:
                why = CANNOT_RUN.get(hook["id"], f"language {hook.get('language')!r} "
                                     "is not run by this check")
                results.append(HookResult(hid, "not run", why))
                continue
            rc, output = _run(cmd, tree, env)
            results.append(HookResult(hid, "pass" if rc == 0 else "FAIL",
                                      f"{len(matched)} file(s)", output))
    return results


# --------------------------------------------------------------------------- #
# tests                                                                         #
# --------------------------------------------------------------------------- #


@dataclass
class PatchTests:
    number: str
    subject: str
    files: list[str] = field(default_factory=list)  # test modules it adds or extends
    support: list[str] = field(default_factory=list)  # other files it changes under tests/
    nodes: list[str] = field(default_factory=list)  # what to run: files or file::test


def patch_tests(tree: Path) -> list[PatchTests]:
    """Per patch, the vLLM tests it adds: a new ``tests/**/test_*.py`` whole, the
    ``def test_*`` functions it adds to an existing one."""
    out = []
    for i, (sha, subject) in enumerate(series_commits(tree), 1):
        pt = PatchTests(f"{i:04d}", subject)
        status = _git(tree, "diff-tree", "--no-commit-id", "-r", "--name-status", sha)
        for line in status.splitlines():
            kind, path = line.split("\t", 1)
            if not path.startswith("tests/") or kind == "D":
                continue
            if not re.search(r"(^|/)test_[^/]*\.py$", path):
                pt.support.append(path)
                continue
            pt.files.append(path)
            if kind == "A":
                pt.nodes.append(path)
                continue
            diff = _git(tree, "show", "--format=", sha, "--", path)
            pt.nodes += [f"{path}::{name}" for name in
                         re.findall(r"^\+def (test_\w+)\(", diff, re.M)]
        out.append(pt)
    return out


# First lines that only announce the error; the line that says it follows. pytest's
# junit-xml shortens a long message attribute to its first line plus this suffix.
_HEADER_ONLY = re.compile(r"(\d+ validation errors? for \w+|Regex pattern did not match\.)")
_SHORTENED = re.compile(r"\s*\[\+\d+ more lines?; full report in element text\]$")
_SAYS = ("Input:", "Actual message:", "Value error,")
# A failure in a spawned process (torch.multiprocessing): the header names no error; the
# child's traceback ends with the exception that says it.
_CHILD_FAILED = re.compile(r"ProcessRaisedException:?\s*$")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)(:|$)")


def _first_line(message: str, text: str = "") -> str:
    """The failure's first line (200 characters at most); for a pydantic validation error
    or a ``pytest.raises(match=...)`` mismatch, whose first line says nothing, joined with
    the line that does (pydantic's ``Value error, ...``, pytest's ``Input:`` / ``Actual
    message:``), looked up in the message and in the report's ``E`` lines; for a failure
    in a spawned process, joined with the last exception line of the child's traceback."""
    e_lines = [line[1:].strip() for line in text.splitlines()
               if line.startswith("E ") and line[1:].strip()]
    lines = [line.strip() for line in (message or text).strip().splitlines() if line.strip()]
    if not message and e_lines:
        lines = e_lines
    if not lines:
        return ""
    first = _SHORTENED.sub("", lines[0])
    if _CHILD_FAILED.search(first):
        raised = [line for line in lines[1:] + e_lines if _EXCEPTION_LINE.match(line)]
        if raised:
            first = f"{first.rstrip(': ')}: {raised[-1]}"
    elif _HEADER_ONLY.search(first):
        more = lines[1:] + e_lines
        said = next((line for line in more if line.startswith(_SAYS)), None)
        if said:
            first = f"{first} {said}"
    return first[:200]


def _results(junit: Path) -> dict[str, tuple[str, str]]:
    """``file::test`` -> (passed / failed / skipped, the first line of the failure, error
    or skip message), from a pytest junit-xml report (parametrized cases folded into their
    function: the worst case wins, failed over skipped over passed)."""
    out: dict[str, tuple[str, str]] = {}
    rank = {"passed": 0, "skipped": 1, "failed": 2}
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
        name = case.get("name", "").split("[", 1)[0]
        outcome, detail = "passed", None
        for tag, kind in (("failure", "failed"), ("error", "failed"), ("skipped", "skipped")):
            detail = case.find(tag)
            if detail is not None:
                outcome = kind
                break
        message = ""
        if detail is not None:
            message = _first_line(detail.get("message") or "", detail.text or "")
        key = f"{path}::{name}"
        if key not in out or rank[outcome] > rank[out[key][0]]:
            out[key] = (outcome, message)
    return out


def _outcomes(junit: Path) -> dict[str, str]:
    """``file::test`` -> passed / failed / skipped (see :func:`_results`)."""
    return {k: v[0] for k, v in _results(junit).items()}


def _pytest(tree: Path, nodes: list[str], junit: Path, extra_path: str) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(tree), extra_path) if p), "VLLM_TARGET_DEVICE": "cpu"}
    # testkit.upstream_cpu: VllmConfig on a GPU-less x86 machine (both trees alike)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
           "testkit.upstream_cpu", "-o", "addopts=",
           "--rootdir", str(tree), "--timeout", "600", "-o", "junit_family=xunit1",
           f"--junitxml={junit}", *nodes]
    print("$ (cd", tree, "&&", " ".join(cmd[1:]) + ")", flush=True)
    return subprocess.run(cmd, cwd=tree, env=env).returncode


def _node_results(pt: PatchTests, results: dict[str, tuple[str, str]]
                  ) -> dict[str, tuple[str, str]]:
    """The results of the test functions ``pt`` adds (a whole file: every function in it)."""
    found = {}
    for node in pt.nodes:
        prefix = node if "::" in node else node + "::"
        found.update({k: v for k, v in results.items() if k == node or k.startswith(prefix)})
    return found


def patch_verdict(patched: dict[str, tuple[str, str]], stock: dict[str, tuple[str, str]]
                  ) -> list[str]:
    """Why a patch's vLLM-tree tests do not show it (empty: they do). On the patched tree
    every test function must have run and passed; on stock v0.34.0 (same test files) at
    least one must fail, and none may be skipped: a skip there means the test could not
    run on stock, which is not "fails on stock" and hides what the patch fixes."""
    why = []
    if not patched:
        why.append("no test of this patch ran on the patched tree")
    why += [f"{k}: {o} on the patched tree" + (f" ({m})" if m else "")
            for k, (o, m) in sorted(patched.items()) if o != "passed"]
    missing = sorted(set(patched) - set(stock))
    why += [f"{k}: did not run on stock v0.34.0" for k in missing]
    why += [f"{k}: skipped on stock v0.34.0" + (f" ({m})" if m else "")
            for k, (o, m) in sorted(stock.items()) if o == "skipped"]
    if not any(o == "failed" for o, _ in stock.values()):
        why.append("no test fails on stock v0.34.0")
    return why


def run_tests(tree: Path, report: Path) -> int:
    """Every test the series adds, on the patched tree (must pass) and on a stock
    worktree at the baseline with the same test files copied in (must fail)."""
    patches = patch_tests(tree)
    nodes = [n for pt in patches for n in pt.nodes]
    scratch = Path(tempfile.mkdtemp(prefix="upstream-check-"))
    stock = scratch / "stock"
    try:
        _pytest(tree, nodes, scratch / "patched.xml", os.environ.get("PYTHONPATH", ""))
        patched = _results(scratch / "patched.xml")
        _git(tree, "worktree", "add", "-q", "--detach", str(stock), BASELINE_TAG)
        for pt in patches:
            for rel in pt.files + pt.support:
                (stock / rel).parent.mkdir(parents=True, exist_ok=True)
                (stock / rel).write_bytes(_git_bytes(tree, f"{FORK_BRANCH}:{rel}"))
        _pytest(stock, nodes, scratch / "stock.xml", os.environ.get("PYTHONPATH", ""))
        on_stock = _results(scratch / "stock.xml")
    finally:
        subprocess.run(["git", "-C", str(tree), "worktree", "remove", "--force", str(stock)],
                       capture_output=True)
        subprocess.run(["git", "-C", str(tree), "worktree", "prune"], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    rows = []
    for pt in patches:
        on_p, on_s = _node_results(pt, patched), _node_results(pt, on_stock)
        why = patch_verdict(on_p, on_s)
        rows.append({"patch": pt.number, "subject": pt.subject, "tests": pt.nodes,
                     "patched": {k: o for k, (o, _) in sorted(on_p.items())},
                     "stock": {k: {"outcome": o, "message": m}
                               for k, (o, m) in sorted(on_s.items())},
                     "findings": why, "ok": not why})
    report.write_text(json.dumps(rows, indent=2) + "\n")
    return print_tests(rows)


def print_tests(rows: list[dict]) -> int:
    """Per patch: the verdict, then each test function's outcome on stock v0.34.0 with its
    failure message (why it fails there), then the findings. 1 if any patch has one."""
    print("\nper patch: vLLM-tree tests on the patched tree / on stock v0.34.0")
    for r in rows:
        verdict = "ok" if r["ok"] else "FINDING"
        counts = {o: list(r["patched"].values()).count(o) for o in set(r["patched"].values())}
        print(f"  {r['patch']} {verdict:7s} {r['subject']}  (patched: {counts})")
        for test, res in r["stock"].items():
            message = f": {res['message']}" if res["message"] else ""
            print(f"      stock {res['outcome']:7s} {test}{message}")
        for why in r["findings"]:
            print(f"      FINDING {why}")
    return 1 if any(not r["ok"] for r in rows) else 0


def _git_bytes(tree: Path, spec: str) -> bytes:
    proc = subprocess.run(["git", "-C", str(tree), "show", spec], capture_output=True)
    if proc.returncode:
        raise UsageError(f"git show {spec} failed in {tree}")
    return proc.stdout


def print_hooks(results: list[HookResult]) -> int:
    width = max(len(r.hook) for r in results)
    print("vLLM 0.34.0 pre-commit hooks on the files the series changes")
    for r in results:
        print(f"  {r.hook:<{width}}  {r.status:<14} {r.why}")
    for r in results:
        if r.status == "FAIL":
            print(f"\n--- {r.hook} ---\n{r.output}")
    return 1 if any(r.status == "FAIL" for r in results) else 0


def main(argv: list[str]) -> int:
    try:
        if len(argv) < 2 or argv[0] not in ("pins", "hooks", "tests"):
            raise UsageError("usage: upstream_check pins TREE | hooks TREE BIN_DIR | "
                             "tests TREE REPORT")
        tree = Path(argv[1])
        if not (tree / PRE_COMMIT_CONFIG).is_file():
            raise UsageError(f"{tree}: no {PRE_COMMIT_CONFIG} (not a vLLM tree)")
        if argv[0] == "pins":
            print("\n".join(pinned_requirements(tree)))
            return 0
        if len(argv) != 3:
            raise UsageError(f"{argv[0]}: expected TREE and one more argument")
        if argv[0] == "hooks":
            return print_hooks(run_hooks(tree, Path(argv[2])))
        return run_tests(tree, Path(argv[2]))
    except UsageError as exc:
        print(f"upstream-check: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # A terminated run still removes its stock worktree (the `finally` in run_tests).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main(sys.argv[1:]))
