"""``bench/e2e/runner.py recommendation`` against the project's stand-in server: the
answer of ``vllm-kimi-ext plan`` and the configuration to measure beside it run back to back
with the same prompts, served with the answer's own speculative config, and forecast.json /
forecast.md carry the measured tokens/s and acceptance beside the forecast.

Planted bug this was written against: the forecast rows taking the measured numbers from
the other launch (roles swapped); ``test_recommendation_runs_both_and_writes_the_forecast``
fails on the measured tokens/s ("assert 452.1835 == 459.558").
"""

from __future__ import annotations

import json
import sys

import pytest

from bench.e2e import runner
from bench.harness.e2e import run as e2e_run
from tests.unit.test_bench_e2e_fake_server import fake_python  # noqa: F401 (fixture)
from vllm_kimi_ext.costmodel.headline import headline, speculative_config


def test_recommendation_runs_both_and_writes_the_forecast(
        tmp_path, fake_python, monkeypatch, capsys):  # noqa: F811 (the imported fixture)
    monkeypatch.setattr(e2e_run, "SETTLE_S", 0.05)
    h = headline()
    draft_dir = tmp_path / "dflash-copy"
    draft_dir.mkdir()
    out = tmp_path / "out"
    rc = runner.main(["recommendation", "--python", fake_python, "--out", str(out),
                      "--requests", "3", "--max-tokens", "24", "--datasets", "gsm8k",
                      "--draft-dir", f"{h.measure_next.draft.name}={draft_dir}", "--no-git",
                      "--startup-timeout", "30"])
    assert rc == 0, capsys.readouterr()
    results = json.loads((out / "results.json").read_text())
    runs = {r["axes"]["speculative"]: r for r in results["runs"]}
    assert list(runs) == ["answer", "measure"]  # back to back, the answer first
    # each launch is served with the answer's own speculative config
    assert runs["answer"]["speculative_config"] == speculative_config(h.plan)
    served = dict(runs["measure"]["speculative_config"])
    assert served.pop("model").endswith("/dflash-copy")  # results scrub the temp prefix
    want = speculative_config(h.measure_next.plan)
    assert served == {k: v for k, v in want.items() if k != "model"}
    # the same prompts, datasets and sampling for both
    levels = {role: [(lv["dataset"], lv["temperature"], lv["concurrency"], lv["requests"])
                     for lv in r["levels"]] for role, r in runs.items()}
    assert levels["answer"] == levels["measure"] and levels["answer"]
    doc = json.loads((out / "forecast.json").read_text())
    rows = {r["role"]: r for r in doc["rows"]}
    for role, j in (("answer", h.choice), ("measure", h.measure_next)):
        r = rows[role]
        assert (r["draft"], r["k"]) == (j.draft.name, j.plan.k)
        assert r["forecast_tokens_per_s"] == pytest.approx(j.tps["point"])
        assert r["forecast_interval"] == pytest.approx(list(j.interval))
        lv = [x for x in runs[role]["levels"] if x["concurrency"] == 1]
        assert r["measured_tokens_per_s"] == pytest.approx(
            sum(x["output_tokens_per_s"] for x in lv) / len(lv))
        # the stand-in accepts the first draft token only: tau 2.0 for any k
        drafts = sum(x["acceptance"]["num_drafts"] for x in lv)
        accepted = sum(x["acceptance"]["accepted_tokens"] for x in lv)
        assert r["measured_acceptance_length"] == pytest.approx(1 + accepted / drafts) == 2.0
        assert r["within_interval"] in (True, False)
    md = (out / "forecast.md").read_text()
    assert "| answer | `" + h.draft.name in md and "measured faster on this box" in md


def test_recommendation_plan_only_names_both_launches(capsys):
    h = headline()
    assert runner.main(["recommendation", "--plan-only"]) == 0
    text = capsys.readouterr().out
    assert "speculative=answer" in text and "speculative=measure" in text
    assert json.dumps(speculative_config(h.plan)) in text


@pytest.mark.parametrize("argv,words", [
    (["--draft-dir", "nosuch=/tmp"], "--draft-dir nosuch: not a draft of the answer"),
    (["--draft-dir", "zlab-dflash"], "--draft-dir"),
    (["--plan-out", "x.json"], "--plan-out: only with --plan-only"),
    (["--python", "/nonexistent/python", "--draft-dir", "zlab-dflash={tmp}"],
     "/nonexistent/python"),
    (["--python", sys.executable], "write the draft copy the docs name"),
])
def test_recommendation_bad_input(tmp_path, capsys, argv, words):
    before = sorted(tmp_path.rglob("*"))
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    rc = runner.main(["recommendation", "--out", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and words in err and len(err.splitlines()) == 1, err
    assert sorted(tmp_path.rglob("*")) == before
