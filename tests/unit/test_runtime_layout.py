"""The runtime patches' home (vllm_kimi_ext/runtime/), read from source without vLLM:
one module per upstream class, classes named after their target, every class
installed by exactly one feature, no two classes on one attribute, thin bodies,
and no Patch class anywhere else in the product."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from vllm_kimi_ext import runtime

PACKAGE = Path(runtime.__file__).resolve().parents[1]
#: statements a replacement body may hold: it calls product code, nothing more
MAX_BODY_STATEMENTS = 3


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def test_snake_case_rule():
    assert _snake("GPUModelRunner") == "gpu_model_runner"
    assert _snake("TargetDependentARSpeculator") == "target_dependent_ar_speculator"
    assert _snake("VllmConfig") == "vllm_config"


def test_every_runtime_module_holds_patches_of_the_class_it_is_named_after():
    declared = runtime.declared_patches()
    assert declared, "no Patch classes found in vllm_kimi_ext/runtime/"
    assert {d.module for d in declared} == set(runtime.module_names())
    for d in declared:
        assert d.module == _snake(d.target), f"{d.ref}: module should be {_snake(d.target)}.py"
        assert d.name.startswith(d.target) and d.name != d.target, (
            f"{d.ref}: name it {d.target}<What>")


def test_every_patch_is_installed_by_exactly_one_feature():
    declared = {d.ref for d in runtime.declared_patches()}
    listed = [r for f in runtime.FEATURES for r in f.patches]
    assert sorted(listed) == sorted(set(listed)), "a patch listed by two features"
    assert set(listed) == declared


def test_no_two_patches_share_an_attribute():
    owner: dict[tuple[str, str], str] = {}
    for d in runtime.declared_patches():
        for attr in d.attributes:
            key = (d.target, attr)
            assert key not in owner, (f"{d.target}.{attr}: {owner[key]} and {d.name} "
                "(extend the first class's body instead)")
            owner[key] = d.name


def test_patch_bodies_are_thin():
    for name in runtime.module_names():
        tree = ast.parse((PACKAGE / "runtime" / f"{name}.py").read_text())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                body = [s for s in fn.body if not (isinstance(s, ast.Expr)
                                                   and isinstance(s.value, ast.Constant))]
                assert len(body) <= MAX_BODY_STATEMENTS, (
                    f"{name}.py {cls.name}.{fn.name}: move the logic into product code")


def test_no_patch_class_outside_runtime():
    """Every runtime patch of vLLM in the package lives in runtime/ (test fixtures are in
    the top-level testkit/, outside the package)."""
    outside = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "runtime" or rel.name == "patching.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    "Patch" in ast.unparse(b) for b in node.bases):
                outside.append(f"{rel}:{node.name}")
            if (isinstance(node, ast.Call) and ast.unparse(node.func) == "type"
                    and "Patch" in ast.unparse(node)):
                outside.append(f"{rel}: type(...) built patch")
    assert outside == []


def test_runtime_package_imports_no_vllm_until_a_patch_is_needed():
    code = ("import sys; from vllm_kimi_ext import runtime; runtime.declared_patches(); "
            "runtime.selected({}); print(sorted(m for m in sys.modules "
            "if m == 'vllm' or m.startswith('vllm.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=PACKAGE.parent, check=True)
    assert out.stdout.strip() == "[]"


def test_selection_follows_the_flags():
    base = ["vllm_config:VllmConfigDraftCheck", "speculative_config:SpeculativeConfigKimiK25MTP",
            "mtp_speculator_config:MTPSpeculatorConfigKimiK25MTP"]
    assert runtime.selected({}) == base
    assert runtime.selected({"VLLM_KIMI_EXT_SHARDED_VERIFY": "1"}) == base + [
        "sampler:SamplerRememberParams", "gpu_model_runner:GPUModelRunnerShardedVerify"]
    counting = runtime.selected({"VLLM_KIMI_EXT_COUNT_COLLECTIVES": "10"})
    assert counting[:3] == base and runtime.GROUP_COUNTING in counting and len(counting) == 6
    assert runtime.selected({"VLLM_KIMI_EXT_COUNT_COLLECTIVES": "0"}) == base


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=PACKAGE.parent, check=False)


def test_comm_gets_the_counting_patch_from_runtime_and_fails_closed_without_it():
    """comm must not import runtime (no cycle), so runtime registers the GroupCoordinator
    patch installer with comm.accounting; a counter started before that refuses to run
    (it would count nothing). Fresh interpreters: no vLLM import needed."""
    alone = _run("from vllm_kimi_ext.comm import CollectiveCounter\n"
                 "CollectiveCounter().start()")
    assert alone.returncode != 0 and "import vllm_kimi_ext.runtime first" in alone.stderr, (
        alone.stderr)
    registered = _run(
        "import vllm_kimi_ext.runtime as rt\n"
        "from vllm_kimi_ext.comm import CollectiveCounter, accounting\n"
        "calls = []\n"
        "rt.install = lambda *refs: calls.append(refs)\n"  # no vLLM here: record the call
        "with CollectiveCounter():\n"
        "    pass\n"
        "assert calls == [(rt.GROUP_COUNTING,)], calls\n")
    assert registered.returncode == 0, registered.stderr
