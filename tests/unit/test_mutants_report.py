"""The committed mutation-testing report (``bench/reports/mutants/``) and its config.

* Every module the report names (a package's paths and exclusions, every surviving
  mutant, every explained survivor) exists in the package today: a report that names a
  deleted or moved file is stale (re-run ``nox -s mutants``).
* The config covers the product's verifier: the graph step's modules are mutated and its
  tests run per mutant, and the escalation's kernels have their own package with the
  interpreter test; every listed test file exists.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "bench" / "reports" / "mutants"
MODULE = re.compile(r"vllm_kimi_ext/[\w/]+\.py")


def named_modules(report: dict, survivors: dict, markdown: str) -> set[str]:
    names: set[str] = set()
    for pkg in report["packages"].values():
        names |= set(pkg["paths"]) | set(pkg["excluded"])
        names |= {s["module"] for s in pkg["survived"]}
    names |= {key.split(":")[0] for key in survivors}
    names |= set(MODULE.findall(markdown))
    return names


def missing(names: set[str], root: Path = ROOT) -> list[str]:
    return sorted(n for n in names if not (root / n).exists())


def test_the_report_names_only_files_that_exist():
    names = named_modules(json.loads((REPORT / "mutants.json").read_text()),
                          json.loads((REPORT / "survivors.json").read_text()),
                          (REPORT / "mutants.md").read_text())
    assert names
    assert missing(names) == [], "stale mutants report: re-run `nox -s mutants`"


def test_a_report_naming_a_removed_file_is_caught(tmp_path):
    (tmp_path / "vllm_kimi_ext" / "verify").mkdir(parents=True)
    (tmp_path / "vllm_kimi_ext" / "verify" / "graph_step.py").write_text("")
    report = {"packages": {"verify": {"paths": ["vllm_kimi_ext/verify"], "excluded": [],
                                      "survived": [{"module": "vllm_kimi_ext/verify/sharded.py"}]}}}
    assert missing(named_modules(report, {}, ""), tmp_path) == ["vllm_kimi_ext/verify/sharded.py"]
    report["packages"]["verify"]["survived"] = []
    assert missing(named_modules(report, {"vllm_kimi_ext/verify/cuts.py:1:x": ""},
                                 "`vllm_kimi_ext/verify/graph_step.py`"), tmp_path) == [
        "vllm_kimi_ext/verify/cuts.py"]


def test_the_config_covers_the_graph_step_and_the_escalation():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("mutants_cfg", ROOT / "bench" / "mutants.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[spec.name]
    verify, esc = mod.PACKAGES["verify"], mod.PACKAGES["verify_escalation"]
    assert verify.paths == ("vllm_kimi_ext/verify",)
    for module in ("graph_step.py", "stats.py", "merge.py", "escalate/rows.py", "decide.py",
                   "residual.py", "protocol.py", "step_io.py", "ranks.py"):
        assert f"vllm_kimi_ext/verify/{module}" not in verify.exclude
    assert "tests/unit/test_verify_graph_step.py" in verify.tests
    assert "tests/unit/test_verify_escalation_pins.py" in verify.tests
    assert esc.paths == ("vllm_kimi_ext/verify/_kernels/escalate_split.py",)
    assert esc.tests == ("tests/unit/test_verify_escalation_interpreter.py",)
    for pkg in mod.PACKAGES.values():
        for test in pkg.tests:
            assert (ROOT / test).is_file(), test


@pytest.mark.parametrize("name", ["mutants.json", "mutants.md", "survivors.json"])
def test_report_files_exist(name):
    assert (REPORT / name).is_file()
