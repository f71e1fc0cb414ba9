"""The installed package ships the product only, reads nothing outside itself, and imports
vLLM only where it is meant to.

Four checks over the AST of every module of ``vllm_kimi_ext`` (nothing is imported):

* **imports**: no product module imports the test kit ``testkit``, the benchmark harness
  ``bench`` or a ``vllm_kimi_ext.testing`` (the test kit's old home, which must not come
  back) - absolute or relative imports, including ones inside functions, and
  ``importlib.import_module("...")`` with a literal name;
* **layers**: no import cycle between the package's parts (a subpackage such as ``comm/``,
  or a top-level module such as ``cli.py``), counting every import, function-level ones
  included;
* **vLLM imports**: only the modules listed in :data:`VLLM_ALLOWED` (folders or single
  modules, each with its reason) import ``vllm`` - at module level or inside functions,
  absolute, or through ``importlib.import_module`` with a literal name; everything else
  (the draft tools, checkpoints, tokenizers, the cost model) runs without vLLM installed;
* **paths**: no module computes a path above the package directory from ``__file__``. The
  heuristic counts the levels an expression climbs from the module file: ``.parent`` (+1),
  ``.parents[N]`` (+N+1), ``os.path.dirname(...)`` (+1), ``/ ".."`` or an ``os.path.join``
  part ``".."`` (+1), through ``.resolve()`` and any call taking the path as its first
  argument (``Path(...)`` or an alias of it, ``os.path.abspath``, ``str``, ...), and through
  plain names assigned such an expression earlier in the module. A module
  ``vllm_kimi_ext/a/b.py`` may climb 2 levels (to ``vllm_kimi_ext/``), not 3. Paths built
  any other way (string concatenation, attributes of other objects, ``sys.path``) are not
  seen; package data belongs under the package and is read relative to it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_kimi_ext"
FORBIDDEN = ("vllm_kimi_ext.testing", "testkit", "bench")
#: Where the package may import vLLM: a folder (``name/``) or a module, with the reason.
#: An entry that matches no module fails the test, so the list stays exact.
VLLM_ALLOWED: dict[str, str] = {
    "plugin.py": "the vllm.general_plugins entry point: registers with vLLM",
    "compat.py": "the pin: what the installed vLLM is and carries",
    "runtime/": "runtime patches of vLLM classes",
    "integration/": "vLLM-aware glue: config-time draft check, agreement check, kimi_tli, "
                    "sharded verification inside vLLM's sampler and model runner",
    "train/capture.py": "captures the target's hidden states with vLLM's offline LLM",
    "train/cli.py": "`draft capture` builds vLLM's offline LLM",
}
#: Modules still reading outside the package, each with the change that removes it; an entry
#: that no longer finds anything fails the test, so the list only shrinks.
KNOWN_PATH_ESCAPES: dict[str, str] = {}


def _module_name(rel: Path) -> str:
    parts = ("vllm_kimi_ext", *rel.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_names(tree: ast.AST, rel: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a module at ``rel`` (package-relative)."""
    module = _module_name(rel)
    package = module if rel.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append((node.lineno, name))
            out += [(node.lineno, f"{name}.{a.name}") for a in node.names]
        elif (isinstance(node, ast.Call) and _dotted(node.func).endswith("import_module")
              and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            out.append((node.lineno, node.args[0].value))
    return out


def forbidden_imports(source: str, rel: Path) -> list[str]:
    hits = []
    for line, name in _imported_names(ast.parse(source), rel):
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
            hits.append(f"vllm_kimi_ext/{rel.as_posix()}:{line}: imports {name}")
    return sorted(set(hits))


def _matches(entry: str, rel: Path) -> bool:
    path = rel.as_posix()
    return path.startswith(entry) if entry.endswith("/") else path == entry


def _vllm_allowed(rel: Path) -> bool:
    return any(_matches(e, rel) for e in VLLM_ALLOWED)


def vllm_imports(source: str, rel: Path) -> list[str]:
    """Every import of vLLM by a module at ``rel`` (package-relative) not allowed one."""
    if _vllm_allowed(rel):
        return []
    return sorted({f"vllm_kimi_ext/{rel.as_posix()}:{line}: imports {name}"
                   for line, name in _imported_names(ast.parse(source), rel)
                   if name == "vllm" or name.startswith("vllm.")})


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


_DIRNAME = {"os.path.dirname", "dirname", "path.dirname"}


def _climb(node: ast.AST, names: dict[str, int]) -> int | None:
    """Levels above the module file this expression reaches, or None if not from __file__."""
    if isinstance(node, ast.Name):
        return 0 if node.id == "__file__" else names.get(node.id)
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        up = _climb(node.value, names)
        return None if up is None else up + 1
    if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
            and node.value.attr == "parents"):
        up = _climb(node.value.value, names)
        idx = node.slice
        if up is None or not (isinstance(idx, ast.Constant) and isinstance(idx.value, int)):
            return up
        return up + idx.value + 1
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        up = _climb(node.left, names)
        dots = isinstance(node.right, ast.Constant) and node.right.value == ".."
        return None if up is None else up + dots
    if isinstance(node, ast.Call):
        name = _dotted(node.func)
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("resolve", "absolute"):
            return _climb(node.func.value, names)
        if not node.args:
            return None
        up = _climb(node.args[0], names)
        if up is None:
            return None
        if name in _DIRNAME:
            return up + 1
        if name in ("os.path.join", "join"):
            return up + sum(isinstance(a, ast.Constant) and a.value == ".."
                            for a in node.args[1:])
        return up  # Path(...), os.path.abspath(...), str(...), an alias of Path, ...
    return None


def escaping_paths(source: str, rel: Path) -> list[str]:
    """Expressions of a module at ``rel`` (package-relative) that climb above the package."""
    tree = ast.parse(source)
    allowed = len(rel.parts)
    names: dict[str, int] = {}
    for node in sorted((n for n in ast.walk(tree) if isinstance(n, ast.Assign)),
                       key=lambda n: n.lineno):
        up = _climb(node.value, names)
        if up is not None:
            names.update({t.id: up for t in node.targets if isinstance(t, ast.Name)})
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.expr) and not isinstance(node, ast.Name):
            up = _climb(node, names)
            if up is not None and up > allowed:
                hits.append(f"vllm_kimi_ext/{rel.as_posix()}:{node.lineno}: "
                            f"{ast.unparse(node)} climbs {up} levels (the package is {allowed} up)")
    return sorted(set(hits))


def _modules() -> list[Path]:
    return sorted(p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py"))


def _part(module: str) -> str:
    """The part of the package a module belongs to: ``vllm_kimi_ext.comm.x`` -> ``comm``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def import_cycles(sources: dict[Path, str]) -> list[str]:
    """Each cycle between parts of the package (strongly connected components of the
    part-level import graph of ``{package-relative path: source}``), with the imports in it."""
    edges: dict[str, dict[str, list[str]]] = {}
    for rel, source in sources.items():
        src = _part(_module_name(rel))
        for line, name in _imported_names(ast.parse(source), rel):
            dst = _part(name) if name.startswith("vllm_kimi_ext.") else None
            if dst is not None and dst != src:
                edges.setdefault(src, {}).setdefault(dst, []).append(f"{rel.as_posix()}:{line}")
    found = []
    for comp in strongly_connected(edges):
        via = [f"{a} -> {b} ({', '.join(sorted(set(edges[a][b])))})"
               for a in sorted(comp) for b in sorted(edges.get(a, {})) if b in comp]
        found.append("; ".join(via))
    return sorted(found)


def strongly_connected(edges: dict) -> list[list[str]]:
    """The strongly connected components with more than one node of a graph
    ``{node: iterable of successors}`` (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_product_modules_do_not_import_testing_or_the_bench_harness():
    hits = [h for rel in _modules()
            for h in forbidden_imports((PACKAGE / rel).read_text(), rel)]
    assert hits == [], "\n".join(hits)


def test_no_import_cycle_between_parts_of_the_package():
    cycles = import_cycles({rel: (PACKAGE / rel).read_text() for rel in _modules()})
    assert cycles == [], "\n".join(cycles)


def test_a_planted_import_cycle_is_found():
    sources = {Path("comm/accounting.py"): "def f():\n    from vllm_kimi_ext import runtime\n",
               Path("runtime/__init__.py"): "from vllm_kimi_ext.comm import accounting\n",
               Path("drafts/cli.py"): "from ..train.cli import register\n",
               Path("train/trainer.py"):
                   "from vllm_kimi_ext.drafts.doctor.diagnosis import diagnose\n",
               Path("cli.py"): "from vllm_kimi_ext.train import cli\n"}
    assert import_cycles(sources) == [
        "comm -> runtime (comm/accounting.py:2); runtime -> comm (runtime/__init__.py:1)",
        "drafts -> train (drafts/cli.py:1); train -> drafts (train/trainer.py:1)"]
    del sources[Path("drafts/cli.py")]
    assert len(import_cycles(sources)) == 1


def test_vllm_is_imported_only_where_allowed():
    hits = [h for rel in _modules() for h in vllm_imports((PACKAGE / rel).read_text(), rel)]
    assert hits == [], ("vLLM imported outside the allowed folders (move the code to "
                        "integration/ or runtime/):\n" + "\n".join(hits))
    unused = [e for e in VLLM_ALLOWED if not any(_matches(e, rel) for rel in _modules())]
    assert unused == [], f"VLLM_ALLOWED names no module: remove {unused}"


@pytest.mark.parametrize("source,rel", [
    ("from vllm.config import VllmConfig", "drafts/doctor/checks.py"),
    ("def f():\n    from vllm.distributed import get_tp_group", "checkpoints/m.py"),
    ("import vllm", "costmodel/model.py"),
    ("import vllm.envs as e", "drafts/cli.py"),
    ("from vllm import LLM", "train/trainer.py"),
    ("import importlib\nimportlib.import_module('vllm.config')", "tokenizers/compare.py"),
    ("from vllm.config import speculative", "integrationx/m.py"),  # not the allowed folder
])
def test_a_planted_vllm_import_is_found(source, rel):
    assert vllm_imports(source, Path(rel))


@pytest.mark.parametrize("source,rel", [
    ("from vllm.config import VllmConfig", "integration/draft_check.py"),
    ("from vllm.config import VllmConfig", "runtime/vllm_config.py"),
    ("def f():\n    import vllm.envs", "plugin.py"),
    ("from vllm import LLM", "train/capture.py"),
    ("import vllm_kimi_ext.envs\nimport importlib.util\nimportlib.util.find_spec('vllm')",
     "compat.py"),  # looking for vLLM is not importing it
    ("from .vllm_like import x", "drafts/m.py"),  # vllm_kimi_ext.drafts.vllm_like
])
def test_allowed_vllm_imports_pass(source, rel):
    assert vllm_imports(source, Path(rel)) == []


def test_no_module_computes_a_path_outside_the_package():
    found: dict[str, list[str]] = {}
    for rel in _modules():
        hits = escaping_paths((PACKAGE / rel).read_text(), rel)
        if hits:
            found[rel.as_posix()] = hits
    unexpected = {k: v for k, v in found.items() if k not in KNOWN_PATH_ESCAPES}
    assert unexpected == {}, "\n".join(h for v in unexpected.values() for h in v)
    fixed = sorted(set(KNOWN_PATH_ESCAPES) - set(found))
    assert fixed == [], f"no longer reads outside the package: remove {fixed} from the list"


@pytest.mark.parametrize("source,rel", [
    ("from vllm_kimi_ext.testing import checkpoints", "drafts/m.py"),
    ("def f():\n    from vllm_kimi_ext.testing.distributed import free_port", "verify/m.py"),
    ("from ..testing.checkpoints import write_tiny_kimi_k25", "drafts/m.py"),
    ("from .. import testing", "verify/m.py"),
    ("from . import testing", "__init__.py"),
    ("import vllm_kimi_ext.testing.tokenizers", "cli.py"),
    ("from bench.harness import common", "costmodel/report.py"),
    ("import importlib\nimportlib.import_module('vllm_kimi_ext.testing.vllm_cpu')", "plugin.py"),
    ("from testkit.checkpoints import write_tiny_kimi_k25", "drafts/m.py"),
    ("def f():\n    import testkit.distributed", "verify/m.py"),
    ("import importlib\nimportlib.import_module('testkit.vllm_cpu')", "plugin.py"),
    ("from vllm_kimi_ext.testing import checkpoints", "testing/m.py"),  # no exempt folder
])
def test_a_planted_import_is_found(source, rel):
    assert forbidden_imports(source, Path(rel))


@pytest.mark.parametrize("source,rel", [
    ("from vllm_kimi_ext.tokenizers import check", "drafts/m.py"),
    ("from .testing_notes import x", "drafts/m.py"),  # vllm_kimi_ext.drafts.testing_notes
    ("import testkitten", "cli.py"),
    ("import benchmark_tools", "cli.py"),
])
def test_allowed_imports_pass(source, rel):
    assert forbidden_imports(source, Path(rel)) == []


@pytest.mark.parametrize("source,rel", [
    ("from pathlib import Path\nLIST = Path(__file__).resolve().parents[2] / 'tests'",
     "testing/m.py"),
    ("from pathlib import Path\nROOT = Path(__file__).resolve().parent.parent", "patchset.py"),
    ("import os\nR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))", "x.py"),
    ("from pathlib import Path\nHERE = Path(__file__).parent\nROOT = HERE.parent", "x.py"),
    ("from pathlib import Path\nUP = Path(__file__).parent / '..' / 'docs'", "x.py"),
    ("import os\nUP = os.path.join(os.path.dirname(__file__), '..', 'docs')", "x.py"),
    ("from pathlib import Path as P\nROOT = P(__file__).resolve().parent.parent", "cli.py"),
])
def test_a_planted_path_escape_is_found(source, rel):
    assert escaping_paths(source, Path(rel))


@pytest.mark.parametrize("source,rel", [
    ("from pathlib import Path\nP = Path(__file__).resolve().parent.parent / 'costmodel'",
     "drafts/m.py"),
    ("from pathlib import Path\nP = Path(__file__).parents[1] / 'profiles'", "costmodel/m.py"),
    ("from pathlib import Path\nP = Path(__file__).with_name('data.json')", "m.py"),
    ("import os\nP = os.path.join(os.path.dirname(__file__), 'data')", "m.py"),
])
def test_paths_inside_the_package_pass(source, rel):
    assert escaping_paths(source, Path(rel)) == []
