"""The result-file validator, and what the runner writes without starting anything."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from bench.harness import e2e
from bench.harness.schema import (
    BenchResults,
    E2EResults,
    SchemaError,
    check,
    validate,
)


@dataclasses.dataclass
class Inner:
    x: float
    tag: str | None


@dataclasses.dataclass
class Outer:
    n: int
    items: list[Inner]
    table: dict[str, float]
    opt: Inner | None = None


def test_validator_types():
    good = {"n": 1, "items": [{"x": 1, "tag": None}, {"x": 2.5, "tag": "a"}],
            "table": {"a": 1.0}}
    assert validate(good, Outer) == []
    bad = copy.deepcopy(good)
    bad["n"] = 1.5
    bad["items"][1]["x"] = "fast"
    bad["table"]["b"] = None
    bad["extra"] = 1
    del bad["items"][0]["tag"]
    problems = validate(bad, Outer)
    assert "$.n: expected an integer, got float" in problems
    assert "$.items[1].x: expected a number, got str" in problems
    assert "$.items[0].tag: missing" in problems
    assert "$.extra: unknown field" in problems
    assert any(p.startswith("$.table.b") for p in problems)
    with pytest.raises(SchemaError):
        check(bad, Outer)
    assert validate({**good, "n": True}, Outer) == ["$.n: expected an integer, got bool"]


def test_runner_plan_only_results_validate(tmp_path):
    c = e2e.normalize_config({
        "name": "plan", "model": "org/model", "allow_same_python": True,
        "matrix": {"env": {"stock": {"python": "@stock"}, "patched": {"python": "@patched"}}},
        "datasets": ["gsm8k", "mt-bench"], "concurrency": [1, 2]})
    res = e2e.run_matrix(c, tmp_path / "out", plan_only=True, use_git=False,
                         progress=lambda m: None)
    assert list(tmp_path.iterdir()) == []  # a plan writes nothing
    saved = json.loads(json.dumps(res))
    assert validate(saved, E2EResults) == []
    assert [r["status"] for r in saved["runs"]] == ["planned", "planned"]
    assert saved["matrix"] == {"env": ["stock", "patched"]}
    assert set(saved["prompts"]) == {"gsm8k", "mt-bench"}
    assert e2e.e2e_markdown(saved).startswith("# End-to-end serving: plan")
    assert e2e.plan_markdown(saved, "out").startswith("# Plan: plan")
    assert res["runs"][0]["id"] == "env=stock"
    broken = copy.deepcopy(saved)
    broken["runs"][0]["status"] = "great"
    assert any("status" in p for p in validate(broken, E2EResults))


def test_bench_results_schema():
    doc = {"schema": "vllm-kimi-ext/bench-results/1", "created": "now", "duration_s": 1.0,
           "args": {}, "capabilities": {}, "provenance": {},
           "sections": [{"name": "costmodel", "title": "t", "status": "ok", "reason": None,
                         "duration_s": 0.1, "data": {}, "artifacts": ["a.png"]}],
           "skipped": [{"section": "allreduce", "item": "whole", "why": "no GPU"}]}
    assert validate(doc, BenchResults) == []
    doc["sections"][0]["status"] = "meh"
    assert validate(doc, BenchResults)
