"""The pin: which vLLM this package supports and which patch series it expects.

The plugin refuses to act on anything else, because its runtime patches and
the git patch series are written against vLLM 0.34.0 symbols and line
contexts. ``VLLM_KIMI_EXT_ALLOW_MISMATCH=1`` overrides the refusal (read at call
time, so it works when set just before ``vllm serve``) and downgrades it to a
warning — for bisecting, never for production.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

from vllm_kimi_ext import PINNED_VLLM_VERSION, envs
from vllm_kimi_ext.patchset import (
    PATCH_DIR,
    RECORD_RELPATH,
    PatchSetError,
    read_series,
    series_record,
)


class CompatError(RuntimeError):
    """The installed vLLM is not the one this package was built for."""


def installed_vllm_version() -> str | None:
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def vllm_tree() -> Path | None:
    """Directory holding the imported ``vllm`` package's parent (the source tree
    for an editable install)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).resolve().parent.parent


def expected_record(patch_dir: Path = PATCH_DIR) -> dict | None:
    """The series this package ships, or None when installed without its
    ``patches/`` directory (non-editable install)."""
    if not (patch_dir / "series").is_file():
        return None
    return series_record(read_series(patch_dir))


def applied_record(tree: Path | None = None) -> dict | None:
    tree = tree or vllm_tree()
    if tree is None:
        return None
    path = tree / RECORD_RELPATH
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def describe_series_difference(expected: dict, applied: dict | None) -> str:
    if applied is None:
        return ("no applied-series record in the installed vLLM: it is stock or was not "
                "prepared with `nox -s apply-patches`")
    exp = {e["name"]: e["sha256"] for e in expected["series"]}
    got = {e["name"]: e["sha256"] for e in applied.get("series", [])}
    parts = []
    if missing := [n for n in exp if n not in got]:
        parts.append("missing: " + ", ".join(missing))
    if extra := [n for n in got if n not in exp]:
        parts.append("not in this package's series: " + ", ".join(extra))
    if changed := [n for n in exp if n in got and exp[n] != got[n]]:
        parts.append("different content: " + ", ".join(changed))
    if not parts and list(exp) != list(got):
        parts.append("same patches in a different order")
    return "; ".join(parts) or "records differ"


def check_compat(*, version: str | None = None, tree: Path | None = None,
                 patch_dir: Path = PATCH_DIR) -> list[str]:
    """Raise :class:`CompatError` unless vLLM is 0.34.0 with exactly our series.

    Returns the list of problems that were overridden (empty when all is well).
    """
    problems = []
    version = version if version is not None else installed_vllm_version()
    if version is None:
        problems.append("vLLM is not installed")
    elif version.split("+")[0] != PINNED_VLLM_VERSION:
        problems.append(f"vLLM {PINNED_VLLM_VERSION} required, found {version}")
    else:
        try:
            expected = expected_record(patch_dir)
        except PatchSetError as exc:
            expected = None
            problems.append(f"this package's patch series is unreadable: {exc}")
        if expected is not None:
            applied = applied_record(tree)
            if applied is None or applied.get("digest") != expected["digest"]:
                problems.append("patch series mismatch — "
                                + describe_series_difference(expected, applied)
                                + "; run `nox -s apply-patches`")
    if problems and not envs.ALLOW_MISMATCH.get():
        raise CompatError("vllm-kimi-ext refuses to start: " + " | ".join(problems)
                          + f" (set {envs.ALLOW_MISMATCH.name}=1 to override)")
    return problems
