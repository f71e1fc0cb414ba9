"""pytest plugin for `nox -s upstream-tests`: skip what cannot run here, by list.

vLLM's own tests run from the patched tree, minus the entries of the list named by
``--upstream-deselect-list PATH`` (the noxfile passes this repository's
``tests/upstream/deselect.txt``; the plugin reads no other file). Each line is
``<path or node-id prefix>  # reason``:

* an entry ending in ``.py`` is not even imported (modules that fail at import
  on a GPU-less machine or need packages that only serve model-hub tests);
* any other entry deselects the test with that node id, all its parametrizations
  (``id[...]``) and, for a class, its methods (``id::...``); an entry that
  already contains ``[`` matches parametrizations by prefix.

An entry that matches nothing is reported, so the list cannot silently rot.
"""

from __future__ import annotations

from pathlib import Path

import pytest

OPTION = "--upstream-deselect-list"


def load_entries(path: Path) -> list[tuple[str, str]]:
    out = []
    for raw in path.read_text().splitlines():
        body, _, reason = raw.partition("#")
        body = body.strip()
        if body:
            if not reason.strip():
                raise ValueError(f"{path}: entry {body!r} has no '# reason'")
            out.append((body, reason.strip()))
    return out


_entries: list[tuple[str, str]] = []
_used: set[str] = set()
_source: list[Path] = []


def pytest_addoption(parser):
    parser.addoption(OPTION, metavar="PATH",
                     help="the list of vLLM tests to skip, one '<path or node id>  # reason' "
                          "per line (required by this plugin)")


def pytest_configure(config):
    value = config.getoption(OPTION)
    if not value:
        raise pytest.UsageError(f"{__name__}: {OPTION} PATH is required (nox -s upstream-tests "
                                "passes tests/upstream/deselect.txt)")
    path = Path(value)
    try:
        _entries[:] = load_entries(path)
    except OSError as exc:
        raise pytest.UsageError(f"{path}: cannot read the deselect list "
                                f"({exc.strerror or exc})") from None
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    _source[:] = [path]


def pytest_ignore_collect(collection_path, config):
    rel = collection_path.as_posix()
    for entry, _ in _entries:
        if entry.endswith(".py") and rel.endswith(entry):
            _used.add(entry)
            return True
    return None


def _matches(nodeid: str, entry: str) -> bool:
    if "[" in entry:
        return nodeid.startswith(entry)
    return nodeid == entry or nodeid.startswith((entry + "[", entry + "::"))


def pytest_collection_modifyitems(config, items):
    prefixes = [e for e, _ in _entries if not e.endswith(".py")]
    keep, drop = [], []
    for item in items:
        hit = next((p for p in prefixes if _matches(item.nodeid, p)), None)
        if hit:
            _used.add(hit)
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_terminal_summary(terminalreporter):
    unused = [e for e, _ in _entries if e not in _used]
    terminalreporter.write_line(
        f"vllm-kimi-ext upstream list: {len(_entries)} entries "
        f"({_source[0].name if _source else '?'}); unused: {unused or 'none'}")
