"""The layout of the verifier: one verifier and one plan, no import cycle between modules,
small files, one backend rule.

* The module-level import graph of the whole package (every ``import`` / ``from``
  statement, at module level or inside functions, relative or absolute) has no cycle: a
  cycle hidden by imports inside functions is still a cycle.
* No file under ``verify/`` exceeds 650 lines.
* The eager verifier and the second plan are gone from the package; vLLM is imported only
  by the integration glue (``tests/unit/test_package_boundaries.py`` enforces where).
* One rule chooses the Triton or the torch implementation: ``backend.use_triton``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.test_package_boundaries import (
    PACKAGE,
    _imported_names,
    _module_name,
    strongly_connected,
)

MAX_VERIFY_LINES = 650
#: Cycles outside the verifier that this test found when it was written, each with where
#: it is; an entry that no longer finds its cycle fails the test, so the list only shrinks.
KNOWN_CYCLES: dict[tuple[str, str], str] = {}


def _sources() -> dict[Path, str]:
    return {p.relative_to(PACKAGE): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def module_cycles(sources: dict[Path, str]) -> list[list[str]]:
    """Strongly connected components (more than one module) of the module import graph.

    An import names the longest package module that prefixes the imported name
    (``from .x import f`` -> ``x``; ``from . import x`` -> ``x``). A module's own ancestor
    packages are not edges (Python initialises them before the module, whatever it
    imports)."""
    modules = {_module_name(rel) for rel in sources}
    edges: dict[str, set[str]] = {}
    for rel, src in sources.items():
        me = _module_name(rel)
        for _, name in _imported_names(ast.parse(src), rel):
            parts = name.split(".")
            target = next((".".join(parts[:i]) for i in range(len(parts), 0, -1)
                           if ".".join(parts[:i]) in modules), None)
            if target is None or target == me or me.startswith(target + "."):
                continue
            edges.setdefault(me, set()).add(target)
    return sorted(strongly_connected(edges))


def test_no_import_cycle_between_modules_of_the_package():
    cycles = [tuple(c) for c in module_cycles(_sources())]
    new = [c for c in cycles if c not in KNOWN_CYCLES]
    assert new == [], "\n".join(" <-> ".join(c) for c in new)
    assert sorted(KNOWN_CYCLES) == sorted(c for c in cycles if c in KNOWN_CYCLES), (
        "a known cycle is gone: remove it from KNOWN_CYCLES")


def test_a_cycle_hidden_inside_a_function_is_found():
    """The cycle the verifier once had: ``graph_step`` imports a kernel module inside a
    function, the kernel module imports ``graph_step`` at module level."""
    planted = {Path("verify/__init__.py"): "",
               Path("verify/graph_step.py"): "def run():\n    from . import merge\n",
               Path("verify/merge.py"): "from .graph_step import Merged\n",
               Path("verify/ranks.py"): "import torch\n"}
    assert module_cycles(planted) == [["vllm_kimi_ext.verify.graph_step",
                                       "vllm_kimi_ext.verify.merge"]]
    planted[Path("verify/merge.py")] = "from .ranks import x\n"
    assert module_cycles(planted) == []


def test_files_under_verify_are_small():
    long = {str(rel): src.count("\n") for rel, src in _sources().items()
            if rel.parts[0] == "verify" and src.count("\n") > MAX_VERIFY_LINES}
    assert long == {}


def test_one_verifier_and_one_plan():
    text = "\n".join(_sources().values())
    for gone in ("class VocabShardedVerifier", "class ShardedPlan", "def plan_verification",
                 "class CommPlan", "class BatchModes"):
        assert gone not in text, gone
    assert not (PACKAGE / "verify" / "vllm_runner.py").exists()
    assert (PACKAGE / "integration" / "sharded_verify" / "sampler.py").is_file()


def test_one_backend_rule():
    """``is_cuda and triton_available()`` (the auto rule) is written once, in backend.py."""
    hits = [str(rel) for rel, src in _sources().items()
            if "triton_available()" in src and "is_cuda" in src]
    assert hits == ["verify/backend.py"]
