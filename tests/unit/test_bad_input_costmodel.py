"""Bad input to the cost model's commands: ``vllm-kimi-ext plan`` (its validation, its
``--acceptance-from`` and its ``--json``) and ``python -m vllm_kimi_ext.costmodel.report``.

One table of cases, each the files it needs, the argument list, the exit status and the
words the message must contain; every case runs in-process through the command's ``main``.
Checked on every case: the exit status; the words; no ``Traceback``; an exit-2 reason is
one ``<prog>: error: ...`` line on stderr; and a refused command (exit 2) leaves every file
of the case's scratch directory with its bytes and adds none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from vllm_kimi_ext.cli import main as cli_main
from vllm_kimi_ext.costmodel import load_hardware
from vllm_kimi_ext.costmodel.report import main as report_main

E2E = "vllm-kimi-ext/e2e-results/1"


def _results(model: str | None, per=(0.7, 0.45, 0.3), n=40) -> str:
    run = {"id": "spec", "levels": [{"acceptance": {"per_position": list(per),
                                                    "num_drafts": n}}]}
    if model is not None:
        run["speculative_config"] = {"method": "eagle3", "model": model}
    return json.dumps({"schema": E2E, "runs": [run]})


def _files(tmp: Path) -> dict[str, Path]:
    """Every input a case may name (written once per case)."""
    hw = dict(load_hardware("rtx-pro-6000-pcie-x8").raw)
    held = json.loads(json.dumps(hw["calibration"]["runs"]))
    for run in held:
        for p in run["points"]:
            p["split"] = "validation"
    bare = json.loads(json.dumps(hw["calibration"]["runs"]))
    for run in bare:  # an explanation string alone, as profiles once had
        if isinstance(run.get("model_lacks"), dict):
            run["model_lacks"] = run["model_lacks"]["why"]
    paths = {
        "no_calibration": ("hw-no-calibration.json",
                           {**hw, "calibration": {**hw["calibration"], "runs": held}}),
        "bare_excuse": ("hw-bare-excuse.json",
                        {**hw, "calibration": {**hw["calibration"], "runs": bare}}),
        "bad_lacks": ("hw-bad-lacks.json", {**hw, "calibration": {**hw["calibration"], "runs": [
            {**bare[0], "model_lacks": {"difference": "mood", "why": "x"}}, *bare[1:]]}}),
        "eagle": ("eagle.json", _results("lightseekorg/kimi-k2.5-eagle3")),
        "two_runs": ("two-runs.json", json.dumps({"schema": E2E, "runs": [
            {**json.loads(_results("lightseekorg/kimi-k2.5-eagle3-mla"))["runs"][0],
             "id": "answer"},
            {**json.loads(_results("z-lab/Kimi-K2.5-DFlash"))["runs"][0], "id": "measure"},
        ]})),
        "no_model": ("no-model.json", _results(None)),
        "negative_count": ("negative-count.json",
                           _results("lightseekorg/kimi-k2.5-eagle3", n=-40)),
        "bool_rates": ("bool-rates.json",
                       _results("lightseekorg/kimi-k2.5-eagle3", per=(True, 0.5, False))),
        "file": ("a-file", "i am a file"),
    }
    out = {}
    for name, (fname, content) in paths.items():
        path = tmp / fname
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        out[name] = path
    out["json"] = tmp / "out.json"
    return out


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    code: int
    words: tuple[str, ...]
    entry: str = "plan"  # "plan" (vllm-kimi-ext plan) or "report" (the report module)
    prepare: Callable[[dict[str, Path]], None] | None = None


def _plan(what, args, code, words, **kw) -> Case:
    return Case(f"plan/{what}", tuple(args), code, tuple(words), **kw)


def _report(what, args, code, words, **kw) -> Case:
    return Case(f"report/{what}", tuple(args), code, tuple(words), entry="report", **kw)


def _old_json(files):
    files["json"].write_text('{"old": true}\n')


CASES = [
    # plan --draft: a profile name or the checkpoint every serve command uses
    _plan("draft-checkpoint-name", ["--draft", "lightseekorg/kimi-k2.5-eagle3-mla"], 0,
          ["Answer: `lightseek-eagle3-mla` k = "]),
    _plan("draft-unknown-name", ["--draft", "kimi-k2.5-eagle3-mla"], 2,
          ["--draft kimi-k2.5-eagle3-mla: unknown draft profile", "plan --list"]),
    _plan("draft-unknown-checkpoint", ["--draft", "lightseekorg/kimi-k2.9-eagle3"], 2,
          ["--draft lightseekorg/kimi-k2.9-eagle3", "plan --list",
           "lightseek-eagle3-mla = lightseekorg/kimi-k2.5-eagle3-mla"]),
    _plan("draft-missing-json", ["--draft", "/nonexistent/draft.json"], 2,
          ["no such draft profile file"]),
    # plan --acceptance-from a file with both launches of runner.py recommendation
    _plan("acceptance-from-two-runs-picks-the-drafts-own",
          ["--draft", "lightseekorg/kimi-k2.5-eagle3-mla", "--acceptance-from", "{two_runs}"],
          0, ["two-runs.json: run answer, 40 drafts"]),
    _plan("acceptance-from-two-runs-other-draft",
          ["--draft", "lightseek-eagle3", "--acceptance-from", "{two_runs}"], 2,
          ["2 speculative runs; pick one with --acceptance-run",
           "answer: draft lightseekorg/kimi-k2.5-eagle3-mla"]),
    # plan --validate
    _plan("validate-no-calibration-points", ["--validate", "--hardware", "{no_calibration}"], 2,
          ["no point with split 'calibration'", "hw-no-calibration.json"]),
    _plan("validate-no-calibration-json-untouched",
          ["--validate", "--hardware", "{no_calibration}", "--json", "{json}"], 2,
          ["no point with split 'calibration'"], prepare=_old_json),
    _plan("validate-excuse-string-alone", ["--validate", "--hardware", "{bare_excuse}"], 1,
          ["UNEXPLAINED", "names no recorded difference"]),
    _plan("validate-difference-unknown", ["--validate", "--hardware", "{bad_lacks}"], 2,
          ["model_lacks.difference' must be one of image, kernels, host", "'mood'"]),
    _plan("validate-shipped-profile", ["--validate"], 0,
          ["held out, between fitted cells of the same run", "runs with no fitted cell"]),
    # plan --acceptance-from: one draft's acceptance
    _plan("acceptance-from-other-draft",
          ["--draft", "zlab-dflash", "--acceptance-from", "{eagle}"], 2,
          ["measured draft 'lightseekorg/kimi-k2.5-eagle3'", "not --draft zlab-dflash",
           "--acceptance-any-draft"]),
    _plan("acceptance-from-one-of-two-drafts-other",
          ["--draft", "lightseek-eagle3", "--draft", "zlab-dflash", "--acceptance-from",
           "{eagle}"], 2, ["not --draft zlab-dflash"]),
    _plan("acceptance-from-run-records-no-draft",
          ["--draft", "lightseek-eagle3", "--acceptance-from", "{no_model}"], 2,
          ["records no draft model", "speculative_config.model"]),
    _plan("acceptance-from-without-draft", ["--acceptance-from", "{eagle}"], 2,
          ["name the draft the run measured with --draft"]),
    _plan("acceptance-any-draft-without-from", ["--acceptance-any-draft"], 2,
          ["--acceptance-any-draft needs --acceptance-from"]),
    _plan("acceptance-from-its-own-draft",
          ["--draft", "lightseek-eagle3", "--acceptance-from", "{eagle}"], 0,
          ["eagle.json: run spec, 40 drafts"]),
    _plan("acceptance-from-other-draft-overridden",
          ["--draft", "zlab-dflash", "--acceptance-from", "{eagle}", "--acceptance-any-draft"],
          0, ["eagle.json: run spec, 40 drafts"]),
    _plan("acceptance-from-negative-draft-count",
          ["--draft", "zlab-dflash", "--acceptance-from", "{negative_count}",
           "--acceptance-any-draft"], 2,
          ["negative-count.json", "num_drafts' must be a count", "-40"]),
    _plan("acceptance-from-boolean-rates",
          ["--draft", "zlab-dflash", "--acceptance-from", "{bool_rates}",
           "--acceptance-any-draft"], 2,
          ["bool-rates.json", "per_position' must hold rates", "not true/false"]),
    # plan --validate refuses the flags it would ignore
    _plan("validate-with-draft", ["--validate", "--draft", "zlab-dflash"], 2,
          ["it would ignore --draft"]),
    _plan("validate-with-tau", ["--validate", "--tau", "2.5"], 2, ["it would ignore --tau"]),
    _plan("validate-with-batch", ["--validate", "--batch", "4"], 2,
          ["it would ignore --batch"]),
    _plan("validate-with-verify-cost", ["--validate", "--verify-cost"], 2,
          ["it would ignore --verify-cost"]),
    _plan("list-with-draft", ["--list", "--draft", "zlab-dflash"], 2,
          ["--list prints the shipped profiles; it would ignore --draft", "reads nothing else"]),
    _plan("verify-cost-with-draft-and-json", ["--verify-cost", "--draft", "zlab-dflash",
                                              "--json", "{json}"], 2,
          ["--verify-cost prices the verify step", "it would ignore --draft, --json"]),
    # a costed backend nothing can build: the real reason, not "nothing fits"
    _plan("backend-not-buildable", ["--backend", "custom_oneshot"], 2,
          ["--backend custom_oneshot: costed for the what-if table only",
           "refuses its custom all-reduce above 2 PCIe GPUs", "choose from: nccl"]),
    _plan("backend-not-stock", ["--backend", "custom_oneshot", "--stock-only"], 2,
          ["not something stock vLLM 0.34.0 runs"]),
    _plan("json-suffix-wrong", ["--validate", "--json", "{file}.txt"], 2,
          ["the suffix must be one of .json"]),
    # python -m vllm_kimi_ext.costmodel.report
    _report("no-action", [], 2, ["one of the arguments --write-docs --check-docs --report"]),
    _report("unknown-flag", ["--report", "{tmp}/r", "--bogus"], 2,
            ["unrecognized arguments: --bogus"]),
    _report("check-docs-missing-dir", ["--check-docs", "{tmp}/nosuch"], 2,
            ["--check-docs", "no such directory"]),
    _report("check-docs-a-file", ["--check-docs", "{file}"], 2, ["is a file, not a directory"]),
    _report("write-docs-a-file", ["--write-docs", "{file}"], 2, ["is a file, not a directory"]),
    _report("write-docs-under-a-file", ["--write-docs", "{file}/docs"], 2,
            ["a-file is a file, not a directory"]),
    _report("report-a-file", ["--report", "{file}"], 2, ["is a file, not a directory"]),
    _report("report-unknown-hardware", ["--report", "{tmp}/r", "--hardware", "nosuch"], 2,
            ["unknown hardware profile 'nosuch'"]),
    _report("report-hardware-not-json", ["--report", "{tmp}/r", "--hardware", "{eagle}"], 2,
            ["eagle.json"]),
    _report("report-unknown-draft", ["--report", "{tmp}/r", "--draft", "nosuch"], 2,
            ["unknown draft profile 'nosuch'"]),
    _report("report-draft-without-acceptance", ["--report", "{tmp}/r", "--draft",
                                                "nvidia-eagle3"], 2,
            ["--draft nvidia-eagle3: publishes no acceptance figure"]),
    _report("report-batch-zero", ["--report", "{tmp}/r", "--batch", "0"], 2,
            ["--batch", "got 0"]),
    _report("report-batch-nan", ["--report", "{tmp}/r", "--batch", "nan"], 2,
            ["--batch", "'nan'"]),
    _report("report-context-negative", ["--report", "{tmp}/r", "--context", "-1"], 2,
            ["--context", "got -1"]),
    _report("report-nothing-fits", ["--report", "{tmp}/r", "--draft", "lightseek-eagle3",
                                    "--batch", "4096", "--context", "1048576"], 2,
            ["--batch 4096 --context 1048576", "no configuration fits"]),
]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case, tmp_path):
    files = _files(tmp_path)
    if case.prepare:
        case.prepare(files)
    argv = [a.format(tmp=tmp_path, **files) for a in case.argv]
    before = _snapshot(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(["plan", *argv]) if case.entry == "plan" else report_main(argv)
    shown = f"argv {argv}\n--- stdout\n{out.getvalue()}\n--- stderr\n{err.getvalue()}"
    assert code == case.code, shown
    text = out.getvalue() + err.getvalue()
    for word in case.words:
        assert word in text, f"{word!r} missing\n{shown}"
    assert "Traceback" not in text, shown
    if code == 2:
        lines = err.getvalue().strip().splitlines()
        assert len(lines) == 1 and ": error: " in lines[0], shown
        assert _snapshot(tmp_path) == before, f"a refused command changed files\n{shown}"


def test_the_table_covers_both_commands():
    assert {c.entry for c in CASES} == {"plan", "report"}
    assert len({c.id for c in CASES}) == len(CASES) >= 25
