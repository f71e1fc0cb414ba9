"""Provenance, capabilities, path scrubbing and markdown helpers shared by the benches.

Everything a result file records about the machine goes through :func:`scrub`, which
replaces the repository root, the temporary directory and the home directory with
``.``, ``$TMPDIR`` and ``~`` so that reports can be committed as examples.
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

#: The repository root (this harness lives in ``bench/harness/`` of the repository and is not
#: installed, so it may read the repository: the git commit, ``bench/``, ``pyproject.toml``).
ROOT = Path(__file__).resolve().parents[2]

#: Distributions whose versions every result records (missing ones are recorded as None).
PACKAGES = ("torch", "vllm", "vllm-kimi-ext", "triton", "flashinfer-python", "transformers",
            "numpy", "pytest-benchmark", "matplotlib")
#: Environment variables recorded in provenance (by prefix), values of secret-looking names
#: are redacted.
ENV_PREFIXES = ("VLLM_", "NCCL_", "CUDA_VISIBLE_DEVICES", "TORCH_NCCL_", "OMP_NUM_THREADS",
                "TORCH_SYMM_MEM_", "NVSHMEM_")
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------
# scrubbing
# ---------------------------------------------------------------------------------------------


def _replacements() -> list[tuple[str, str]]:
    reps = [(str(ROOT), ".")]
    try:
        reps.append((str(Path(tempfile.gettempdir()).resolve()), "$TMPDIR"))
    except OSError:
        pass
    reps.append((tempfile.gettempdir(), "$TMPDIR"))
    home = os.path.expanduser("~")
    if home not in ("/", ""):
        reps.append((home, "~"))
    # longest first so that a root inside the temp dir is replaced as the root
    return sorted({r for r in reps if r[0] and r[0] != "/"}, key=lambda r: -len(r[0]))


def scrub(obj: Any) -> Any:
    """``obj`` with machine paths replaced in every string (recursively)."""
    reps = _replacements()

    def one(s: str) -> str:
        for old, new in reps:
            if old in s:
                s = s.replace(old, new)
        return s

    def walk(o: Any) -> Any:
        if isinstance(o, str):
            return one(o)
        if isinstance(o, dict):
            return {walk(k) if isinstance(k, str) else k: walk(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [walk(v) for v in o]
        return o

    return walk(obj)


def rel(path: str | Path) -> str:
    """A path for a report: relative to the repository root when inside it, else scrubbed."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(ROOT))
    except (ValueError, OSError):
        return scrub(str(p))


def write_json(path: str | Path, data: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(scrub(data), indent=1, sort_keys=False, default=str) + "\n")
    return path


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def first_line(exc: BaseException | str, limit: int = 300) -> str:
    text = str(exc) if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    line = lines[0] if lines else text
    return scrub(line[:limit])


def last_error_line(text: str, limit: int = 300) -> str | None:
    """The most telling line of a log or traceback: the last ``...Error: ...`` /
    ``...Exception: ...`` line, else the last non-empty line."""
    lines = [re.sub(r"^\([^)]*pid=\d+\)\s*", "", ln).strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    if not lines:
        return None
    pat = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt))(:|$)")
    for ln in reversed(lines):
        if pat.match(ln):
            return scrub(ln[:limit])
    return scrub(lines[-1][:limit])


# ---------------------------------------------------------------------------------------------
# markdown
# ---------------------------------------------------------------------------------------------


def _number(cell: str) -> bool:
    c = cell.strip("*`x% ")
    try:
        float(c.replace(",", ""))
        return True
    except ValueError:
        return False


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    """A markdown table; all-numeric columns are right-aligned; ``|`` in cells escaped."""
    cells = [["-" if c is None else str(c).replace("|", "\\|").replace("\n", " ") for c in r]
             for r in rows]
    align = ["---:" if any(_number(r[i]) for r in cells)
             and all(_number(r[i]) or r[i].strip() in ("-", "") for r in cells) else "---"
             for i in range(len(header))]
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in cells]
    return "\n".join(out)


def fmt(x: float | None, spec: str = ".2f", unit: str = "") -> str:
    if x is None:
        return "-"
    return f"{x:{spec}}{unit}"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.1f} {unit}"
    return f"{int(n)} B"


# ---------------------------------------------------------------------------------------------
# provenance
# ---------------------------------------------------------------------------------------------


def _read_git_sha(root: Path) -> tuple[str | None, str | None]:
    """(sha, branch) read from the repository's files (no git process)."""
    git = root / ".git"
    if git.is_file():  # worktree / submodule: "gitdir: PATH"
        text = git.read_text().strip()
        if text.startswith("gitdir:"):
            git = (root / text.split(":", 1)[1].strip()).resolve()
    head = git / "HEAD"
    if not head.is_file():
        return None, None
    ref = head.read_text().strip()
    if not ref.startswith("ref:"):
        return ref or None, None
    name = ref.split(":", 1)[1].strip()
    branch = name.removeprefix("refs/heads/")
    common = git
    if (git / "commondir").is_file():
        common = (git / (git / "commondir").read_text().strip()).resolve()
    for base in (git, common):
        f = base / name
        if f.is_file():
            return f.read_text().strip(), branch
    for base in (git, common):
        packed = base / "packed-refs"
        if packed.is_file():
            for line in packed.read_text().splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[1] == name:
                    return parts[0], branch
    return None, branch


def git_info(root: Path = ROOT, use_git: bool = True) -> dict[str, Any]:
    """Commit SHA (read from ``.git``), branch, and a dirty flag.

    The dirty flag needs ``git status``; it runs read-only (``--no-optional-locks``, so it
    never takes the index lock) and is skipped with ``use_git=False`` (``dirty: null``)."""
    sha, branch = _read_git_sha(root)
    dirty: bool | None = None
    how = "not checked (--no-git)" if not use_git else "git unavailable"
    if use_git and shutil.which("git") and (root / ".git").exists():
        try:
            proc = subprocess.run(
                ["git", "--no-optional-locks", "-C", str(root), "status", "--porcelain",
                 "--untracked-files=no"],
                capture_output=True, text=True, timeout=30,
                env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"}, check=False)
            if proc.returncode == 0:
                dirty = bool(proc.stdout.strip())
                how = "git status --porcelain --untracked-files=no"
        except (OSError, subprocess.TimeoutExpired):
            pass
    return {"sha": sha, "branch": branch, "dirty": dirty, "dirty_check": how}


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    return out


def relevant_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = dict(os.environ if environ is None else environ)
    out = {}
    for k in sorted(environ):
        if k.startswith(ENV_PREFIXES):
            out[k] = "<redacted>" if _SECRET.search(k) else environ[k]
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except (OSError, ValueError):
        pass
    return None


def patch_series() -> dict[str, Any] | None:
    """The applied patch series recorded in the imported vLLM tree (no vLLM import)."""
    try:
        from vllm_kimi_ext.compat import applied_record, expected_record

        applied = applied_record()
        expected = expected_record()
    except Exception as exc:  # noqa: BLE001
        return {"error": first_line(exc)}
    if applied is None:
        return {"applied": None, "matches_package": False}
    return {"applied": [p["name"] for p in applied.get("series", [])],
            # the series and file fingerprints (the package's record also names each
            # patch by slug, which the tree's does not)
            "matches_package": expected is not None
            and (applied.get("digest"), applied.get("files"))
            == (expected.get("digest"), expected.get("files"))}


def _nvidia_smi(*args: str, timeout: float = 20) -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        proc = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def detect_capabilities() -> dict[str, Any]:
    """What this machine can run: vLLM importable, CUDA devices, NVLink / P2P, host."""
    caps: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gb": memory_gb(),
        "python": sys.version.split()[0],
    }
    # vLLM: importable without importing it here (importing costs seconds and pulls CUDA)
    spec = importlib.util.find_spec("vllm")
    caps["vllm_importable"] = spec is not None
    caps["vllm_version"] = package_versions(("vllm",))["vllm"]
    caps["pytest_benchmark"] = importlib.util.find_spec("pytest_benchmark") is not None
    caps["matplotlib"] = importlib.util.find_spec("matplotlib") is not None
    # torch / CUDA
    cuda: dict[str, Any] = {"available": False, "device_count": 0, "devices": [],
                            "why_not": None}
    try:
        import torch

        caps["torch"] = torch.__version__
        cuda["torch_cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            cuda.update(available=n > 0, device_count=n,
                        devices=[torch.cuda.get_device_name(i) for i in range(n)])
            try:
                cuda["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception:  # noqa: BLE001
                cuda["nccl"] = None
            if n > 1:
                pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
                ok = sum(bool(torch.cuda.can_device_access_peer(i, j)) for i, j in pairs)
                cuda["p2p"] = "all" if ok == len(pairs) else "none" if ok == 0 else "partial"
                cuda["p2p_pairs"] = f"{ok}/{len(pairs)}"
        else:
            cuda["why_not"] = ("torch built without CUDA" if torch.version.cuda is None
                               else "no CUDA device visible")
    except Exception as exc:  # noqa: BLE001
        caps["torch"] = None
        cuda["why_not"] = f"torch not importable ({first_line(exc)})"
    topo = _nvidia_smi("topo", "-m") if cuda["device_count"] > 1 else None
    if topo is not None:
        cuda["nvlink"] = bool(re.search(r"\bNV\d+\b", topo))
        cuda["topology"] = topo.strip().splitlines()[: cuda["device_count"] + 1]
    else:
        cuda["nvlink"] = None
    caps["cuda"] = cuda
    return caps


def collect_provenance(use_git: bool = True) -> dict[str, Any]:
    import vllm_kimi_ext

    return {
        "git": git_info(use_git=use_git),
        "packages": package_versions(),
        "vllm_kimi_ext": getattr(vllm_kimi_ext, "__version__", None),
        "patch_series": patch_series(),
        "python": sys.version.split()[0],
        "python_executable": rel(sys.executable),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "env": relevant_env(),
        "created": now_iso(),
    }


def gpu_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """An environment for a GPU subprocess: ``nox -s bench`` exports
    ``VLLM_TARGET_DEVICE=cpu`` for the CPU harness, which must not reach GPU runs."""
    env = dict(os.environ if environ is None else environ)
    if env.get("VLLM_TARGET_DEVICE") == "cpu":
        env.pop("VLLM_TARGET_DEVICE")
    return env
