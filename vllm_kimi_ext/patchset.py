"""The vLLM 0.34.0 fork: fetch the source, apply the patch series, record it.

Standard library only: ``noxfile.py`` imports this before vLLM (or torch)
exists in any environment.

Two kinds of functions live here:

* Repository operations (fetching, applying, checking, exporting) take every
  path explicitly; ``noxfile.py`` passes the repository's ``patches/`` folder
  and ``vllm_kimi_ext/series.json``. Nothing here reads outside the installed
  package by itself.
* The series record, shared with the plugin's pin check
  (:mod:`vllm_kimi_ext.compat`): :func:`series_record` and
  :func:`fingerprint_files`.

Layout of a prepared tree (default ``build/vllm-0.34.0``)::

    <tree>/.git            baseline commit tagged v0.34.0 (the untouched source)
                           branch kimi-ext = baseline + one commit per patch (git am)
    <tree>/vllm/_kimi_ext_series.json   the applied-series record (git-ignored)

The record lists the series in order with each patch file's sha256, and the
sha256 of every file the series touches as it was on disk right after the
series was applied. ``vllm_kimi_ext/series.json`` (package data, written by
``--export``) holds the same for the series this package ships; the plugin
refuses a tree whose record differs from it or whose files differ from its
record.

Every operation that changes the tree is atomic: the record is removed before
the tree is touched and written (atomically) only after the last patch
applied, so an interrupted or failed run leaves no record, and on a failure
the branch is reset to the baseline.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

VLLM_VERSION = "0.34.0"
SDIST_NAME = f"vllm-{VLLM_VERSION}.tar.gz"
SDIST_SHA256 = "fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113"
BASELINE_TAG = f"v{VLLM_VERSION}"
FORK_BRANCH = "kimi-ext"
RECORD_RELPATH = "vllm/_kimi_ext_series.json"
#: Package data: the record of the series this package ships (see the module docstring).
SHIPPED_SERIES = "series.json"
# Fixed identity and dates make the baseline commit reproducible (same hash
# on every machine), which keeps exported patches byte-stable.
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "vllm-kimi-ext",
    "GIT_AUTHOR_EMAIL": "vllm-kimi-ext@localhost",
    "GIT_COMMITTER_NAME": "vllm-kimi-ext",
    "GIT_COMMITTER_EMAIL": "vllm-kimi-ext@localhost",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+00:00",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+00:00",
}


class PatchSetError(RuntimeError):
    """A clear, user-facing failure of the fork tooling."""


def _progress(msg: str) -> None:
    print(f"[apply-patches] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- #
# Series                                                                      #
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class SeriesEntry:
    name: str
    sha256: str


def read_series(patch_dir: Path) -> list[SeriesEntry]:
    """Patches listed in ``series`` (comments and blank lines ignored), hashed."""
    series = Path(patch_dir) / "series"
    if not series.is_file():
        raise PatchSetError(f"no series file at {series}")
    out = []
    for lineno, raw in enumerate(series.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        path = Path(patch_dir) / line
        if not path.is_file():
            raise PatchSetError(f"{series}:{lineno}: listed patch {line!r} does not exist")
        out.append(SeriesEntry(line, hashlib.sha256(path.read_bytes()).hexdigest()))
    names = [e.name for e in out]
    if len(set(names)) != len(names):
        raise PatchSetError(f"{series}: a patch is listed twice")
    return out


#: A patch's slug: its name in code, cost-model profiles and docs, which render its number
#: from the shipped series (:mod:`vllm_kimi_ext.patch_ids`). Lowercase words and hyphens.
SLUG_RE = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


def _subject(name: str) -> str:
    """A patch file name without its number: ``NNNN-Foo-bar.patch`` -> ``Foo-bar.patch``."""
    return name.split("-", 1)[1] if re.match(r"\d{4}-", name) else name


def derive_slug(name: str) -> str:
    """The slug a new patch gets from its file name (its subject), e.g.
    ``NNNN-Spec-Decode-Refuse-X.patch`` -> ``spec-decode-refuse-x``."""
    stem = _subject(name).removesuffix(".patch").lower()
    return re.sub(r"[^a-z0-9]+", "-", stem).strip("-") or "patch"


def assign_slugs(names: list[str], previous: list[dict]) -> list[str]:
    """The slug of each patch of a freshly exported series, carried over from ``previous``
    (the ``series`` entries of the last export): the slug of the entry with the same subject,
    else of the entry with the same number if that entry's subject left the series (a patch
    reworded in place), else one derived from the subject (:func:`derive_slug`, suffixed
    ``-2``, ``-3``... when taken). A slug ``previous`` gives to two patches is an error: a
    reference to it could mean either."""
    old = [e for e in previous if isinstance(e, dict) and isinstance(e.get("name"), str)
           and isinstance(e.get("slug"), str) and SLUG_RE.fullmatch(e["slug"])]
    owners: dict[str, str] = {}
    for e in old:
        if e["slug"] in owners:  # e.g. a hand edit: which patch do references mean?
            raise PatchSetError(
                f"vllm_kimi_ext/series.json: slug {e['slug']!r} names two patches, "
                f"{owners[e['slug']]} and {e['name']}; give one of them another slug, "
                "then export again")
        owners[e["slug"]] = e["name"]
    by_subject = {_subject(e["name"]): e["slug"] for e in old}
    subjects = {_subject(n) for n in names}
    by_number = {e["name"][:4]: e["slug"] for e in old if _subject(e["name"]) not in subjects}
    out: list[str] = []
    for name in names:
        slug = by_subject.get(_subject(name)) or by_number.get(name[:4])
        if slug is None:
            slug = derive_slug(name)
            _progress(f"{name}: new patch, slug {slug!r} (derived from its subject; rename it "
                      "in vllm_kimi_ext/series.json, --export keeps it)")
        base, i = slug, 2
        while slug in out:
            slug, i = f"{base}-{i}", i + 1
        out.append(slug)
    return out


def _previous_series(shipped_series: Path) -> list[dict]:
    """The ``series`` entries of an existing package record, or [] (none or unreadable)."""
    try:
        data = json.loads(Path(shipped_series).read_text())
    except (OSError, ValueError):
        return []
    series = data.get("series") if isinstance(data, dict) else None
    return series if isinstance(series, list) else []


def series_record(entries: list[SeriesEntry], files: dict[str, str | None]) -> dict:
    """The record of a series: patches in order with their sha256, a digest of
    that list, and ``files`` (path -> sha256 of each file the series touches
    once applied; None for a file the series deletes)."""
    return {
        "vllm_version": VLLM_VERSION,
        "series": [dataclasses.asdict(e) for e in entries],
        "digest": hashlib.sha256(
            "\n".join(f"{e.name} {e.sha256}" for e in entries).encode()).hexdigest(),
        "files": dict(sorted(files.items())),
    }


def fingerprint_files(tree: Path, paths) -> dict[str, str | None]:
    """sha256 of each file under ``tree`` (None when it does not exist)."""
    out: dict[str, str | None] = {}
    for rel in paths:
        path = Path(tree) / rel
        out[rel] = sha256_file(path) if path.is_file() else None
    return out


def read_record(tree: Path) -> dict | None:
    path = Path(tree) / RECORD_RELPATH
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PatchSetError(f"corrupt series record {path}: {exc}") from exc
    series = rec.get("series") if isinstance(rec, dict) else None
    if not (isinstance(series, list) and all(
            isinstance(e, dict) and {"name", "sha256"} <= set(e) for e in series)):
        raise PatchSetError(f"corrupt series record {path}: expected an object whose "
                            "'series' lists {name, sha256} entries")
    return rec


def _write_json_atomically(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _remove_record(tree: Path) -> None:
    (Path(tree) / RECORD_RELPATH).unlink(missing_ok=True)


# --------------------------------------------------------------------------- #
# git helpers                                                                  #
# --------------------------------------------------------------------------- #


def git(tree: Path, *args: str, check: bool = True, env: dict | None = None,
        binary: bool = False) -> subprocess.CompletedProcess:
    """Run git in ``tree``; ``binary=True`` keeps stdout as bytes."""
    full_env = {**os.environ, **_GIT_ENV, **(env or {})}
    proc = subprocess.run(
        ["git", "-c", f"safe.directory={Path(tree).resolve()}", "-c", "core.autocrlf=false",
         "-c", "gc.auto=0", "-C", str(tree), *args],
        capture_output=True, text=not binary, env=full_env)
    if check and proc.returncode != 0:
        err = proc.stderr.decode(errors="replace") if binary else proc.stderr
        raise PatchSetError(f"git {' '.join(args)} failed in {tree}:\n{err.strip()}")
    return proc


def _exclude(tree: Path, pattern: str) -> None:
    exclude = Path(tree) / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    lines = exclude.read_text().splitlines() if exclude.exists() else []
    if pattern not in lines:
        exclude.write_text("\n".join([*lines, pattern]) + "\n")


# --------------------------------------------------------------------------- #
# Getting the source                                                           #
# --------------------------------------------------------------------------- #


def _index_urls() -> list[str]:
    urls = []
    env = os.environ.get("PIP_INDEX_URL")
    if env:
        urls.append(env.rstrip("/"))
    urls.append("https://pypi.org/simple")
    return list(dict.fromkeys(urls))


def _sdist_url() -> str:
    errors = []
    for base in _index_urls():
        req = urllib.request.Request(f"{base}/vllm/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                data = json.load(resp)
        except Exception as exc:  # noqa: BLE001 - try the next index
            errors.append(f"{base}: {exc}")
            continue
        for f in data.get("files", []):
            if f.get("filename") == SDIST_NAME:
                return f["url"]
        errors.append(f"{base}: no {SDIST_NAME} listed")
    raise PatchSetError("cannot locate the vLLM sdist:\n  " + "\n  ".join(errors))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_sdist(cache_dir: Path) -> Path:
    """Download (or reuse) the vLLM sdist and verify its pinned sha256."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    dest = cache_dir / SDIST_NAME
    if dest.is_file() and sha256_file(dest) == SDIST_SHA256:
        return dest
    url = _sdist_url()
    _progress(f"downloading {SDIST_NAME}")
    tmp = dest.with_suffix(".part")
    with urllib.request.urlopen(url, timeout=300) as resp, open(tmp, "wb") as out:
        total = int(resp.headers.get("Content-Length") or 0)
        done = 0
        while chunk := resp.read(1 << 20):
            out.write(chunk)
            done += len(chunk)
            if total and sys.stderr.isatty():
                print(f"\r  {done / 2**20:6.1f} / {total / 2**20:.1f} MiB", end="",
                      file=sys.stderr)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    got = sha256_file(tmp)
    if got != SDIST_SHA256:
        tmp.unlink()
        raise PatchSetError(
            f"{SDIST_NAME} sha256 mismatch: expected {SDIST_SHA256}, got {got} (from {url})")
    tmp.replace(dest)
    return dest


def _safe_members(tar: tarfile.TarFile, top: str):
    for m in tar.getmembers():
        if not m.name.startswith(top + "/"):
            continue
        m = m.replace(name=m.name[len(top) + 1:], uid=os.getuid(), gid=os.getgid(),
                      uname="", gname="", deep=False)
        if not m.name:
            continue
        yield m


def create_tree_from_sdist(sdist: Path, tree: Path) -> None:
    """Unpack the sdist into ``tree`` and commit it as the tagged baseline."""
    if tree.exists():
        raise PatchSetError(f"{tree} exists; remove it or pass --vllm-src")
    staging = Path(tempfile.mkdtemp(prefix=".vllm-src-", dir=tree.parent))
    try:
        _progress(f"unpacking {sdist.name}")
        with tarfile.open(sdist) as tar:
            top = f"vllm-{VLLM_VERSION}"
            tar.extractall(staging, members=_safe_members(tar, top), filter="data")
        git(staging, "init", "-q", "-b", "baseline")
        _exclude(staging, "/" + RECORD_RELPATH)
        _exclude(staging, "*.egg-info/")
        _exclude(staging, "/build/")
        _exclude(staging, "__pycache__/")
        # The baseline is the sdist exactly: force-add, because the sdist ships
        # files that vLLM's own .gitignore excludes (generated modules such as
        # vllm/_version.py); a worktree of the baseline would lack them. Only
        # the egg-info metadata, which every build regenerates, is left out.
        for info in staging.glob("*.egg-info"):
            shutil.rmtree(info)
        git(staging, "add", "-A", "--force")
        git(staging, "commit", "-q", "--no-verify", "-m",
            f"vLLM {VLLM_VERSION} (registry sdist, sha256 {SDIST_SHA256[:16]}…)")
        git(staging, "tag", BASELINE_TAG)
        staging.rename(tree)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def detect_version(tree: Path) -> str:
    """Best-effort version of a user's vLLM checkout, for error messages."""
    proc = git(tree, "describe", "--tags", "--always", check=False)
    if proc.returncode == 0 and proc.stdout.strip():
        return proc.stdout.strip()
    pkg = tree / "PKG-INFO"
    if pkg.is_file():
        m = re.search(r"^Version:\s*(\S+)", pkg.read_text(), re.M)
        if m:
            return m.group(1)
    return "unknown"


def check_user_tree(tree: Path) -> None:
    """A ``--vllm-src`` checkout must be a git repo with tag v0.34.0."""
    if not (tree / ".git").exists():
        raise PatchSetError(f"--vllm-src {tree}: not a git checkout of vLLM")
    if not (tree / "vllm" / "__init__.py").is_file():
        raise PatchSetError(f"--vllm-src {tree}: no vllm/ package inside")
    proc = git(tree, "rev-parse", "-q", "--verify", f"{BASELINE_TAG}^{{commit}}", check=False)
    if proc.returncode != 0:
        raise PatchSetError(
            f"--vllm-src {tree}: vLLM {VLLM_VERSION} required (tag {BASELINE_TAG} not found); "
            f"found {detect_version(tree)}")
    status = git(tree, "status", "--porcelain", "--untracked-files=no").stdout.strip()
    if status:
        raise PatchSetError(
            f"--vllm-src {tree}: uncommitted changes to tracked files; commit or stash them:\n"
            + status)
    _exclude(tree, "/" + RECORD_RELPATH)


# --------------------------------------------------------------------------- #
# Applying, checking, exporting                                                #
# --------------------------------------------------------------------------- #


@dataclasses.dataclass
class ApplyResult:
    changed: bool
    applied: list[str]


_HUNK_RE = re.compile(r"^error: (patch failed: .+|.+: does not exist in index|.+: patch does "
                      r"not apply|corrupt patch at line \d+)$", re.M)


def _describe_failure(out: str) -> str:
    lines = [m.group(1) for m in _HUNK_RE.finditer(out)]
    return "; ".join(lines) if lines else out.strip().splitlines()[-1] if out.strip() else "?"


def _am_series(tree: Path, entries: list[SeriesEntry], patch_dir: Path) -> None:
    """``git am`` each patch in order on the checked-out branch; raise naming the
    first that fails (the caller restores the baseline)."""
    patch_dir = Path(patch_dir).resolve()  # git runs in the tree
    for i, e in enumerate(entries, 1):
        proc = git(tree, "am", "--quiet", "--keep-cr", "--keep-non-patch",
                   str(patch_dir / e.name), check=False)
        if proc.returncode != 0:
            detail = _describe_failure(proc.stdout + "\n" + proc.stderr)
            git(tree, "am", "--abort", check=False)
            raise PatchSetError(f"patch {i}/{len(entries)} {e.name} does not apply: {detail}")


def _touched(tree: Path, rev: str = "HEAD") -> list[str]:
    """Files the commits ``BASELINE_TAG..rev`` add, change or delete."""
    return git(tree, "diff", "--name-only", "--no-renames", f"{BASELINE_TAG}..{rev}"
               ).stdout.splitlines()


def _reset_to_baseline(tree: Path) -> None:
    _remove_record(tree)  # first: an interruption below must not leave it behind
    git(tree, "am", "--abort", check=False)
    git(tree, "checkout", "-q", "-f", "-B", FORK_BRANCH, BASELINE_TAG)
    git(tree, "clean", "-q", "-fd")


def tree_is_applied(tree: Path, entries: list[SeriesEntry]) -> bool:
    """True when the record matches the series and the files on disk, and the
    branch is exactly baseline + one commit per patch with the patched files
    untouched."""
    rec = read_record(tree)
    if rec is None or rec.get("digest") != series_record(entries, {})["digest"]:
        return False
    head = git(tree, "rev-parse", "--abbrev-ref", "HEAD", check=False).stdout.strip()
    if head != FORK_BRANCH:
        return False
    n = git(tree, "rev-list", "--count", f"{BASELINE_TAG}..HEAD", check=False).stdout.strip()
    if n != str(len(entries)):
        return False
    # Local edits to files the series touches mean the tree is not the series.
    # Other tracked files may legitimately differ: the editable build rewrites
    # generated ones such as vllm/_version.py.
    touched = _touched(tree)
    if rec.get("files") != fingerprint_files(tree, touched):
        return False
    if not touched:
        return True
    dirty = git(tree, "status", "--porcelain", "--untracked-files=no", "--", *touched)
    return not dirty.stdout.strip()


def _record_applied(tree: Path, entries: list[SeriesEntry]) -> None:
    """Write the record of ``entries`` with the patched files as they are now."""
    _write_json_atomically(Path(tree) / RECORD_RELPATH,
                           series_record(entries, fingerprint_files(tree, _touched(tree))))


def apply_series(tree: Path, patch_dir: Path) -> ApplyResult:
    """Bring ``tree`` to baseline + series. Idempotent and atomic."""
    entries = read_series(patch_dir)
    if tree_is_applied(tree, entries):
        _progress(f"{len(entries)} patch(es) already applied; nothing to do")
        return ApplyResult(False, [e.name for e in entries])
    _reset_to_baseline(tree)
    try:
        _am_series(tree, entries, patch_dir)
    except BaseException:
        _reset_to_baseline(tree)
        raise
    _record_applied(tree, entries)
    for e in entries:
        _progress(f"applied {e.name}")
    return ApplyResult(True, [e.name for e in entries])


def check_series(tree: Path, patch_dir: Path) -> list[str]:
    """Dry run: apply the series in a throw-away worktree at the baseline."""
    entries = read_series(patch_dir)
    scratch = Path(tempfile.mkdtemp(prefix="kimi-ext-check-"))
    wt = scratch / "wt"
    try:
        git(tree, "worktree", "add", "-q", "--detach", str(wt), BASELINE_TAG)
        _am_series(wt, entries, patch_dir)
        return [e.name for e in entries]
    finally:
        git(tree, "worktree", "remove", "--force", str(wt), check=False)
        git(tree, "worktree", "prune", check=False)
        shutil.rmtree(scratch, ignore_errors=True)


def _fingerprint_rev(tree: Path, rev: str) -> dict[str, str | None]:
    """Like :func:`fingerprint_files` for the files ``BASELINE_TAG..rev``
    touches, read from the commit instead of the work tree."""
    out: dict[str, str | None] = {}
    for rel in _touched(tree, rev):
        proc = git(tree, "cat-file", "blob", f"{rev}:{rel}", check=False, binary=True)
        out[rel] = hashlib.sha256(proc.stdout).hexdigest() if proc.returncode == 0 else None
    return out


def _write_if_changed(path: Path, data: bytes) -> None:
    if not path.exists() or path.read_bytes() != data:
        path.write_bytes(data)
        _progress(f"wrote {path}")


_AUTHOR_RE = re.compile(r"^[^<>\n]+ <[^<>@\s]+@[^<>\s]+>$")


def parse_author(author: str) -> str:
    """``Name <email>`` normalised; a one-line error otherwise."""
    author = " ".join(author.split())
    if not _AUTHOR_RE.match(author):
        raise PatchSetError(f"--author {author!r}: expected 'Name <email>'")
    return author


def default_author(tree: Path | None = None) -> str:
    """``git config user.name <user.email>`` (of ``tree`` when given)."""
    where = ["-C", str(tree)] if tree is not None else []
    values = []
    for key in ("user.name", "user.email"):
        proc = subprocess.run(["git", *where, "config", key], capture_output=True, text=True)
        values.append(proc.stdout.strip())
    if not all(values):
        raise PatchSetError("no patch author: pass --author 'Name <email>' or set git config "
                            "user.name and user.email")
    return parse_author(f"{values[0]} <{values[1]}>")


def export_author(given: str | None, tree: Path | None = None) -> str:
    """The identity ``--export`` signs with: ``given`` (``--author``; an empty one is an
    error, not "not given") or, when ``--author`` was not passed (None), git config's."""
    return parse_author(given) if given is not None else default_author(tree)


#: The identity the fixed baseline commit uses (:data:`_GIT_ENV`); never a patch author.
PLACEHOLDER_EMAIL = _GIT_ENV["GIT_AUTHOR_EMAIL"]


def _set_author(patch: bytes, author: str) -> bytes:
    """The ``From:`` header and every ``Signed-off-by:`` line of the commit
    message (one, at its end, if there was none) name ``author``."""
    text = patch.decode("utf-8")
    head, sep, rest = text.partition("\n---\n")
    lines, in_from = [], False
    for ln in head.split("\n"):
        # format-patch folds a long From: header onto indented lines; they
        # belong to the header replaced below (kept, git am reads them into
        # the author's name).
        if in_from and ln[:1] in (" ", "\t"):
            continue
        in_from = ln.startswith("From: ")
        if not ln.startswith("Signed-off-by: "):
            lines.append(ln)
    lines = [f"From: {author}" if ln.startswith("From: ") else ln for ln in lines]
    while lines and not lines[-1].strip():
        lines.pop()
    lines += ["", f"Signed-off-by: {author}"]
    return ("\n".join(lines) + sep + rest).encode("utf-8")


def export_series(tree: Path, patch_dir: Path, shipped_series: Path,
                  author: str | None = None) -> list[str]:
    """Regenerate the patch files, ``series`` and the package's series record
    (``shipped_series``, i.e. ``vllm_kimi_ext/series.json``) from the fork
    branch commits. The package record also names each patch by its slug, kept from the
    record being replaced (:func:`assign_slugs`); the tree's record carries no slugs.

    ``author`` (``Name <email>``, see :func:`parse_author`) replaces each
    patch's ``From:`` and ``Signed-off-by:`` lines, so the sign-off is the
    contributor's; None keeps the commits' own.

    Files are written only when their content changes, so exporting an
    unmodified branch is a no-op (the round trip is byte-stable). The tree's
    own record is rewritten when the tree has the fork branch checked out
    (from the files on disk, so local edits show as a mismatch), and removed
    otherwise.
    """
    n = int(git(tree, "rev-list", "--count", f"{BASELINE_TAG}..{FORK_BRANCH}").stdout)
    scratch = Path(tempfile.mkdtemp(prefix="kimi-ext-export-"))
    try:
        git(tree, "format-patch", "-q", "--no-numbered", "--zero-commit", "--no-signature",
            "--full-index",
            "--abbrev=12", "-o", str(scratch), f"{BASELINE_TAG}..{FORK_BRANCH}")
        produced = sorted(p.name for p in scratch.glob("*.patch"))
        if len(produced) != n:
            raise PatchSetError(f"format-patch produced {len(produced)} files for {n} commits")
        patch_dir.mkdir(parents=True, exist_ok=True)
        old = {p.name for p in patch_dir.glob("*.patch")}
        for name in produced:
            data = (scratch / name).read_bytes()
            if author is not None:
                data = _set_author(data, author)
            _write_if_changed(patch_dir / name, data)
        for stale in sorted(old - set(produced)):
            (patch_dir / stale).unlink()
            _progress(f"removed {stale} (no longer on {FORK_BRANCH})")
        header = ("# vLLM 0.34.0 patch series, applied in order with `git am`.\n"
                 "# Regenerate with `nox -s apply-patches -- --export`.\n")
        _write_if_changed(patch_dir / "series",
                          (header + "".join(f"{name}\n" for name in produced)).encode())
        entries = read_series(patch_dir)
        shipped = series_record(entries, _fingerprint_rev(tree, FORK_BRANCH))
        slugs = assign_slugs([e.name for e in entries], _previous_series(shipped_series))
        for entry, slug in zip(shipped["series"], slugs):
            entry["slug"] = slug
        _write_if_changed(shipped_series, (json.dumps(shipped, indent=2) + "\n").encode())
        head = git(tree, "rev-parse", "--abbrev-ref", "HEAD", check=False).stdout.strip()
        if head == FORK_BRANCH:
            _record_applied(tree, entries)
        else:
            _remove_record(tree)
        return produced
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
