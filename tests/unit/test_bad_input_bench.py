"""Bad input to the bench entry points (``bench/e2e/runner.py``, ``bench/run_all.py``): one
table of cases, each the files it needs, the argument list, the exit status and the words the
message must contain; every case runs in-process through the entry point's ``main(argv)``.

Properties checked on every case: the exit status; the words (case-insensitive, on stderr,
or stdout for a verdict); no ``Traceback`` anywhere; an exit-2 message is one line; and a
refused command (exit 2) or a ``--plan-only`` run changes nothing on disk (every file under
the case's scratch directory keeps its bytes and modification time, nothing is added).

Nothing here starts a server or a benchmark: run_all's suite is replaced by a stub that
records its call, and the runner's server launch by a stub that records a failed start.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import stat
import sys
from pathlib import Path

import pytest
import yaml

from bench.harness.e2e import run as e2e_run
from bench.harness.schema import E2E_SCHEMA

ROOT = Path(__file__).resolve().parents[2]
RUNNER, RUN_ALL = "runner", "run_all"


def _load(rel: str, name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / rel)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


MODULES = {RUNNER: _load("e2e/runner.py", "bench_runner_bad_input"),
           RUN_ALL: _load("run_all.py", "bench_run_all_bad_input")}


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------

BASE = {"name": "t", "model": "org/m",
        "matrix": {"env": {"stock": {"python": "@stock"}, "patched": {"python": "@patched"}},
                   "spec": {"none": None}},
        "datasets": ["gsm8k"], "concurrency": [1], "requests_per_level": 2, "max_tokens": 8}
PYS = ["--python", "stock={py}", "--python", "patched={py}"]


def config(**over) -> str:
    """The YAML text of :data:`BASE` with top-level keys replaced (None: removed)."""
    data = {**json.loads(json.dumps(BASE)), **over}
    return yaml.safe_dump({k: v for k, v in data.items() if v is not None}, sort_keys=False)


def matrix_value(**spec) -> str:
    """A config whose ``env=stock`` value is ``spec`` (merged over the python)."""
    data = json.loads(json.dumps(BASE))
    data["matrix"]["env"]["stock"].update(spec)
    return yaml.safe_dump(data, sort_keys=False)


def results_doc(runs: list[dict] | None = None) -> str:
    level = {"dataset": "gsm8k", "temperature": 0.0, "concurrency": 1, "requests": 2,
             "completed": 2, "errors": 0, "duration_s": 1.0, "output_tokens": 10,
             "output_tokens_per_s": 10.0, "tpot_ms_p50": 5.0, "tpot_ms_p90": 6.0,
             "ttft_ms_p50": 9.0, "latency_s_p50": 0.5, "acceptance": None,
             "generation_tokens": 10, "collectives_per_output_token": None,
             "collectives_by_phase": None, "stopped_by": "requests", "error_samples": []}

    def run(env: str) -> dict:
        return {"id": f"env={env}", "axes": {"env": env}, "python": "python", "env": {},
                "serve_args": [], "speculative_config": None, "status": "ok", "reason": None,
                "startup_s": 1.0, "levels": [level], "server_log": None,
                "server_software": None}

    doc = {"schema": E2E_SCHEMA, "name": "r", "created": "2026-01-01T00:00:00+00:00",
           "model": {"ref": "m", "path": "m", "tiny": False}, "config_file": None,
           "config": {}, "matrix": {"env": ["stock", "patched"]}, "prompts": {},
           "provenance": {}, "runs": [run("stock"), run("patched")] if runs is None else runs,
           "notes": []}
    return json.dumps(doc)


EARLIER = {"out/results.json": '{"earlier": true}', "out/report.md": "# earlier\n",
           "out/logs/00-x.log": "earlier log\n"}
NOT_EXEC = "#!/bin/sh\n"


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    tool: str
    argv: list[str]
    code: int
    words: list[str]
    files: dict[str, str | bytes] = dataclasses.field(default_factory=dict)  # "d/": a dir
    stream: str = "err"  # where the words are: "err" or "out"
    unchanged: bool | None = None  # default: the disk is unchanged when code == 2


C = Case
CASES = [
    # ------------------------------------------------------------------ runner run: the file
    C("config-missing", RUNNER, ["run", "--config", "{t}/nope.yaml", "--plan-only"], 2,
      ["--config", "nope.yaml", "no such file"]),
    C("config-is-dir", RUNNER, ["run", "--config", "{t}/d.yaml", "--plan-only"], 2,
      ["d.yaml", "is a directory"], {"d.yaml/": ""}),
    C("config-bad-yaml", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["c.yaml", "not valid yaml", "line 3"], {"c.yaml": "name: [\nmodel: x\n"}),
    C("config-bad-json", RUNNER, ["run", "--config", "{t}/c.json", "--plan-only"], 2,
      ["c.json", "not valid json", "line 1"], {"c.json": '{"name": "x",}'}),
    C("config-json-nan", RUNNER, ["run", "--config", "{t}/c.json", "--plan-only"], 2,
      ["c.json", "nan", "not a json number"], {"c.json": '{"name": NaN}'}),
    C("config-suffix", RUNNER, ["run", "--config", "{t}/c.txt", "--plan-only"], 2,
      ["c.txt", ".yaml", ".json"], {"c.txt": config()}),
    C("config-binary", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["c.yaml", "not utf-8"], {"c.yaml": b"\x89PNG\r\n\x1a\n\xff\xfe"}),
    C("config-empty", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["c.yaml", "empty", "mapping"], {"c.yaml": ""}),
    C("config-list", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["c.yaml", "expected a mapping", "list"], {"c.yaml": "- a\n- b\n"}),
    C("config-unknown-key", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["c.yaml", "unknown key", "'bogus'", "known:"], {"c.yaml": config(bogus=1)}),
    C("config-duplicate-key", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["c.yaml", "'model'", "twice"], {"c.yaml": config() + "model: other\n"}),
    C("config-json-duplicate-key", RUNNER, ["run", "--config", "{t}/c.json", "--plan-only"],
      2, ["c.json", "'name'", "twice"], {"c.json": '{"name": "a", "name": "b"}'}),
    C("config-missing-matrix", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["c.yaml", "missing 'matrix'"], {"c.yaml": config(matrix=None)}),
    C("config-requests-str", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["c.yaml", "'requests_per_level'", "positive integer", "str"],
      {"c.yaml": config(requests_per_level="8")}),
    C("config-requests-negative", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["'requests_per_level'", "positive integer", "-3"],
      {"c.yaml": config(requests_per_level=-3)}),
    C("config-requests-bool", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["'requests_per_level'", "bool"], {"c.yaml": config(requests_per_level=True)}),
    C("config-time-limit-nan", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["'level_time_limit_s'", "finite", "nan"],
      {"c.yaml": config() + "level_time_limit_s: .nan\n"}),
    C("config-startup-timeout-inf", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"],
      2, ["'startup_timeout_s'", "finite", "inf"],
      {"c.yaml": config() + "startup_timeout_s: .inf\n"}),
    C("config-temperature-negative", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"],
      2, ["'temperature'", ">= 0"], {"c.yaml": config(temperature=[0.0, -0.5])}),
    C("config-concurrency-zero", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["'concurrency'", "positive integers"], {"c.yaml": config(concurrency=[1, 0])}),
    C("config-seed-negative", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["'seed'", ">= 0"], {"c.yaml": config(seed=-1)}),
    C("config-dataset-unknown", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["'datasets'", "mmlu", "gsm8k"], {"c.yaml": config(datasets=["mmlu"])}),
    C("config-model-placeholder", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["'model'", "@huge", "placeholder"], {"c.yaml": config(model="@huge")}),
    C("config-axis-name", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["matrix axis", "a,b", "letters"], {"c.yaml": config(matrix={"a,b": {"x": None}})}),
    C("config-value-name-int", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["matrix tp", "value 8", "quote it"], {"c.yaml": config(matrix={"tp": {8: None}})}),
    C("config-value-not-mapping", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["matrix a=b", "mapping", "str"], {"c.yaml": config(matrix={"a": {"b": "x"}})}),
    C("config-value-unknown-key", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["env=stock", "unknown key", "'pyton'"], {"c.yaml": matrix_value(pyton="x")}),
    C("config-env-list", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["env=stock", "'env'", "mapping"], {"c.yaml": matrix_value(env=["A=1"])}),
    C("config-env-bool", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["'env'", "VLLM_KIMI_EXT", "quote it", "bool"],
      {"c.yaml": matrix_value(env={"VLLM_KIMI_EXT": True})}),
    C("config-serve-args-str", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["'serve_args'", "list"], {"c.yaml": config(serve_args="--enforce-eager")}),
    C("config-spec-k-zero", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["'num_speculative_tokens'", "positive integer", "0"],
      {"c.yaml": matrix_value(speculative_config={"method": "eagle3", "model": "d",
                                                  "num_speculative_tokens": 0})}),
    C("config-spec-placeholder", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["'speculative_config'", "@nope", "placeholder"],
      {"c.yaml": matrix_value(speculative_config={"method": "eagle3", "model": "@nope"})}),
    C("config-exclude-unknown", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["exclude[0]", "env=prod", "not in the matrix"],
      {"c.yaml": config(exclude=[{"env": "prod"}])}),
    C("config-two-pythons", RUNNER, ["run", "--config", "{t}/c.yaml", "--plan-only"], 2,
      ["two axes set python", "env=stock", "spec=none"],
      {"c.yaml": config(matrix={"env": {"stock": {"python": "@stock"}},
                                "spec": {"none": {"python": "@other"}}})}),
    # ------------------------------------------------------------------ runner run: arguments
    C("requests-negative", RUNNER, ["run", "--requests", "-1", "--plan-only"], 2,
      ["--requests", "positive integer", "-1"]),
    C("requests-text", RUNNER, ["run", "--requests", "many", "--plan-only"], 2,
      ["--requests", "positive integer", "'many'"]),
    C("concurrency-empty-item", RUNNER, ["run", "--concurrency", "1,,4", "--plan-only"], 2,
      ["--concurrency", "comma list"]),
    C("startup-timeout-nan", RUNNER, ["run", "--startup-timeout", "nan", "--plan-only"], 2,
      ["--startup-timeout", "finite"]),
    C("level-time-limit-inf", RUNNER, ["run", "--level-time-limit", "inf", "--plan-only"], 2,
      ["--level-time-limit", "finite"]),
    C("time-budget-negative", RUNNER, ["run", "--time-budget", "-5", "--plan-only"], 2,
      ["--time-budget", "> 0"]),
    C("stop-after-zero", RUNNER, ["run", "--stop-after-failed-starts", "0", "--plan-only"], 2,
      ["--stop-after-failed-starts", "positive integer"]),
    C("datasets-unknown", RUNNER, ["run", "--datasets", "gsm8k,mmlu", "--plan-only"], 2,
      ["--datasets", "mmlu", "mt-bench"]),
    C("python-no-equals", RUNNER, ["run", "--python", "stock", "--plan-only"], 2,
      ["--python", "'stock'", "NAME=PATH"]),
    C("python-empty-path", RUNNER, ["run", "--python", "stock=", "--plan-only"], 2,
      ["--python", "NAME=PATH"]),
    C("python-unused-name", RUNNER, ["run", "--python", "stok={py}", "--plan-only"], 2,
      ["--python stok=", "no @stok", "@stock"]),
    C("python-twice", RUNNER, ["run", "--python", "stock=/a", "--python", "stock=/b",
                               "--plan-only"], 2, ["--python stock", "twice"]),
    C("python-missing-when-launching", RUNNER,
      ["run", "--config", "{t}/c.yaml", "--python", "stock={t}/nope", "--python",
       "patched={py}", "--out", "{t}/out"], 2,
      ["--python stock=", "no such file", "python executable"], {"c.yaml": config()}),
    C("python-not-executable", RUNNER,
      ["run", "--config", "{t}/c.yaml", "--python", "stock={t}/py", "--python",
       "patched={py}", "--out", "{t}/out"], 2, ["--python stock=", "not an executable"],
      {"c.yaml": config(), "py": NOT_EXEC}),
    C("python-venv-without-bin", RUNNER,
      ["run", "--config", "{t}/c.yaml", "--python", "stock={t}/venv", "--python",
       "patched={py}", "--out", "{t}/out"], 2, ["--python stock=", "without bin/python"],
      {"c.yaml": config(), "venv/": ""}),
    C("python-not-given", RUNNER, ["run", "--config", "{t}/c.yaml", "--out", "{t}/out"], 2,
      ["@stock", "--python stock=PATH"], {"c.yaml": config()}),
    C("config-python-path-missing", RUNNER, ["run", "--config", "{t}/c.yaml", *PYS[2:],
                                             "--out", "{t}/out"], 2,
      ["c.yaml", "env=stock", "'python' /no/such/python", "no such file"],
      {"c.yaml": matrix_value(python="/no/such/python")}),
    C("select-format", RUNNER, ["run", "--select", "speculative", "--plan-only"], 2,
      ["--select", "AXIS=VALUE"]),
    C("select-unknown-axis", RUNNER, ["run", "--select", "nope=x", "--plan-only"], 2,
      ["--select nope", "no such axis", "speculative"]),
    C("select-unknown-value", RUNNER, ["run", "--select", "env=prod", "--plan-only"], 2,
      ["--select env", "prod", "stock"]),
    C("model-placeholder", RUNNER, ["run", "--model", "@huge", "--plan-only"], 2,
      ["--model @huge", "placeholder"]),
    C("model-local-missing", RUNNER, ["run", "--config", "{t}/c.yaml", *PYS, "--model",
                                      "{t}/no-model", "--out", "{t}/out"], 2,
      ["--model", "no-model", "no such directory"], {"c.yaml": config()}),
    C("out-is-file", RUNNER, ["run", "--config", "{t}/c.yaml", *PYS, "--out", "{t}/f"], 2,
      ["--out", "is a file"], {"c.yaml": config(), "f": "x"}),
    C("out-under-file", RUNNER, ["run", "--config", "{t}/c.yaml", *PYS, "--out", "{t}/f/o"],
      2, ["--out", "is a file", "under it"], {"c.yaml": config(), "f": "x"}),
    C("out-holds-earlier-results", RUNNER, ["run", "--config", "{t}/c.yaml", *PYS, "--out",
                                            "{t}/out"], 2,
      ["--out", "earlier run", "results.json", "--overwrite"], {"c.yaml": config(), **EARLIER}),
    C("plan-out-without-plan-only", RUNNER, ["run", "--plan-out", "{t}/p.json"], 2,
      ["--plan-out", "only with --plan-only"]),
    C("plan-out-exists", RUNNER, ["run", "--plan-only", "--plan-out", "{t}/p.json"], 2,
      ["--plan-out", "exists", "--overwrite"], {"p.json": "{}"}),
    C("plan-out-under-file", RUNNER, ["run", "--plan-only", "--plan-out", "{t}/f/p.json"], 2,
      ["--plan-out", "is a file"], {"f": "x"}),
    C("plan-only-keeps-earlier-results", RUNNER,
      ["run", "--config", "{t}/c.yaml", "--plan-only", "--no-git", "--out", "{t}/out"], 0,
      ["# plan: t", "@stock (not given)", "nothing written", "--python stock=PATH"],
      {"c.yaml": config(), **EARLIER}, stream="out", unchanged=True),
    C("plan-only-shipped-kimi-config", RUNNER,
      ["run", "--config", str(ROOT / "bench/configs/e2e-kimi-k25-pcie8.yaml"), "--plan-only",
       "--no-git"], 0, ["12 server launch(es)", "@patched (not given)"], stream="out",
      unchanged=True),
    C("no-subcommand", RUNNER, [], 2, ["required", "--help"]),
    C("unknown-option", RUNNER, ["run", "--bogus"], 2, ["unrecognized", "--bogus"]),
    # ------------------------------------------------------------------ runner compare
    C("compare-missing", RUNNER, ["compare", "{t}/a.json", "{t}/b.json"], 2,
      ["compare a", "a.json", "no such file"]),
    C("compare-not-json", RUNNER, ["compare", "{t}/a.json", "{t}/a.json"], 2,
      ["compare a", "not valid json"], {"a.json": "not json"}),
    C("compare-not-results", RUNNER, ["compare", "{t}/a.json", "{t}/b.json"], 2,
      ["compare b", "b.json", "not an e2e results file", "$.name: missing"],
      {"a.json": results_doc(), "b.json": '{"schema": "x"}'}),
    C("compare-one-file-no-axis", RUNNER, ["compare", "{t}/a.json"], 2,
      ["two result files", "--axis"], {"a.json": results_doc()}),
    C("compare-axis-format", RUNNER, ["compare", "{t}/a.json", "--axis", "env=stock"], 2,
      ["--axis", "NAME=VA:VB"], {"a.json": results_doc()}),
    C("compare-axis-unknown", RUNNER, ["compare", "{t}/a.json", "--axis", "tp=1:8"], 2,
      ["--axis", "no run has axis 'tp'", "env"], {"a.json": results_doc()}),
    C("compare-axis-same-values", RUNNER, ["compare", "{t}/a.json", "--axis",
                                           "env=stock:stock"], 2, ["--axis", "same value"],
      {"a.json": results_doc()}),
    C("compare-axis-unknown-value", RUNNER, ["compare", "{t}/a.json", "--axis",
                                             "env=stock:prod"], 2,
      ["--axis", "b has no run with env=prod", "patched"], {"a.json": results_doc()}),
    C("compare-out-under-file", RUNNER, ["compare", "{t}/a.json", "{t}/a.json", "--out",
                                         "{t}/f/c.md"], 2, ["--out", "is a file"],
      {"a.json": results_doc(), "f": "x"}),
    C("compare-no-matching-levels", RUNNER, ["compare", "{t}/a.json", "{t}/b.json"], 1,
      ["no matching levels"], {"a.json": results_doc(), "b.json": results_doc(runs=[])},
      stream="out", unchanged=True),
    C("compare-axis-ok", RUNNER, ["compare", "{t}/a.json", "--axis", "env=stock:patched"], 0,
      ["1.000"], {"a.json": results_doc()}, stream="out", unchanged=True),
    # ------------------------------------------------------------------ run_all
    C("all-only-unknown", RUN_ALL, ["--only", "nope", "--out", "{t}/o"], 2,
      ["--only", "unknown section", "costmodel"]),
    C("all-only-empty", RUN_ALL, ["--only", ",", "--out", "{t}/o"], 2,
      ["--only", "comma list"]),
    C("all-only-and-skip", RUN_ALL, ["--only", "costmodel,e2e", "--skip", "e2e", "--out",
                                     "{t}/o"], 2, ["--skip e2e", "--only"]),
    C("all-out-is-file", RUN_ALL, ["--out", "{t}/f"], 2, ["--out", "is a file"], {"f": "x"}),
    C("all-out-under-file", RUN_ALL, ["--out", "{t}/f/o"], 2, ["--out", "under it"],
      {"f": "x"}),
    C("all-e2e-config-missing", RUN_ALL, ["--e2e-config", "{t}/c.yaml", "--out", "{t}/o"], 2,
      ["--e2e-config", "c.yaml", "no such file"]),
    C("all-e2e-config-bad-yaml", RUN_ALL, ["--e2e-config", "{t}/c.yaml", "--out", "{t}/o"], 2,
      ["--e2e-config", "not valid yaml"], {"c.yaml": "matrix: {a: [\n"}),
    C("all-e2e-config-negative", RUN_ALL, ["--e2e-config", "{t}/c.yaml", "--out", "{t}/o"], 2,
      ["c.yaml", "'max_tokens'", "positive integer", "-8"],
      {"c.yaml": config(max_tokens=-8)}),
    C("all-e2e-python-format", RUN_ALL, ["--e2e-python", "stock", "--out", "{t}/o"], 2,
      ["--e2e-python", "NAME=PATH"]),
    C("all-e2e-python-unused", RUN_ALL, ["--e2e-python", "stok={py}", "--out", "{t}/o"], 2,
      ["--e2e-python stok=", "no @stok"]),
    C("all-e2e-python-missing", RUN_ALL, ["--e2e-python", "stock={t}/nope", "--out",
                                          "{t}/o"], 2, ["--e2e-python stock=", "no such file"]),
    C("all-e2e-python-not-needed", RUN_ALL, ["--e2e-python", "stock={t}/nope", "--skip", "e2e",
                                             "--out", "{t}/o"], 0, ["suite called"],
      stream="out"),
    C("all-e2e-model-missing", RUN_ALL, ["--e2e-model", "{t}/no-model", "--out", "{t}/o"], 2,
      ["--e2e-model", "no-model", "no such directory"]),
    C("all-e2e-model-placeholder", RUN_ALL, ["--e2e-model", "@x", "--out", "{t}/o"], 2,
      ["--e2e-model @x", "placeholder"]),
    C("all-unknown-option", RUN_ALL, ["--bogus"], 2, ["unrecognized", "--bogus"]),
    C("all-ok", RUN_ALL, ["--only", "costmodel", "--out", "{t}/o"], 0, ["suite called"],
      stream="out"),
]


def _build(tmp: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        p = tmp / rel
        if rel.endswith("/"):
            p.mkdir(parents=True, exist_ok=True)
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)


def _snapshot(tmp: Path) -> dict[str, tuple[bytes | None, int]]:
    return {str(p.relative_to(tmp)): (p.read_bytes() if p.is_file() else None,
                                      p.stat().st_mtime_ns)
            for p in sorted(tmp.rglob("*"))}


@pytest.fixture()
def no_side_effects(monkeypatch):
    """run_all's suite and the runner's server launch replaced (nothing starts)."""

    def suite(args) -> int:
        print("suite called")
        return 0

    def launch(ctx, i, n, sc, run) -> None:
        run.update(status="server_failed", reason="stub: no server started in this test")

    monkeypatch.setattr("bench.harness.suite.run_suite", suite)
    monkeypatch.setattr(e2e_run, "_launch", launch)


def run_case(case: Case, tmp: Path, capsys) -> tuple[int, str, str]:
    argv = [a.format(t=tmp, py=sys.executable) for a in case.argv]
    code = MODULES[case.tool].main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, tmp_path, capsys, no_side_effects):
    _build(tmp_path, case.files)
    before = _snapshot(tmp_path)
    code, out, err = run_case(case, tmp_path, capsys)
    shown = f"exit {code}\nstdout: {out[-2000:]}\nstderr: {err[-2000:]}"
    assert "Traceback" not in out + err, shown
    assert code == case.code, shown
    text = (err if case.stream == "err" else out).lower()
    missing = [w for w in case.words if w.lower() not in text]
    assert not missing, f"missing {missing}\n{shown}"
    if code == 2:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1, shown
    if case.unchanged if case.unchanged is not None else code == 2:
        assert _snapshot(tmp_path) == before, "the command changed files on disk"


def test_enough_cases_per_entry_point():
    assert sum(c.tool == RUNNER for c in CASES) >= 25
    assert sum(c.tool == RUN_ALL for c in CASES) >= 10
    assert len({c.id for c in CASES}) == len(CASES)


# ---------------------------------------------------------------------------------------------
# results directories: a run never silently replaces an earlier one
# ---------------------------------------------------------------------------------------------


def test_run_refuses_earlier_results_and_overwrite_replaces_them(tmp_path, capsys,
                                                                 no_side_effects):
    runner = MODULES[RUNNER]
    (tmp_path / "c.yaml").write_text(config())
    argv = ["run", "--config", str(tmp_path / "c.yaml"), "--python", f"stock={sys.executable}",
            "--python", f"patched={sys.executable}", "--out", str(tmp_path / "out"), "--no-git"]
    assert runner.main(argv) == 1  # results written, no launch measured (stubbed)
    first = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["status"] for r in first["runs"]] == ["server_failed", "server_failed"]
    (tmp_path / "out" / "logs").mkdir()
    (tmp_path / "out" / "logs" / "stale.log").write_text("from the first run")
    capsys.readouterr()
    assert runner.main(argv) == 2
    assert "earlier run" in capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "results.json").read_text()) == first
    assert runner.main(argv + ["--overwrite"]) == 1
    assert "removed the earlier results.json, report.md, logs" in capsys.readouterr().out
    assert not (tmp_path / "out" / "logs" / "stale.log").exists()
    assert json.loads((tmp_path / "out" / "results.json").read_text())["created"]


def test_default_out_is_a_new_directory_per_run(tmp_path, monkeypatch, capsys,
                                                no_side_effects):
    runner = MODULES[RUNNER]
    monkeypatch.setattr(runner, "DEFAULT_OUT_BASE", tmp_path / "e2e")
    (tmp_path / "c.yaml").write_text(config(allow_same_python=True))
    argv = ["run", "--config", str(tmp_path / "c.yaml"), "--no-git"]
    assert runner.main(argv) == 1
    assert runner.main(argv) == 1
    dirs = sorted((tmp_path / "e2e").iterdir())
    assert len(dirs) == 2 and all((d / "results.json").is_file() for d in dirs)


def test_plan_out_writes_only_that_file(tmp_path, capsys):
    runner = MODULES[RUNNER]
    (tmp_path / "c.yaml").write_text(config())
    plan = tmp_path / "plan.json"
    assert runner.main(["run", "--config", str(tmp_path / "c.yaml"), "--plan-only", "--no-git",
                        "--out", str(tmp_path / "out"), "--plan-out", str(plan)]) == 0
    doc = json.loads(plan.read_text())
    assert [r["status"] for r in doc["runs"]] == ["planned", "planned"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "plan.json"]


# ---------------------------------------------------------------------------------------------
# --debug and errors nobody foresaw
# ---------------------------------------------------------------------------------------------


def test_debug_shows_the_traceback(tmp_path, capsys):
    argv = ["run", "--config", str(tmp_path / "nope.yaml"), "--plan-only"]
    assert MODULES[RUNNER].main(argv + ["--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("runner.py: error:")
    assert MODULES[RUN_ALL].main(["--debug", "--e2e-config", str(tmp_path / "x.yaml")]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_an_unexpected_error_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("something nobody foresaw\nsecond line")

    monkeypatch.setattr("bench.harness.e2e.plan_matrix", boom)
    (tmp_path / "c.yaml").write_text(config())
    assert MODULES[RUNNER].main(["run", "--config", str(tmp_path / "c.yaml"),
                                 "--plan-only"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: RuntimeError" in err
    assert "--debug" in err and "Traceback" not in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable_out(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        assert MODULES[RUN_ALL].main(["--out", str(ro / "x")]) == 2
        assert "not writable" in capsys.readouterr().err
    finally:
        ro.chmod(stat.S_IRWXU)


def test_help_documents_the_exit_codes(capsys):
    helps = {}
    for tool, argv in ((RUNNER, ["--help"]), (RUNNER, ["run", "--help"]),
                       (RUNNER, ["compare", "--help"]), (RUN_ALL, ["--help"])):
        assert MODULES[tool].main(argv) == 0
        helps[(tool, *argv)] = text = " ".join(capsys.readouterr().out.split())
        assert "Exit status: 0" in text and "2 usage error" in text, (tool, argv)
    assert "no matching levels" in helps[(RUNNER, "compare", "--help")]
    assert "--overwrite" in helps[(RUNNER, "run", "--help")]
    assert "1 a section failed" in helps[(RUN_ALL, "--help")]
