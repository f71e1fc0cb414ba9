"""``vllm-kimi-ext plan``: outputs, the validation report, and every bad argument refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vllm_kimi_ext.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(args, capsys):
    """(exit code, stdout, stderr); argparse's own refusals arrive as SystemExit."""
    try:
        rc = main(["plan", *args])
    except SystemExit as exc:
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_plan_writes_png_and_json(tmp_path, capsys):
    png, js = tmp_path / "plot.png", tmp_path / "out.json"
    rc, out, _ = run(["--draft", "lightseek-eagle3", "--out", str(png), "--json", str(js)],
                     capsys)
    assert rc == 0
    for col in ("k", "placement", "tok/s", "x no-spec", "coll/tok", "Ranked by evidence",
                "Answer: `lightseek-eagle3` k = "):
        assert col in out
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000
    doc = json.loads(js.read_text())
    assert doc["recommended"]["draft"] == "lightseek-eagle3" and doc["recommended"]["buildable"]
    ans = doc["answer"]["choice"]
    assert (ans["draft"], ans["k"]) == ("lightseek-eagle3", doc["recommended"]["k"])
    iv = ans["interval_tokens_per_s"]
    assert iv["low"] < ans["tokens_per_s"] < iv["high"] and iv["coverage"] == 0.8
    assert ans["evidence"]["level"] == "modelled only"
    assert doc["answer"]["interval"]["coverage"] == 0.8
    no_spec = doc["answer"]["no_speculation"]
    assert (no_spec["interval_tokens_per_s"]["low"] < no_spec["tokens_per_s"]
        < no_spec["interval_tokens_per_s"]["high"])
    assert doc["rows"] and all(r["tokens_per_s"] > 0 for r in doc["rows"])


@pytest.mark.parametrize("suffix,magic", [(".svg", b"<?xml"), (".pdf", b"%PDF")])
def test_plot_format_follows_the_suffix(tmp_path, capsys, suffix, magic):
    path = tmp_path / f"plan{suffix}"
    assert run(["--draft", "lightseek-eagle3", "--out", str(path)], capsys)[0] == 0
    assert path.read_bytes().startswith(magic)


def test_validate_prints_every_point(capsys):
    rc, out, _ = run(["--validate"], capsys)
    assert rc == 0
    assert "measured" in out and "predicted" in out and "error" in out
    assert "k26-v6-mtp/B1/ctx0" in out and "calibration:" in out
    assert "held out, between fitted cells of the same run:" in out
    assert "held out, runs with no fitted cell:" in out
    assert "mechanism the model lacks" in out and "kernels (B12X MoE and MLA kernels)" in out


@pytest.mark.parametrize("flags", [["--tau", "2.9"], ["--acceptance", "0.7,0.5,0.4"]])
def test_acceptance_overrides(flags, capsys):
    rc, out, _ = run(["--draft", "nvidia-eagle3", "--draft", "lightseek-eagle3", *flags], capsys)
    assert rc == 0 and "nvidia-eagle3" in out


def test_acceptance_from_an_e2e_run(tmp_path, capsys):
    f = tmp_path / "results.json"
    f.write_text(json.dumps({"schema": "vllm-kimi-ext/e2e-results/1", "runs": [
        {"id": "eagle", "speculative_config": {"method": "eagle3",
                                               "model": "/models/lightseekorg/kimi-k2.5-eagle3"},
         "levels": [{"acceptance": {"per_position": [0.7, 0.45, 0.3], "num_drafts": 50}}]}]}))
    rc, out, _ = run(["--draft", "lightseek-eagle3", "--acceptance-from", str(f)], capsys)
    assert rc == 0 and "results.json: run eagle, 50 drafts" in out
    # another draft's acceptance is refused unless the user says so
    rc, _, err = run(["--draft", "zlab-dflash", "--acceptance-from", str(f)], capsys)
    assert (rc == 2 and "measured draft '/models/lightseekorg/kimi-k2.5-eagle3', not --draft "
        "zlab-dflash" in err and "--acceptance-any-draft" in err)
    rc, out, _ = run(["--draft", "zlab-dflash", "--acceptance-from", str(f),
                      "--acceptance-any-draft"], capsys)
    assert rc == 0 and "results.json: run eagle" in out


def test_json_outputs_are_strict(tmp_path, capsys):
    for argv in (["--draft", "zlab-dflash"], ["--validate"]):
        path = tmp_path / "out.json"
        rc, _, _ = run([*argv, "--json", str(path)], capsys)
        assert rc == 0
        text = path.read_text()
        json.loads(text, parse_constant=lambda c, a=argv: pytest.fail(f"bare {c} in {a}"))
    # draft bill's payback when fine-tuning gains nothing was a bare Infinity
    rc = main(["draft", "bill", "--prompts", "1000", "--tau-now", "1.6", "--tau-after", "1.6",
               "--json"])
    doc = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"bare {c}"))
    assert rc == 0 and doc["compare"]["payback_hours_vs_today"] is None
    from vllm_kimi_ext.costmodel.cli import strict

    assert (json.dumps(strict({"a": float("nan"), "b": [float("inf"), 1.5]})) ==
        '{"a": null, "b": [null, 1.5]}')


def test_a_measured_latency_table_replaces_the_shipped_one(tmp_path, capsys):
    t = tmp_path / "mine.json"
    t.write_text(json.dumps({"name": "mine", "backends": {"nccl": {"ops": {
        "allreduce": [[1024, 5.0], [1 << 24, 200.0]]}}}}))
    rc, out, _ = run(["--draft", "lightseek-eagle3", "--latency", str(t)], capsys)
    assert rc == 0 and "latency table mine" in out


def test_list(capsys):
    rc, out, _ = run(["--list"], capsys)
    assert rc == 0
    for name in ("rtx-pro-6000-pcie-x8", "kimi-k2.5", "lightseek-eagle3", "zlab-dflash",
                 "qwen3-0.6b-tli", "rtx-pro-6000-pcie-switch-x8", "field figure"):
        assert name in out


BAD = [  # (arguments, words the one-line message must contain)
    (["--tau", "2.5", "--tau-k", "0"], "--tau-k must be within 1..15"),
    (["--tau-k", "3"], "--tau-k needs --tau"),
    (["--tau", "inf"], "--tau must be finite"),
    (["--tau", "nan"], "--tau must be finite"),
    (["--tau", "0.5"], "--tau must be >= 1"),
    (["--tau", "9", "--tau-k", "3"], "impossible with 3 draft tokens"),
    (["--routing-skew", "inf"], "--routing-skew must be finite"),
    (["--routing-skew", "-1"], "--routing-skew must be >= 1"),
    (["--batch", "0"], "--batch must be within"),
    (["--batch", "two"], "--batch must be an integer"),
    (["--context", "-5"], "--context must be within"),
    (["--k-max", "9"], "--k-max must be within 1..7"),
    (["--acceptance", "0.5,0.7"], "must not increase"),
    (["--acceptance", "0.5,,0.2"], "comma-separated"),
    (["--acceptance", "1.5"], "within [0, 1]"),
    (["--acceptance", "nan"], "within [0, 1]"),
    (["--dataset", "poetry"], "--dataset 'poetry'"),
    (["--backend", "gloo"], "--backend 'gloo'"),
    (["--draft", "lightseek-eagel3"], "valid: "),
    (["--hardware", "rtx-6000-pcie"], "unknown hardware profile"),
    (["--model", "kimi-k3"], "unknown model profile"),
    (["--out", "plan.pdf.gif"], "suffix must be one of .png, .svg, .pdf"),
    (["--json", "plan.txt"], "suffix must be one of .json"),
    (["--acceptance-run", "x"], "--acceptance-run needs --acceptance-from"),
]


@pytest.mark.parametrize("args,words", BAD)
def test_bad_argument_is_refused_in_one_line(args, words, capsys):
    rc, out, err = run(["--draft", "lightseek-eagle3", *args] if "--draft" not in args
                       else args, capsys)
    assert rc == 2
    assert words in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err + out


def test_output_under_a_file_is_refused(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for flag, name in (("--out", "p.png"), ("--json", "p.json")):
        rc, _, err = run(["--draft", "lightseek-eagle3", flag, str(blocker / name)], capsys)
        assert rc == 2 and "is a file, not a directory" in err
    rc, _, err = run(["--draft", "lightseek-eagle3", "--out", str(tmp_path)], capsys)
    assert rc == 2


@pytest.mark.parametrize("content,words", [
    ("{ not json", "not valid JSON (line 1"),
    ("[1, 2]", "expected a JSON object"),
    ('{"name": "x", "kind": "eagle3", "proposal": "autoregressive"}',
     "field 'architecture' is missing"),
    ('{"name": "x", "kind": "eagle3", "proposal": "autoregressive", '
     '"architecture": {"vocab_size": -3}}', "'vocab_size' must be a positive"),
    ('{"name": "x", "kind": "teleport", "proposal": "autoregressive"}', "field 'kind'"),
])
def test_bad_profile_json_names_file_and_field(tmp_path, capsys, content, words):
    bad = tmp_path / "draft.json"
    bad.write_text(content)
    rc, out, err = run(["--draft", str(bad), "--tau", "2.5"], capsys)
    assert rc == 2 and str(bad) in err and words in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err + out


def test_bad_hardware_profile_names_its_field(tmp_path, capsys):
    from vllm_kimi_ext.costmodel.catalog import load_raw

    doc = load_raw("hardware", "rtx-pro-6000-pcie-x8")
    doc["memory_bandwidth_GBps"] = "fast"
    bad = tmp_path / "hw.json"
    bad.write_text(json.dumps(doc))
    rc, _, err = run(["--hardware", str(bad)], capsys)
    assert rc == 2 and "'memory_bandwidth_GBps' must be a positive number" in err


def test_draft_without_acceptance_asks_for_it(capsys):
    rc, _, err = run(["--draft", "nvidia-eagle3"], capsys)
    assert rc == 2 and "--tau" in err


# ---------------------------------------------------------------------------------------------
# vllm-kimi-ext plan --verify-cost
# ---------------------------------------------------------------------------------------------


VERIFY_FIXTURE = Path(__file__).parent / "fixtures" / "verify_graph_fixture.json"


def test_plan_verify_cost_prints_the_priced_tables(capsys):
    rc, out, _ = run(["--verify-cost", "--verify-report", str(VERIFY_FIXTURE), "--batch", "16"],
                       capsys)
    assert rc == 0 and "FIXTURE" in out and "not a measurement of it" in out
    assert re.search(r"^16 +64 +T=1\.0, top_p 0\.95 ", out, re.M)  # --batch joins 1, 8, 32, 64
    assert "wins from batch" in out and "batch-sharded vs stock" in out


def test_plan_verify_cost_without_a_report_prices_nothing(capsys, tmp_path, monkeypatch):
    from vllm_kimi_ext.costmodel import verify_cost as vc
    from vllm_kimi_ext.costmodel import verify_measured as vm

    monkeypatch.setattr(vm, "DEFAULT_REPORT", tmp_path / "absent.json")
    rc, out, _ = run(["--verify-cost"], capsys)
    assert rc == 0 and out.startswith(vc.NOT_PRICED)
    assert not re.search(r"\d+ \+ \d+ = \d+", out)
    assert "wins from" not in out and "wins at" not in out


BAD_PLAN = [  # (arguments, words of the one-line error); "{bad}" is a malformed report
    (["--verify-report", "r.json"], "--verify-report needs --verify-cost"),
    (["--verify-cost", "--verify-report", "{absent}"], "no such verify-step report"),
    (["--verify-cost", "--verify-report", "{bad}"], "field 'rounds' must be a positive"),
    (["--verify-cost", "--verify-report", "{dir}"], "no such verify-step report"),
    (["--verify-cost", "--batch", "0"], "--batch must be"),
]


@pytest.mark.parametrize("args,words", BAD_PLAN, ids=[" ".join(a) for a, _ in BAD_PLAN])
def test_plan_verify_cost_refuses_bad_input_in_one_line(args, words, capsys, tmp_path):
    d = json.loads(VERIFY_FIXTURE.read_text())
    d["cases"][2]["rounds"] = 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    paths = {"{absent}": str(tmp_path / "absent.json"), "{bad}": str(bad), "{dir}": str(tmp_path)}
    rc, out, err = run([paths.get(a, a) for a in args], capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert words in err and "Traceback" not in err
