"""The e2e runner end to end against a stand-in server (no vLLM): launch, readiness,
streamed requests, /metrics deltas, collective log lines, failure detection, stop."""

from __future__ import annotations

import stat
import sys

import pytest

from bench.harness import e2e, fake_server
from bench.harness.e2e import run as e2e_run
from bench.harness.schema import E2EResults, validate


def test_parse_prometheus_and_acceptance():
    before = e2e.parse_prometheus(
        '# HELP x\nvllm:spec_decode_num_drafts_total{engine="0"} 10.0\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0"} 30.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 12.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 8.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 4.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="2"} 0.0\n')
    after = e2e.parse_prometheus(
        'vllm:spec_decode_num_drafts_total{engine="0"} 30.0\n'
        'vllm:spec_decode_num_drafts_total{engine="1"} 10.0\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0"} 120.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 57.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 32.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 19.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="2"} 6.0\n')
    acc = e2e.acceptance_delta(before, after)
    # engines summed: 40 - 10 = 30 drafts, 90 draft tokens, 45 accepted
    assert acc == {"num_drafts": 30, "draft_tokens": 90, "accepted_tokens": 45,
                   "per_position": [0.8, 0.5, 0.2], "mean_acceptance_length": 2.5,
                   "draft_acceptance_rate": 0.5}
    assert e2e.acceptance_delta({}, e2e.parse_prometheus("vllm:x_total 1\n")) is None


def test_parse_collective_lines_counts_one_rank():
    line = ("INFO 12-02 [accounting.py:245] vllm-kimi-ext collectives per step (last 100 "
            "steps): draft: 4.0 calls 57,344 B, target: 123.5 calls 1,763,328 B")
    text = "\n".join([
        f"(Worker_TP0 pid=7) {line}",
        f"(Worker_TP1 pid=8) {line}",
        "unrelated line",
        "(Worker_TP0 pid=7) INFO vllm-kimi-ext collectives per step (last 50 steps): none",
    ])
    c = e2e.parse_collective_lines(text)
    assert c["steps"] == 150 and c["calls"] == pytest.approx(12750.0)
    assert c["by_phase"] == {"draft": 400.0, "target": 12350.0}
    assert c["bytes"] == pytest.approx(100 * (57344 + 1763328))
    assert e2e.parse_collective_lines("nothing here") is None


@pytest.fixture()
def fake_python(tmp_path):
    """A 'python' whose ``-m ...`` runs the stand-in server (other calls: the real one)."""
    script = tmp_path / "fakepy"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-m" ]; then shift 2; exec "{sys.executable}" "{fake_server.__file__}" '
        '"$@"; fi\n'
        f'exec "{sys.executable}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_run_matrix_against_the_stand_in(tmp_path, fake_python, monkeypatch):
    monkeypatch.setattr(e2e_run, "SETTLE_S", 0.05)
    cfg = e2e.normalize_config({
        "name": "fake", "model": "org/fake-model",
        "matrix": {
            "env": {"stock": {"python": "@stock"},
                    "broken": {"python": "@stock", "env": {"FAKE_VLLM_FAIL": "1"}}},
            "speculative": {"none": None,
                            "k3": {"speculative_config": {"method": "eagle3", "model": "d",
                                                          "num_speculative_tokens": 3}}}},
        "exclude": [{"env": "broken", "speculative": "k3"}],
        "datasets": ["gsm8k"], "concurrency": [1, 2], "requests_per_level": 4,
        "max_tokens": 32, "startup_timeout_s": 30, "level_time_limit_s": 30})
    out = tmp_path / "out"
    res = e2e.run_matrix(cfg, out, pythons={"stock": fake_python}, use_git=False,
                         progress=lambda m: None)
    assert validate(res, E2EResults) == []
    runs = {r["id"]: r for r in res["runs"]}
    assert [r["status"] for r in res["runs"]] == ["ok", "ok", "server_failed"]
    failed = runs["env=broken,speculative=none"]
    assert failed["reason"] == ("vllm serve exited with code 1: RuntimeError: fake engine "
                                "failed to start")
    plain, spec = runs["env=stock,speculative=none"], runs["env=stock,speculative=k3"]
    for r in (plain, spec):
        assert [(lv["dataset"], lv["concurrency"]) for lv in r["levels"]] == [("gsm8k", 1),
                                                                              ("gsm8k", 2)]
        for lv in r["levels"]:
            assert lv["completed"] == lv["requests"] == 4 and lv["errors"] == 0
            assert lv["output_tokens"] == 48 and lv["generation_tokens"] == 48
            assert lv["output_tokens_per_s"] > 0 and lv["tpot_ms_p50"] > 0
            assert lv["stopped_by"] == "requests"
    assert plain["levels"][0]["acceptance"] is None
    assert plain["levels"][0]["collectives_per_output_token"] == 124.0
    acc = spec["levels"][1]["acceptance"]
    assert acc["mean_acceptance_length"] == 2.0 and acc["per_position"] == [1.0, 0.0, 0.0]
    assert acc["num_drafts"] == 24 and acc["draft_tokens"] == 72
    # 6 steps of (124 + 4) calls per 12-token request, counted on one of the two ranks
    assert spec["levels"][0]["collectives_per_output_token"] == 64.0
    assert spec["levels"][0]["collectives_by_phase"] == {"draft": 2.0, "target": 62.0}
    assert spec["server_software"]["python"]  # the probe ran with that python
    report = (out / "report.md").read_text()
    assert "fake engine failed to start" in report and "| 2.00 | 1.00, 0.00, 0.00 |" in report
    assert (out / "logs").is_dir() and len(list((out / "logs").iterdir())) == 3


def test_stop_after_failed_starts(tmp_path, fake_python):
    cfg = e2e.normalize_config({
        "name": "fail", "model": "m",
        "matrix": {"env": {"a": {"python": "@x", "env": {"FAKE_VLLM_FAIL": "1"}},
                           "b": {"python": "@x"}}},
        "datasets": ["gsm8k"], "startup_timeout_s": 20})
    res = e2e.run_matrix(cfg, tmp_path, pythons={"x": fake_python}, use_git=False,
                         stop_after_failed_starts=1, progress=lambda m: None)
    assert [r["status"] for r in res["runs"]] == ["server_failed", "not_started"]
    assert res["runs"][1]["reason"].startswith("not attempted after 1 failed server start")
