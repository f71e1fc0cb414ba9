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


def _python_with_vllm(tmp_path, version: str | None) -> str:
    """A 'python' whose software probe reports ``version`` of vLLM (None: not installed)."""
    script = tmp_path / f"py-vllm-{version}"
    probe = json.dumps({"vllm": version, "python": "3.11"})
    script.write_text(f"#!/bin/sh\necho '{probe}'\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("argv,words", [
    (["--draft-dir", "nosuch=/tmp"], "--draft-dir nosuch: not a draft of the answer"),
    (["--draft-dir", "zlab-dflash"], "--draft-dir"),
    (["--plan-out", "x.json"], "--plan-out: only with --plan-only"),
    (["--python", "/nonexistent/python", "--draft-dir", "zlab-dflash={tmp}"],
     "/nonexistent/python"),
    (["--python", "box=/nonexistent/python"], "/nonexistent/python"),  # run's syntax
    (["--python", "stock=/opt/venv"], "use @box: pass PATH or box=PATH"),
    (["--python", "{old}"], "has vLLM 0.33.0; expected vLLM 0.34.0"),
    (["--python", "{none}"], "has vLLM not installed; expected vLLM 0.34.0"),
    (["--python", sys.executable, "--draft-dir", "zlab-dflash=/nonexistent/copy"],
     "write it first (vllm-kimi-ext draft rope-config"),
])
def test_recommendation_bad_input(tmp_path, capsys, argv, words):
    """Each refused before anything launches: one line on stderr, exit 2, nothing written.
    Planted bug: the vLLM version check after the launches; the {old} row would start
    vllm serve (here: fail later with another message)."""
    pys = tmp_path / "pys"
    pys.mkdir()
    fakes = {"{old}": _python_with_vllm(pys, "0.33.0"), "{none}": _python_with_vllm(pys, None)}
    before = sorted(tmp_path.rglob("*"))
    argv = [fakes.get(a, a.replace("{tmp}", str(tmp_path))) for a in argv]
    rc = runner.main(["recommendation", "--out", str(tmp_path / "out"), *argv])
    out, err = capsys.readouterr()
    err = err.strip()
    assert rc == 2 and words in err and len(err.splitlines()) == 1, err
    assert sorted(tmp_path.rglob("*")) == before
    assert "wrote" not in out


def test_recommendation_accepts_runs_python_syntax_and_names_each_arm(capsys):
    h = headline()
    assert runner.main(["recommendation", "--plan-only", "--python", "box=/opt/venv"]) == 0
    text = capsys.readouterr().out
    assert "@box (/opt/venv)" in text or "/opt/venv" in text
    first = text.splitlines()[:2]
    assert first[0].startswith(f"answer: `{h.draft.name}` k = {h.plan.k}")
    assert first[1].startswith(f"measure: `{h.measure_next.draft.name}`")
    if h.measure_next.draft.name == "zlab-dflash":
        assert "RoPE attention factor unknown" in first[1] and "1.4159" in first[1]


def test_the_printed_next_step_runs_as_printed(tmp_path, capsys):
    """The verdict's ``plan --draft NAME --acceptance-from results.json`` on a results file
    with both launches picks the draft's own run (it used to stop on '2 speculative runs;
    pick one with --acceptance-run')."""
    import shlex

    from bench.harness.e2e.recommendation import next_steps
    from vllm_kimi_ext.cli import main

    h = headline()
    runs = []
    for role, j in (("answer", h.choice), ("measure", h.measure_next)):
        runs.append({"id": f"speculative={role}", "axes": {"speculative": role},
                     "status": "ok", "speculative_config": speculative_config(j.plan),
                     "levels": [{"concurrency": 1, "acceptance": {
                         "per_position": [0.7, 0.5, 0.3][: j.plan.k] + [0.2] * max(
                             0, j.plan.k - 3), "num_drafts": 100}}]})
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"schema": "vllm-kimi-ext/e2e-results/1", "runs": runs}))
    rows = [{"draft": j.draft.name, "measured_acceptance_length": 2.0}
            for j in (h.choice, h.measure_next)]
    text = next_steps(rows, tmp_path)
    cmds = [c.strip("`") for c in text.split(": ", 1)[1].split("; ")]
    assert len(cmds) == 2
    for cmd in cmds:
        argv = shlex.split(cmd)
        assert argv[0] == "vllm-kimi-ext"
        assert main(argv[1:]) == 0, capsys.readouterr().err
        assert "--acceptance-from" in cmd and "run speculative=" in capsys.readouterr().out


def test_an_answer_with_nothing_to_measure_beside_it_runs_alone(monkeypatch, capsys):
    """The measure arm is skipped with one line (it used to stop with a ValueError)."""
    import dataclasses

    from vllm_kimi_ext.costmodel import headline as headline_module

    alone = dataclasses.replace(headline(), worth_measuring=None, alternative=None)
    monkeypatch.setattr(headline_module, "headline", lambda *a, **k: alone)
    assert runner.main(["recommendation", "--plan-only"]) == 0
    text = capsys.readouterr().out
    assert "measure: skipped (the answer names no configuration worth measuring" in text
    assert "speculative=answer" in text and "speculative=measure" not in text
