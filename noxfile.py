"""Sessions: apply-patches, test, upstream-tests, upstream-check, bench, docs, lint.

All sessions share one project environment (default ``.venv``, override with
``VLLM_KIMI_EXT_ENV``): ``apply-patches`` creates it and installs the patched
vLLM 0.34.0 tree editable together with this package; the other sessions run
in it. Activate it (``source .venv/bin/activate``) to run ``vllm serve``.

A bare ``nox`` is cheap: ``lint`` and ``test`` in the existing environment (it
never fetches or rebuilds vLLM; without an environment it says to run
``nox -s apply-patches`` first).

    nox                                       # lint + test
    nox -s apply-patches                      # fetch sdist, apply series, install
    nox -s apply-patches -- --vllm-src PATH   # use your own git checkout instead
    nox -s apply-patches -- --check           # dry run against the baseline
    nox -s apply-patches -- --export          # fork branch commits -> patches/ + series.json
    nox -s apply-patches -- --export --author 'Name <email>'   # sign-off (default: git config)
    nox -s test [-- PYTEST ARGS]              # CPU tier, 2 workers (GPU tests skip cleanly)
    nox -s upstream-tests                     # vLLM's own spec-decode/sampler tests
    nox -s upstream-check                     # vLLM's pre-commit hooks + per-patch vLLM tests
    nox -s bench                              # what this machine can measure
    nox -s docs [-- --check]                  # regenerate every generated document
    nox -s mutants [-- --sample N --minutes M]  # mutation testing (not in CI; slow)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from bench.harness.generated_docs import GENERATORS as DOC_GENERATORS  # stdlib only
from vllm_kimi_ext import envs, patchset, vllm_build  # noqa: E402  (stdlib-only modules)

nox.options.sessions = ["lint", "test"]
nox.options.default_venv_backend = "none"

ENV_DIR = Path(envs.PROJECT_ENV.get() or ROOT / ".venv")
BUILD_DIR = ROOT / "build"
DEFAULT_TREE = BUILD_DIR / f"vllm-{patchset.VLLM_VERSION}"
PATCH_DIR = ROOT / "patches" / f"vllm-{patchset.VLLM_VERSION}"
SHIPPED_SERIES = ROOT / "vllm_kimi_ext" / patchset.SHIPPED_SERIES  # package data
TREE_POINTER = BUILD_DIR / "vllm-src"  # records which tree apply-patches used
TORCH_PIN = "torch==2.13.0"  # vLLM 0.34.0 pins 2.14.0 for CUDA; 2.13.0 runs it on CPU
TORCH_CUDA_PIN = "torch==2.14.0"  # requirements/cuda.txt of vLLM 0.34.0 (kernels built for it)
# What vLLM's own tests import beyond vLLM's runtime requirements (its conftest
# uses tblib; async tests need pytest-asyncio; a timeout guards hangs).
UPSTREAM_TEST_REQUIREMENTS = ["tblib", "pytest-asyncio", "pytest-timeout"]
# vLLM tests that cannot run here, each with its reason (read by the upstream-tests plugin).
UPSTREAM_DESELECT_LIST = ROOT / "tests" / "upstream" / "deselect.txt"
# The training stack: the project's `train` extra (what the training commands import
# beyond vLLM), then speculators 0.9.0 without its declared dependencies, which would
# replace torch (<= 2.14.1, with CUDA torchvision/torchaudio) and lower transformers to
# 5.19; its EAGLE-3 path needs none of them (tests/vllm/test_train_install.py). Users
# install the same two steps (docs/training-a-draft.md).
TRAIN_NO_DEPS = ["speculators==0.9.0"]
# Mutation testing (`nox -s mutants`): installed in that session's own environment only.
MUTATION_TOOL = "cosmic-ray==8.7.0"
# The CPU tier on 2 pytest-xdist workers (CI has 2 cores; most tests are one thread: the
# Triton interpreter, small torch ops); a file's tests stay in one worker, so its
# module-scoped engines and checkpoints are built once.
XDIST_ARGS = ["-n", "2", "--dist", "loadfile"]
# No model hub here: fail fast instead of retrying with back-off.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _py() -> str:
    return str(ENV_DIR / "bin" / "python")


def _pip(session: nox.Session, *args: str, env: dict | None = None) -> None:
    """pip install into the project environment; one install at a time (a lock file in
    build/): ``.ci/run`` runs upstream-tests and upstream-check side by side, and both
    install their test requirements."""
    import fcntl

    BUILD_DIR.mkdir(exist_ok=True)
    with open(BUILD_DIR / ".pip.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        session.run(_py(), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args,
                    env=env, external=True)


def _ensure_env(session: nox.Session) -> None:
    if not (ENV_DIR / "bin" / "python").exists():
        session.log(f"creating project environment {ENV_DIR}")
        session.run(sys.executable, "-m", "venv", str(ENV_DIR), external=True)
        _pip(session, "--upgrade", "pip")


def _require_env(session: nox.Session) -> None:
    if not (ENV_DIR / "bin" / "python").exists():
        session.error(f"no project environment at {ENV_DIR}: create it with "
                      "`nox -s apply-patches` (or point VLLM_KIMI_EXT_ENV at an existing one)")


def _cuda_available() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0


def _tree() -> Path:
    if TREE_POINTER.exists():
        return Path(TREE_POINTER.read_text().strip())
    return DEFAULT_TREE


def _installed_from(tree: Path) -> bool:
    """Is vllm in the env already an editable install of ``tree``?"""
    code = ("import json,sys\nfrom importlib import metadata\n"
            "try:\n d=metadata.distribution('vllm')\nexcept metadata.PackageNotFoundError:\n"
            " sys.exit(1)\nu=json.loads(d.read_text('direct_url.json') or '{}')\n"
            "print(u.get('url',''), u.get('dir_info',{}).get('editable',False))")
    proc = subprocess.run([_py(), "-c", code], capture_output=True, text=True)
    return proc.returncode == 0 and proc.stdout.split()[:2] == [tree.resolve().as_uri(), "True"]


@nox.session(name="apply-patches")
def apply_patches(session: nox.Session) -> None:
    """Prepare the patched vLLM 0.34.0 tree and install it editable."""
    parser = argparse.ArgumentParser(prog="nox -s apply-patches --")
    parser.add_argument("--vllm-src", type=Path, help="an existing git checkout of vLLM "
                        "(must contain tag v0.34.0) instead of the registry sdist")
    parser.add_argument("--check", action="store_true",
                        help="dry-run the series against the baseline; change nothing")
    parser.add_argument("--export", action="store_true",
                        help="regenerate patches/ and vllm_kimi_ext/series.json from the "
                        "fork branch commits")
    parser.add_argument("--author", metavar="'NAME <EMAIL>'",
                        help="with --export: the From: and Signed-off-by: lines of every "
                        "patch (default: git config user.name and user.email)")
    parser.add_argument("--no-install", action="store_true",
                        help="prepare the tree only")
    parser.add_argument("--precompiled-wheel",
                        help="CUDA machines: local vllm-0.34.0 wheel providing the kernels")
    args = parser.parse_args(session.posargs)
    if args.author is not None and not args.export:
        session.error("--author only applies to --export (the command that writes patches)")
    t0 = time.time()
    try:
        if args.vllm_src:
            tree = args.vllm_src.resolve()
            patchset.check_user_tree(tree)
        else:
            tree = _tree()
            if not tree.exists():
                BUILD_DIR.mkdir(exist_ok=True)
                sdist = patchset.fetch_sdist(BUILD_DIR / "cache")
                patchset.create_tree_from_sdist(sdist, tree)
        if args.check:
            names = patchset.check_series(tree, PATCH_DIR)
            session.log(f"--check: all {len(names)} patch(es) apply cleanly to "
                        f"{patchset.BASELINE_TAG}")
            return
        if args.export:
            author = patchset.export_author(args.author, ROOT)
            names = patchset.export_series(tree, PATCH_DIR, SHIPPED_SERIES, author=author)
            session.log(f"--export: {len(names)} patch(es) in {PATCH_DIR}, "
                        f"record in {SHIPPED_SERIES}")
            return
        result = patchset.apply_series(tree, PATCH_DIR)
    except patchset.PatchSetError as exc:
        session.error(str(exc))
    BUILD_DIR.mkdir(exist_ok=True)
    TREE_POINTER.write_text(str(tree) + "\n")
    session.log(f"tree {tree}: {len(result.applied)} patch(es) "
                f"({'applied now' if result.changed else 'unchanged'})")
    if args.no_install:
        return

    _ensure_env(session)
    cuda = _cuda_available()
    try:
        build_env = vllm_build.build_env(cuda_available=cuda,
                                       precompiled_wheel=args.precompiled_wheel)
    except patchset.PatchSetError as exc:
        session.error(str(exc))
    # torch first: a --no-build-isolation install needs it in the environment.
    # GPU-less: the CPU build, which also keeps pip from resolving vLLM's CUDA
    # torch pin; CUDA: the release the precompiled kernels were built against.
    _pip(session, TORCH_CUDA_PIN if cuda else TORCH_PIN)
    _pip(session, *vllm_build.BUILD_REQUIREMENTS)
    if not _installed_from(tree):
        session.log(f"installing {tree} editable ({build_env['VLLM_TARGET_DEVICE']} build)")
        _pip(session, "--no-build-isolation", "-e", str(tree), env=build_env)
    else:
        session.log("vLLM already installed editable from this tree")
    _pip(session, "-e", f"{ROOT}[test,train]")
    _pip(session, "--no-deps", *TRAIN_NO_DEPS)
    session.run(_py(), "-c", "import vllm, vllm_kimi_ext; print('vllm', vllm.__version__, "
                "'+ vllm_kimi_ext', vllm_kimi_ext.__version__)", external=True)
    session.log(f"apply-patches done in {time.time() - t0:.0f} s; "
                f"activate with: source {ENV_DIR}/bin/activate")


def _pytest(session: nox.Session, *args: str, env: dict | None = None) -> None:
    """Run pytest in the project env; exit 5 (nothing collected) is an error."""
    _require_env(session)
    session.run(_py(), "-m", "pytest", *args, external=True,
                env={"VLLM_TARGET_DEVICE": "cpu", **(env or {})})


def _xdist(posargs: list[str]) -> list[str]:
    """:data:`XDIST_ARGS` unless the arguments choose their own workers (``-n``,
    ``--numprocesses``, ``--dist``) or turn pytest-xdist off (``-p no:xdist``)."""
    own = any(a.startswith(("-n", "--numprocesses", "--dist", "no:xdist")) or a == "-pno:xdist"
              for a in posargs)
    return [] if own else XDIST_ARGS


@nox.session
def test(session: nox.Session) -> None:
    """The project's CPU tier (GPU tests skip cleanly without a GPU), on 2 pytest-xdist
    workers (``-- -n 0`` or ``-- -p no:xdist``: one process)."""
    _require_env(session)
    xdist = _xdist(session.posargs)
    if xdist and subprocess.run([_py(), "-c", "import xdist"], capture_output=True).returncode:
        session.warn("pytest-xdist is not installed (an environment from before it joined the "
                     "`test` extra): one process; `nox -s apply-patches` installs it")
        xdist = []
    _pytest(session, "tests", "-m", "not slow", *xdist, *session.posargs, env=OFFLINE_ENV)


@nox.session(name="test-all", default=False)
def test_all(session: nox.Session) -> None:
    """Every tier this machine can run, slow tests included."""
    _pytest(session, "tests", *session.posargs, env=OFFLINE_ENV)


@nox.session(name="upstream-tests", default=False)
def upstream_tests(session: nox.Session) -> None:
    """vLLM 0.34.0's own spec-decode and sampler tests, run on the patched tree.

    ``-- --stock`` runs the same selection on the unpatched baseline instead (a
    git worktree at tag v0.34.0 put first on PYTHONPATH), to compare counts.
    """
    tree = _tree()
    if not tree.exists():
        session.error("no vLLM tree: run `nox -s apply-patches` first")
    _require_env(session)
    _pip(session, *UPSTREAM_TEST_REQUIREMENTS)
    args = list(session.posargs)
    env = dict(OFFLINE_ENV)
    if "--stock" in args:
        args.remove("--stock")
        stock = BUILD_DIR / f"vllm-{patchset.VLLM_VERSION}-stock"
        if not stock.exists():
            patchset.git(tree, "worktree", "add", "-q", "--detach", str(stock),
                         patchset.BASELINE_TAG)
        tree, env["PYTHONPATH"] = stock, str(stock)
        session.log(f"running on the stock baseline {stock}")
    # the deselect plugin is in the test kit (not installed): the repository root goes last
    # on the path, so the tree's own `tests` package and the installed modules come first
    env["PYTHONPATH"] = os.pathsep.join([*filter(None, [env.get("PYTHONPATH")]), str(ROOT)])
    session.chdir(tree)
    # testkit.upstream_cpu: vLLM's CPU platform configures without triton-cpu (both trees)
    _pytest(session, "-p", "testkit.upstream_deselect", "-p", "testkit.upstream_cpu",
            "--upstream-deselect-list", str(UPSTREAM_DESELECT_LIST),
            "tests/v1/spec_decode", "tests/v1/sample", "tests/samplers",
            "-q", "-o", "addopts=", "-p", "no:cacheprovider", "--timeout", "300",
            "--rootdir", str(tree), *args, env=env)


UPSTREAM_CHECK = "testkit.upstream_check"
# Its own environment: the hook tools at vLLM's pinned versions, apart from the project's.
UPSTREAM_CHECK_ENV = BUILD_DIR / "upstream-check-venv"


def _upstream_check_env(session: nox.Session, tree: Path) -> Path:
    """``build/upstream-check-venv`` with the tools vLLM's .pre-commit-config.yaml pins
    (reinstalled only when the pins change); returns its bin directory."""
    pins = subprocess.run([sys.executable, "-m", UPSTREAM_CHECK, "pins", str(tree)],
                          capture_output=True, text=True, cwd=ROOT)
    if pins.returncode:
        session.error(pins.stderr.strip())
    bin_dir = UPSTREAM_CHECK_ENV / "bin"
    stamp = UPSTREAM_CHECK_ENV / "pins.txt"
    if not (stamp.is_file() and stamp.read_text() == pins.stdout):
        session.run(sys.executable, "-m", "venv", "--clear", str(UPSTREAM_CHECK_ENV),
                    external=True)
        session.run(str(bin_dir / "python"), "-m", "pip", "install", "-q",
                    "--disable-pip-version-check", *pins.stdout.split(), external=True)
        stamp.write_text(pins.stdout)
    session.log("hook tools: " + ", ".join(pins.stdout.split()))
    return bin_dir


@nox.session(name="upstream-check", default=False)
def upstream_check(session: nox.Session) -> None:
    """vLLM 0.34.0's own pre-commit hooks on the files the series changes (the tool
    versions its .pre-commit-config.yaml pins, in build/upstream-check-venv), then every
    test the series adds to vLLM's tree: each must pass on the patched tree and fail on
    stock v0.34.0. Per-patch results: build/upstream-check.json. Takes no arguments."""
    from testkit.upstream_check import UsageError, session_args, session_failure

    try:
        session_args(session.posargs)
    except UsageError as exc:
        session.error(f"upstream-check: {exc}")
    tree = _tree()
    if not tree.exists():
        session.error("no vLLM tree: run `nox -s apply-patches` first")
    _require_env(session)
    t0 = time.time()
    bin_dir = _upstream_check_env(session, tree)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    hooks = subprocess.run([str(bin_dir / "python"), "-m", UPSTREAM_CHECK, "hooks", str(tree),
                            str(bin_dir)], env=env).returncode
    t_hooks = time.time() - t0
    _pip(session, *UPSTREAM_TEST_REQUIREMENTS)
    tests = subprocess.run([_py(), "-m", UPSTREAM_CHECK, "tests", str(tree),
                            str(BUILD_DIR / "upstream-check.json")],
                           env={**env, **OFFLINE_ENV, "VLLM_TARGET_DEVICE": "cpu"}).returncode
    session.log(f"upstream-check: hooks {t_hooks:.0f} s, total {time.time() - t0:.0f} s")
    if (failure := session_failure(hooks, tests)) is not None:
        session.error(failure)


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks this machine can run; writes bench/out/ (see bench/README.md)."""
    _require_env(session)
    # GPU-less machines use vLLM's CPU platform for the gloo sections; on a CUDA
    # machine vLLM must pick its CUDA platform (the e2e runner starts `vllm serve`).
    env = {} if _cuda_available() else {"VLLM_TARGET_DEVICE": "cpu"}
    session.run(_py(), str(ROOT / "bench" / "run_all.py"), *session.posargs, external=True,
                env=env)


@nox.session(default=False)
def docs(session: nox.Session) -> None:
    """Regenerate every generated document (bench/harness/generated_docs.py lists them);
    ``-- --check`` changes nothing and fails when one is stale."""
    _require_env(session)
    check = "--check" in session.posargs
    for gen in DOC_GENERATORS:
        session.run(_py(), *gen.command(ROOT, check=check), external=True,
                    env={"PYTHONPATH": str(ROOT)})


@nox.session(default=False, venv_backend="venv")
def mutants(session: nox.Session) -> None:
    """Mutation testing (cosmic-ray, in this session's own environment) of verify/,
    drafts/, train/ and patchset.py against their fast tests in the project
    environment; writes bench/reports/mutants/ (see bench/mutants.py for the options)."""
    _require_env(session)
    session.install(MUTATION_TOOL)
    session.run("python", str(ROOT / "bench" / "mutants.py"), "--python", _py(),
                *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """Static checks: ruff; every git and runtime patch has its note and index row;
    the runtime-patch layout; README's environment-variable table."""
    _require_env(session)
    if subprocess.run([_py(), "-m", "ruff", "--version"], capture_output=True).returncode:
        _pip(session, "ruff")
    session.run(_py(), "-m", "ruff", "check", "vllm_kimi_ext", "tests", "bench", "testkit",
                "noxfile.py", external=True)
    _pytest(session, "tests/unit/test_upstream_notes.py", "tests/unit/test_runtime_layout.py",
            "tests/unit/test_envs.py", "-q")
