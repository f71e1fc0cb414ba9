"""No function of ``vllm_kimi_ext`` is used nowhere.

A module-level function or a method (dunders aside) is used when its name appears as a
name, an attribute, an imported name or a dotted string (``mock.patch`` targets,
``"module:Class"`` references) anywhere in the package, the tests, the test kit, the
benchmarks or the noxfile, other than its own definition. Read from the AST; nothing is
imported. Methods that upstream code calls (interface overrides) are listed with why.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "vllm_kimi_ext"
USERS = ("vllm_kimi_ext", "tests", "testkit", "bench")
#: called by code outside this repository (by name, through an interface), or pending
CALLED_FROM_OUTSIDE = {
    "tokenizers/tokenization_kimi.py": {
        # transformers' PreTrainedTokenizer calls these on the remote-code tokenizer
        "_content", "get_vocab", "_tokenize", "_convert_token_to_id", "_convert_id_to_token",
        "convert_tokens_to_string", "build_inputs_with_special_tokens",
        "num_special_tokens_to_add", "save_vocabulary"},
    "plugin.py": {"emit"},  # logging.Handler.emit
    "integration/tli_speculator.py": {"get_draft_top_tokens"},  # vLLM's speculator interface
    "costmodel/__init__.py": {"__getattr__"},  # module attribute hook (PEP 562)
    "verify/__init__.py": {"__getattr__"},  # module attribute hook (PEP 562)
}
#: used nowhere, left for the change that already rewrites its module (name -> why)
PENDING: dict[str, str] = {}


def _uses(sources: list[str]) -> Counter:
    uses: Counter = Counter()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Name):
                uses[node.id] += 1
            elif isinstance(node, ast.Attribute):
                uses[node.attr] += 1
            elif isinstance(node, ast.alias):
                uses.update(node.name.split("."))
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and re.fullmatch(r"[\w.:]+", node.value)):
                uses.update(re.split(r"[.:]", node.value))
    return uses


def _definitions(source: str) -> list[tuple[int, str]]:
    out = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((node.lineno, node.name))
        elif isinstance(node, ast.ClassDef):
            out += [(m.lineno, m.name) for m in node.body
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and not (m.name.startswith("__") and m.name.endswith("__"))]
    return out


def unused(package: dict[str, str], others: list[str]) -> list[str]:
    """``path:line: name`` of every function of ``{package-relative path: source}`` whose
    name is used nowhere in the package or ``others`` (sources)."""
    uses = _uses([*package.values(), *others])
    return [f"{rel}:{line}: {name}" for rel, source in sorted(package.items())
            for line, name in _definitions(source)
            if not uses[name] and name not in CALLED_FROM_OUTSIDE.get(rel, ())]


def _scan() -> list[str]:
    package = {p.relative_to(PACKAGE).as_posix(): p.read_text(encoding="utf-8")
               for p in sorted(PACKAGE.rglob("*.py"))}
    others = [p.read_text(encoding="utf-8") for d in USERS[1:] for p in (ROOT / d).rglob("*.py")
              if p.resolve() != Path(__file__).resolve()]  # PENDING's names are not uses
    others.append((ROOT / "noxfile.py").read_text(encoding="utf-8"))
    return unused(package, others)


def test_no_function_is_used_nowhere():
    found = _scan()
    dead = [f for f in found if f.rpartition(": ")[2] not in PENDING]
    assert dead == [], "delete these (or say who calls them in CALLED_FROM_OUTSIDE):\n" \
        + "\n".join(dead)
    stale = sorted(set(PENDING) - {f.rpartition(": ")[2] for f in found})
    assert stale == [], f"no longer dead: remove {stale} from PENDING"


def test_the_scan_sees_a_planted_dead_function():
    package = {"m.py": "def used():\n    pass\n\n\ndef dead():\n    pass\n\n\n"
                       "class C:\n    def __init__(self):\n        pass\n\n"
                       "    def method(self):\n        pass\n",
               "n.py": "from vllm_kimi_ext.m import used\nused()\n"}
    assert unused(package, []) == ["m.py:5: dead", "m.py:13: method"]
    assert unused(package, ["mock.patch('vllm_kimi_ext.m.dead')\nC().method()\n"]) == []
