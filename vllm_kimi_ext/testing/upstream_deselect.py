"""pytest plugin for `nox -s upstream-tests`: skip what cannot run here, by list.

vLLM's own tests run from the patched tree, minus ``tests/upstream/deselect.txt``
of this repository. Each line is ``<path or node-id prefix>  # reason``:

* an entry ending in ``.py`` is not even imported (modules that fail at import
  on a GPU-less machine or need packages that only serve model-hub tests);
* any other entry deselects the test with that node id, all its parametrizations
  (``id[...]``) and, for a class, its methods (``id::...``); an entry that
  already contains ``[`` matches parametrizations by prefix.

An entry that matches nothing is reported, so the list cannot silently rot.
"""

from __future__ import annotations

from pathlib import Path

LIST = Path(__file__).resolve().parents[2] / "tests" / "upstream" / "deselect.txt"


def load_entries(path: Path = LIST) -> list[tuple[str, str]]:
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


def pytest_configure(config):
    _entries[:] = load_entries()


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
        f"({LIST.name}); unused: {unused or 'none'}")
