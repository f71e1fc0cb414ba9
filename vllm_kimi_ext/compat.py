"""The pin: which vLLM this package supports and which patch series it expects.

The plugin refuses to act on anything else, because its runtime patches and
the git patch series are written against vLLM 0.34.0 symbols and line
contexts. The expected series is package data (``vllm_kimi_ext/series.json``,
written by ``nox -s apply-patches -- --export``), so the check works in any
install; the applied series is the record ``apply-patches`` writes into the
vLLM tree, and the files it lists are hashed again here, so a tree rolled back
or edited after the record was written is refused too.

``VLLM_KIMI_EXT_ALLOW_MISMATCH=1`` overrides the refusal (read at call time, so
it works when set just before ``vllm serve``) and downgrades it to a warning —
for bisecting, never for production.
"""

from __future__ import annotations

import json
from importlib import metadata, resources
from pathlib import Path

from vllm_kimi_ext import PINNED_VLLM_VERSION, envs
from vllm_kimi_ext.patchset import (
    SHIPPED_SERIES,
    PatchSetError,
    fingerprint_files,
    read_record,
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


def vllm_keeps_eagle3_deepseek_heads() -> bool:
    """Whether the installed vLLM carries the fix that keeps DeepSeek-type EAGLE-3 heads out
    of the MTP rewrite (our ``eagle3-deepseek-not-mtp`` patch adds
    ``vllm.config.speculative._is_eagle3_draft_architecture``); False without vLLM or when
    it cannot be imported. For the draft doctor, which otherwise runs without vLLM."""
    import importlib.util

    try:
        if importlib.util.find_spec("vllm") is None:
            return False
        from vllm.config import speculative
    except Exception:  # noqa: BLE001 - any import problem means "stock"
        return False
    return hasattr(speculative, "_is_eagle3_draft_architecture")


def expected_record() -> dict:
    """The record of the series this package ships (package data)."""
    where = f"vllm_kimi_ext/{SHIPPED_SERIES}"
    try:
        data = json.loads(resources.files("vllm_kimi_ext").joinpath(SHIPPED_SERIES).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PatchSetError(f"{where}: unreadable ({exc}); reinstall vllm-kimi-ext") from exc
    if not (isinstance(data, dict) and isinstance(data.get("series"), list)
            and isinstance(data.get("digest"), str) and isinstance(data.get("files"), dict)):
        raise PatchSetError(f"{where}: expected an object with 'series', 'digest' and "
                            "'files'; regenerate it with `nox -s apply-patches -- --export`")
    return data


def applied_record(tree: Path | None = None) -> dict | None:
    """The applied-series record in ``tree`` (default: the imported vLLM's)."""
    tree = tree or vllm_tree()
    return None if tree is None else read_record(tree)


def files_disagreeing(tree: Path, applied: dict) -> list[str] | None:
    """Files the record lists whose content on disk differs from the sha256
    recorded when the series was applied (None: the record lists no files)."""
    files = applied.get("files")
    if not isinstance(files, dict):
        return None
    now = fingerprint_files(tree, files)
    return [path for path, sha in files.items() if now[path] != sha]


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


def _series_problem(expected: dict, tree: Path | None) -> str | None:
    """Why the tree does not hold exactly the expected series, or None."""
    fix = "; run `nox -s apply-patches`"
    try:
        applied = applied_record(tree)
    except PatchSetError as exc:
        return f"{exc}{fix}"
    if applied is None or applied.get("digest") != expected["digest"]:
        return "patch series mismatch — " + describe_series_difference(expected, applied) + fix
    tree = tree or vllm_tree()
    differing = files_disagreeing(tree, applied)
    if differing is None:
        return (f"the applied-series record in {tree} lists no file fingerprints (written by "
                f"an older apply-patches){fix}")
    if differing:
        shown = ", ".join(differing[:3]) + (" …" if len(differing) > 3 else "")
        return (f"the applied-series record in {tree} disagrees with its files: "
                f"{len(differing)} of {len(applied['files'])} patched file(s) differ from "
                f"what was recorded when the series was applied ({shown}); the tree was "
                f"rolled back or edited{fix}")
    if applied["files"] != expected["files"]:
        changed = sorted(set(applied["files"].items()) ^ set(expected["files"].items()))
        names = ", ".join(dict.fromkeys(path for path, _ in changed))
        return f"patched files differ from this package's series: {names}{fix}"
    return None


def check_compat(*, version: str | None = None, tree: Path | None = None,
                 expected: dict | None = None) -> list[str]:
    """Raise :class:`CompatError` unless vLLM is 0.34.0 with exactly our series.

    ``tree`` defaults to the imported vLLM's source tree and ``expected`` to
    this package's series (:func:`expected_record`). Returns the list of
    problems that were overridden (empty when all is well).
    """
    problems = []
    version = version if version is not None else installed_vllm_version()
    if version is None:
        problems.append("vLLM is not installed")
    elif version.split("+")[0] != PINNED_VLLM_VERSION:
        problems.append(f"vLLM {PINNED_VLLM_VERSION} required, found {version}")
    else:
        try:
            expected = expected if expected is not None else expected_record()
        except PatchSetError as exc:
            problems.append(f"this package's patch series is unreadable: {exc}")
        else:
            if problem := _series_problem(expected, tree):
                problems.append(problem)
    if problems and not envs.ALLOW_MISMATCH.get():
        raise CompatError("vllm-kimi-ext refuses to start: " + " | ".join(problems)
                          + f" (set {envs.ALLOW_MISMATCH.name}=1 to override)")
    return problems
