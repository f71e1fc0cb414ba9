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
    assert dead == [], ("delete these (or say who calls them in CALLED_FROM_OUTSIDE):\n"
        + "\n".join(dead))
    stale = sorted(set(PENDING) - {f.rpartition(": ")[2] for f in found})
    assert stale == [], f"no longer dead: remove {stale} from PENDING"


def test_the_scan_sees_a_planted_dead_function():
    package = {"m.py": "def used():\n    pass\n\n\ndef dead():\n    pass\n\n\n"
                       "class C:\n    def __init__(self):\n        pass\n\n"
                       "    def method(self):\n        pass\n",
               "n.py": "from vllm_kimi_ext.m import used\nused()\n"}
    assert unused(package, []) == ["m.py:5: dead", "m.py:13: method"]
    assert unused(package, ["mock.patch('vllm_kimi_ext.m.dead')\nC().method()\n"]) == []


#: The serving side (the verifier and the runner glue): a function there that only tests,
#: the test kit or the benchmarks call is test code in the wheel. The exceptions, each with
#: its reason; an entry no longer found fails the test, so the list only shrinks.
SERVING = ("verify/", "integration/")
TEST_ONLY_ALLOWED: dict[str, str] = {
    "verify/reference.py": "the full-logits oracle itself (shipped so users can check the "
                           "verifier against it)",
    "verify/batch.py:from_draft_tokens": "the oracle's batch builder",
    "verify/step_io.py:from_layout": "the step's inputs from the oracle's batch",
    "verify/protocol.py:round1_bytes_per_row": "a round size of the contract (the test "
                                               "kit's escalation prices read it)",
    "verify/protocol.py:num_collectives": "the plan's diagnostics the benchmarks print",
    "verify/protocol.py:bytes_received_per_rank": "the plan's diagnostics",
    "verify/protocol.py:bytes_per_escalated_row_per_rank": "the plan's diagnostics",
    "verify/protocol.py:bytes_per_row_per_rank": "the plan's diagnostics",
    "verify/protocol.py:reset": "FallbackCounter's reset, for a caller that reports per "
                                "interval",
    "verify/ranks.py:num_calls": "CountingAllGather, the collective accounting of a step",
    "verify/ranks.py:bytes_sent": "CountingAllGather, the collective accounting of a step",
    "verify/_kernels/common.py:hash_bits_kernel": "the Triton twin of hashing.py's bits, "
                                                  "pinned by the GPU tier",
    "integration/sharded_verify/gate.py:ineligibility": "the gate's answer as a reason "
                                                        "string (the canary asks it)",
    "integration/tli_speculator.py:compute_draft_logits": "vLLM's speculator interface",
}


def serving_test_only(package: dict[str, str]) -> list[str]:
    """``path:line: name`` of every function under :data:`SERVING` that no module of the
    package uses (tests, the test kit and the benchmarks may), less the allowed ones."""
    uses = _uses(list(package.values()))
    out = []
    for rel, source in sorted(package.items()):
        if not rel.startswith(SERVING) or rel in TEST_ONLY_ALLOWED:
            continue
        out += [f"{rel}:{line}: {name}" for line, name in _definitions(source)
                if not uses[name] and f"{rel}:{name}" not in TEST_ONLY_ALLOWED
                and name not in CALLED_FROM_OUTSIDE.get(rel, ())]
    return out


def test_the_serving_side_ships_no_test_only_code():
    package = {p.relative_to(PACKAGE).as_posix(): p.read_text(encoding="utf-8")
               for p in sorted(PACKAGE.rglob("*.py"))}
    found = serving_test_only(package)
    assert found == [], ("used only by tests / testkit / bench: move them there (or say why "
                         "in TEST_ONLY_ALLOWED):\n" + "\n".join(found))
    names = {f"{rel}:{name}" for rel, src in package.items() for _, name in _definitions(src)}
    stale = sorted(k for k in TEST_ONLY_ALLOWED if k not in package and k not in names)
    assert stale == [], f"no longer in the package: remove {stale} from TEST_ONLY_ALLOWED"


def test_a_planted_test_only_helper_is_caught():
    """Planted: ``draft_probs_shard`` (used only by a test before it moved out) back in the
    runner glue."""
    package = {p.relative_to(PACKAGE).as_posix(): p.read_text(encoding="utf-8")
               for p in sorted(PACKAGE.rglob("*.py"))}
    package["integration/sharded_verify/inputs.py"] += "\n\ndef draft_probs_shard(q):\n    pass\n"
    found = serving_test_only(package)
    assert [(f.partition(":")[0], f.rpartition(": ")[2]) for f in found] == [
        ("integration/sharded_verify/inputs.py", "draft_probs_shard")]
