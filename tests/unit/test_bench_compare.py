"""``runner.py compare``: B/A ratios on two synthetic result files, and within one file."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from bench.harness import e2e
from bench.harness.schema import E2E_SCHEMA, E2EResults, validate

RUNNER = Path(__file__).resolve().parents[2] / "bench" / "e2e" / "runner.py"


def level(ds, conc, tok_s, tpot, acc_len=None, coll=None):
    acc = None
    if acc_len is not None:
        acc = {"num_drafts": 10, "draft_tokens": 30, "accepted_tokens": int((acc_len - 1) * 10),
               "per_position": [0.8, 0.5, 0.2], "mean_acceptance_length": acc_len,
               "draft_acceptance_rate": 0.5}
    return {"dataset": ds, "temperature": 0.0, "concurrency": conc, "requests": 8,
            "completed": 8, "errors": 0, "duration_s": 2.0, "output_tokens": 100,
            "output_tokens_per_s": tok_s, "tpot_ms_p50": tpot, "tpot_ms_p90": tpot * 1.2,
            "ttft_ms_p50": 50.0, "latency_s_p50": 1.0, "acceptance": acc,
            "generation_tokens": 100, "collectives_per_output_token": coll,
            "collectives_by_phase": None, "stopped_by": "requests", "error_samples": []}


def run(rid, axes, levels):
    return {"id": rid, "axes": axes, "python": "python", "env": {}, "serve_args": [],
            "speculative_config": None, "status": "ok", "reason": None, "startup_s": 1.0,
            "levels": levels, "server_log": None, "server_software": None}


def results(runs):
    doc = {"schema": E2E_SCHEMA, "name": "syn", "created": "2026-01-01T00:00:00+00:00",
           "model": {"ref": "m", "path": "m", "tiny": False}, "config_file": None,
           "config": {}, "matrix": {}, "prompts": {}, "provenance": {}, "runs": runs,
           "notes": []}
    assert validate(doc, E2EResults) == []
    return doc


A = results([run("speculative=none", {"speculative": "none"},
                 [level("gsm8k", 1, 80.0, 12.5, coll=123.0),
                  level("gsm8k", 4, 200.0, 20.0, coll=123.0)]),
             run("speculative=k3", {"speculative": "k3"},
                 [level("gsm8k", 1, 150.0, 6.7, acc_len=2.7, coll=60.0)])])
B = results([run("speculative=none", {"speculative": "none"},
                 [level("gsm8k", 1, 100.0, 10.0, coll=123.0),
                  level("mt-bench", 1, 90.0, 11.0)]),
             run("speculative=k3", {"speculative": "k3"},
                 [level("gsm8k", 1, 180.0, 5.0, acc_len=2.7, coll=45.0)])])


def test_ratios_are_b_over_a():
    rows = {(r["run"], r["concurrency"]): r for r in e2e.compare_rows(A, B)}
    assert set(rows) == {("speculative=none", 1), ("speculative=k3", 1)}  # matched only
    none = rows[("speculative=none", 1)]
    assert none["tok_s_ratio"] == pytest.approx(100 / 80)
    assert none["tpot_ratio"] == pytest.approx(10 / 12.5)
    assert none["coll_ratio"] == pytest.approx(1.0)
    k3 = rows[("speculative=k3", 1)]
    assert k3["tok_s_ratio"] == pytest.approx(1.2)
    assert k3["coll_ratio"] == pytest.approx(0.75)
    assert k3["accept_a"] == k3["accept_b"] == 2.7
    md = e2e.compare_markdown(e2e.compare_rows(A, B), "A", "B")
    assert "| speculative=k3 | gsm8k | 0 | 1 | 150.0 | 180.0 | 1.200 |" in md


def test_axis_pairs_within_one_file():
    doc = results([run("env=stock,spec=k3", {"env": "stock", "spec": "k3"},
                       [level("gsm8k", 1, 100.0, 10.0, coll=200.0)]),
                   run("env=patched,spec=k3", {"env": "patched", "spec": "k3"},
                       [level("gsm8k", 1, 125.0, 8.0, coll=50.0)])])
    rows = e2e.compare_rows(doc, None, ("env", "stock", "patched"))
    assert len(rows) == 1 and rows[0]["run"] == "spec=k3"
    assert rows[0]["tok_s_ratio"] == pytest.approx(1.25)
    assert rows[0]["coll_ratio"] == pytest.approx(0.25)
    with pytest.raises(ValueError):
        e2e.compare_rows(doc)


def test_compare_cli_writes_the_table(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_e2e_runner_cmp", RUNNER)
    runner = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = runner
    spec.loader.exec_module(runner)
    (tmp_path / "a.json").write_text(json.dumps(A))
    (tmp_path / "b.json").write_text(json.dumps(B))
    out = tmp_path / "cmp.md"
    assert runner.main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                        "--out", str(out)]) == 0
    assert "1.250" in out.read_text() and "1.250" in capsys.readouterr().out
    bad = dict(A, runs="nope")
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    assert runner.main(["compare", str(tmp_path / "bad.json"), str(tmp_path / "b.json")]) == 2
