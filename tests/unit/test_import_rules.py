"""The package's allowed arrows, stated once and checked over the AST of every module
(nothing is imported; function-level imports count):

* **serving never builds a cost model**: nothing under ``integration/`` imports
  ``costmodel`` (the per-step handover thresholds are package data,
  ``integration/handover.json``, written by ``nox -s docs``);
* **no CLI handler below its CLI**: ``train/`` does not import ``costmodel.cli``, and
  ``costmodel/report.py`` does not import the root ``cli``;
* **the oracle stands apart**: ``verify/reference.py`` imports only torch, the noise both
  sides share (``verify/hashing.py``) and its own batch layout (``verify/batch.py``), and
  no other module of the package imports it;
* **the step by round**: each round of the step (``verify/stats.py``, ``merge.py``,
  ``escalate/``, ``decide.py``, ``residual.py``) imports only the shared layer
  (:data:`ROUND_SHARED`: the contract, the row math, the step's device tensors, the noise,
  the backend switch, the shard geometry, the fused shard statistics), its own package and
  the Triton kernels, never another round; only the rounds and ``shard_stats.py`` import
  the kernels (``verify/_kernels/``), and nothing under ``verify/`` outside the kernels,
  the rounds and the backend switch imports ``triton``; the escalation's registry names
  exactly the contract's escalation kinds;
* **one step contract**: ``verify/protocol.py`` imports no torch (the cost model reads it),
  the cost model's verify price imports it, and no other module defines one of its
  constants again (by name, or as a module-level literal equal to a distinctive value of
  it, such as round 1's ``(5 + 2 * 128) * 4`` bytes per row).

Each rule is a function of ``{package-relative path: source}``, so a test plants a
forbidden arrow in a copy of the sources and watches the rule fire.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.unit.test_package_boundaries import _imported_names
from vllm_kimi_ext.verify import protocol

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_kimi_ext"
REFERENCE = "verify/reference.py"
#: What the oracle may import (absolute module names, or prefixes ending in ".").
REFERENCE_ALLOWED = ("torch", "__future__", "vllm_kimi_ext.verify.hashing",
                     "vllm_kimi_ext.verify.batch")
PROTOCOL = "verify/protocol.py"
#: Modules that must read the step's sizes from the contract.
CONTRACT_READERS = ("costmodel/verify_cost.py", "integration/verifier_choice.py")
#: Modules that talk about the step's wire layout or modes: their module-level literals
#: are compared with the contract's values.
MIRROR_SCOPE = ("costmodel/", "integration/", "verify/")


def _sources() -> dict[str, str]:
    return {p.relative_to(PACKAGE).as_posix(): p.read_text()
            for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(rel: str, source: str) -> list[tuple[int, str]]:
    return _imported_names(ast.parse(source), Path(rel))


def _hits(sources: dict[str, str], where: str, target: str) -> list[str]:
    """Imports of ``target`` (a module or a package prefix) by the modules under ``where``."""
    return sorted({f"{rel}:{line}: imports {name}"
                   for rel, src in sources.items() if rel.startswith(where)
                   for line, name in _imports(rel, src)
                   if name == target or name.startswith(target + ".")})


def integration_to_costmodel(sources):
    return _hits(sources, "integration/", "vllm_kimi_ext.costmodel")


def train_to_costmodel_cli(sources):
    return _hits(sources, "train/", "vllm_kimi_ext.costmodel.cli")


def report_to_root_cli(sources):
    return _hits(sources, "costmodel/report.py", "vllm_kimi_ext.cli")


def reference_apart(sources):
    """The oracle imports nothing of the product; the product does not import the oracle."""
    out = [f"{REFERENCE}:{line}: imports {name}"
           for line, name in _imports(REFERENCE, sources[REFERENCE])
           if not any(name == a or name.startswith(a + ".") for a in REFERENCE_ALLOWED)]
    for rel, src in sources.items():
        if rel != REFERENCE:
            out += [f"{rel}:{line}: imports the oracle ({name})"
                    for line, name in _imports(rel, src)
                    if name == "vllm_kimi_ext.verify.reference"
                    or name.startswith("vllm_kimi_ext.verify.reference.")]
    return sorted(set(out))


def _contract_constants() -> dict[str, object]:
    return {n: v for n, v in vars(protocol).items()
            if n.isupper() and not n.startswith("_")
            and isinstance(v, (int, float, str, tuple, dict))}


def _distinctive(value) -> bool:
    """A value too specific to occur by chance: containers, strings, numbers >= 100 that
    are not a power of two (block sizes of 128 or 256 are everywhere)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        return abs(value) >= 100
    if isinstance(value, int):
        return abs(value) >= 100 and abs(value) & (abs(value) - 1) != 0
    return bool(value)


def _literal(node: ast.AST):
    """The value of a literal expression (numbers, strings, tuples, dicts, + - * //)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult,
                                                             ast.FloorDiv, ast.Pow)):
        a, b = _literal(node.left), _literal(node.right)
        ops = {ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y,
               ast.Mult: lambda x, y: x * y, ast.FloorDiv: lambda x, y: x // y,
               ast.Pow: lambda x, y: x ** y}
        return ops[type(node.op)](a, b)
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_literal(e) for e in node.elts)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
    return ast.literal_eval(node)


def _derived_values() -> list:
    """The contract's values and the sizes derived from it that a mirror would copy."""
    vals = [v for v in _contract_constants().values() if _distinctive(v)]
    vals += [protocol.round1_bytes_per_row(), tuple(protocol.TOP_P_MODES)]
    return vals


def mirrors(sources):
    """Module-level names outside the contract that define one of its constants again."""
    names, values = _contract_constants(), _derived_values()
    out = []
    for rel, src in sources.items():
        if rel == PROTOCOL or not rel.startswith(MIRROR_SCOPE):
            continue
        for node in ast.parse(src).body:
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, ast.AnnAssign) and node.value else [])
            for t in (t for t in targets if isinstance(t, ast.Name)):
                try:
                    value = _literal(node.value)
                except (ValueError, TypeError, SyntaxError, KeyError, ZeroDivisionError):
                    continue  # computed (from the contract or otherwise): not a copy
                if t.id in names or (_distinctive(value) and value in values):
                    out.append(f"{rel}:{node.lineno}: {t.id} = {ast.unparse(node.value)} "
                               "copies verify/protocol.py")
    for rel in CONTRACT_READERS:
        if not _hits({rel: sources[rel]}, rel, "vllm_kimi_ext.verify.protocol"):
            out.append(f"{rel}: does not read verify/protocol.py")
    return sorted(out)


V = "vllm_kimi_ext.verify."
#: The step's rounds (package-relative paths; a folder holds one round's variants).
ROUNDS = ("verify/stats.py", "verify/merge.py", "verify/escalate/", "verify/decide.py",
          "verify/residual.py")
#: What a round may import besides torch, its own package and the Triton kernels.
ROUND_SHARED = tuple(V + m for m in ("protocol", "rowmath", "step_io", "hashing", "backend",
                                     "ranks", "shard_stats"))
KERNELS = V + "_kernels"
#: The modules that launch Triton kernels.
LAUNCHERS = (*ROUNDS, "verify/shard_stats.py")


def _round_of(rel: str) -> str | None:
    return next((r for r in ROUNDS if rel == r or (r.endswith("/") and rel.startswith(r))), None)


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def rounds_apart(sources):
    """A round imports the shared layer, its own package and the kernels only."""
    out = []
    for rel, src in sources.items():
        r = _round_of(rel)
        if r is None:
            continue
        own = V + r[len("verify/"):].removesuffix(".py").rstrip("/").replace("/", ".")
        for line, name in _imports(rel, src):
            if not name.startswith("vllm_kimi_ext"):
                continue
            if not (any(_under(name, m) for m in (*ROUND_SHARED, KERNELS, own))):
                out.append(f"{rel}:{line}: imports {name} (a round imports the shared "
                           "layer, its own package and the kernels only)")
    return sorted(out)


def kernels_behind_the_launchers(sources):
    """Only the rounds and the fused shard statistics import the Triton kernels; only the
    kernels and the backend switch import triton."""
    out = []
    for rel, src in sources.items():
        in_kernels = rel.startswith("verify/_kernels/")
        for line, name in _imports(rel, src):
            if (_under(name, KERNELS) and not in_kernels
                    and not any(rel == x or (x.endswith("/") and rel.startswith(x))
                                for x in LAUNCHERS)):
                out.append(f"{rel}:{line}: imports the Triton kernels ({name})")
            if (name.split(".")[0] == "triton" and rel.startswith("verify/") and not in_kernels
                    and rel != "verify/backend.py" and not _round_of(rel)
                    and rel != "verify/shard_stats.py"):
                out.append(f"{rel}:{line}: imports triton")
    return sorted(out)


def protocol_torch_free(sources):
    return [f"{PROTOCOL}:{line}: imports {name}" for line, name in
            _imports(PROTOCOL, sources[PROTOCOL])
            if name.split(".")[0] in ("torch", "triton", "vllm")
            or (name.startswith("vllm_kimi_ext.")
                and not name.startswith("vllm_kimi_ext.verify.protocol"))]


RULES = {
    "integration -/-> costmodel": integration_to_costmodel,
    "train -/-> costmodel.cli": train_to_costmodel_cli,
    "costmodel.report -/-> root cli": report_to_root_cli,
    "reference -/-> product, product -/-> reference": reference_apart,
    "nothing mirrors the step contract": mirrors,
    "the step contract is torch-free": protocol_torch_free,
    "a round imports no other round": rounds_apart,
    "the kernels sit behind the launchers": kernels_behind_the_launchers,
}
@pytest.mark.parametrize("rule", list(RULES))
def test_the_package_keeps_its_arrows(rule):
    assert RULES[rule](_sources()) == []


PLANTS = {
    "integration -/-> costmodel": ("integration/verifier_choice.py",
                                   "from vllm_kimi_ext.costmodel import verify_cost\n"),
    "train -/-> costmodel.cli": ("train/settings.py",
                                 "def f():\n    from vllm_kimi_ext.costmodel.cli import strict\n"),
    "costmodel.report -/-> root cli": ("costmodel/report.py",
                                       "from vllm_kimi_ext.cli import main\n"),
    "reference -/-> product, product -/-> reference": (REFERENCE,
                                                       "from .rowmath import scale_logits\n"),
    "nothing mirrors the step contract": ("costmodel/verify_cost.py",
                                          "ROUND1_BYTES_PER_ROW = (5 + 2 * 128) * 4\n"),
    "the step contract is torch-free": (PROTOCOL, "import torch\n"),
    "a round imports no other round": ("verify/decide.py",
                                       "from .merge import merge_round1_torch\n"),
    "the kernels sit behind the launchers": ("verify/graph_step.py",
                                             "def f():\n    from ._kernels import merge\n"),
}


@pytest.mark.parametrize("rule", list(PLANTS))
def test_each_rule_fires_on_a_planted_arrow(rule):
    rel, line = PLANTS[rule]
    sources = _sources()
    sources[rel] = sources[rel] + "\n" + line
    assert RULES[rule](sources), f"{rule}: planted {line!r} in {rel} and nothing fired"


def test_more_plants_of_the_two_subtle_rules():
    sources = _sources()
    product = dict(sources)
    product["verify/merge.py"] += "\nfrom .reference import sampling_keep_mask\n"
    assert any("imports the oracle" in h for h in reference_apart(product))
    renamed = dict(sources)
    renamed["costmodel/verify_cost.py"] += ("\nESC_BYTES = {\"top_p_T1\": 1.0, "
                                            "\"top_p_T0.6\": 0.6}\n")
    renamed["integration/verifier_choice.py"] += "\nTOP_P_MODES = {'top_p_T1': 1.0}\n"
    hits = mirrors(renamed)
    assert any("ESC_BYTES" in h for h in hits) and any("TOP_P_MODES" in h for h in hits)
    cut = dict(sources)
    cut["costmodel/verify_cost.py"] = cut["costmodel/verify_cost.py"].replace(
        "from vllm_kimi_ext.verify import protocol", "protocol = None")
    assert any("does not read" in h for h in mirrors(cut))


def test_more_plants_of_the_round_rules():
    sources = _sources()
    variant = dict(sources)  # an escalation variant reaching into round 1's merge
    variant["verify/escalate/rows.py"] += "\nfrom ..merge import merge_round1_torch\n"
    assert any("escalate/rows.py" in h for h in rounds_apart(variant))
    own = dict(sources)  # a variant importing its own package's registry is fine
    own["verify/escalate/rows.py"] += "\ndef f():\n    from . import VARIANTS\n"
    assert rounds_apart(own) == []
    tri = dict(sources)
    tri["verify/graph_step.py"] += "\nimport triton\n"
    assert any("imports triton" in h for h in kernels_behind_the_launchers(tri))


def test_the_escalation_registry_is_the_contracts_kinds():
    from vllm_kimi_ext.verify import escalate

    assert tuple(escalate.VARIANTS) == protocol.ESCALATIONS
    for kind, module in escalate.VARIANTS.items():
        assert callable(module.resolve), kind
