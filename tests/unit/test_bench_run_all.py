"""bench/run_all.py: the section plan and skip table on this machine, and a real run of
the cheapest section."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from bench.harness import sections as S
from bench.harness.common import detect_capabilities, scrub
from bench.harness.schema import BenchResults, validate
from bench.harness.sections.kernels import _script_args
from bench.harness.sections.verify_cpu import verify_ratios
from bench.harness.suite import skip_table

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_all():
    spec = importlib.util.spec_from_file_location("bench_run_all_t", ROOT / "bench" / "run_all.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def caps():
    return detect_capabilities()


def test_skip_table_on_this_machine(caps, tmp_path):
    ctx = S.Context(out=tmp_path, caps=caps)
    planned = S.plan(caps, ctx)
    assert [s.name for s, _ in planned] == list(S.SECTION_NAMES)
    why = {s.name: w for s, w in planned}
    n = caps["cuda"]["device_count"]
    assert why["costmodel"] is None  # any machine
    if n == 0:
        assert why["gpu-kernels"] == "no CUDA device"
    if n < 2:
        assert why["allreduce"] == f"needs >= 2 CUDA devices (found {n})"
    if caps["vllm_importable"]:
        assert why["collectives"] is None and why["e2e"] is None
    rows = skip_table(planned, {})
    skipped = {r["section"]: r["why"] for r in rows}
    assert skipped == {k: v for k, v in why.items() if v is not None}
    assert all(r["item"].startswith("whole section") for r in rows)


def test_gpu_sections_planned_with_gpus(tmp_path):
    caps = {"matplotlib": True, "pytest_benchmark": True, "vllm_importable": True,
            "cuda": {"device_count": 8, "devices": ["GPU"] * 8}}
    why = {s.name: w for s, w in S.plan(caps, S.Context(out=tmp_path, caps=caps))}
    assert why["allreduce"] is None
    assert why["gpu-kernels"] in (None, "no kernel bench scripts in bench/kernels/")
    one = dict(caps, cuda={"device_count": 1})
    why1 = {s.name: w for s, w in S.plan(one, S.Context(out=tmp_path, caps=one))}
    assert why1["allreduce"] == "needs >= 2 CUDA devices (found 1)"
    sel = {s.name: w for s, w in S.plan(caps, S.Context(out=tmp_path, caps=caps),
                                        only=["costmodel"], skip=None)}
    assert sel["costmodel"] is None and sel["e2e"].startswith("not selected")


def test_skip_table_includes_parts_of_sections(tmp_path):
    caps = {"matplotlib": True, "pytest_benchmark": True, "vllm_importable": True,
            "cuda": {"device_count": 0}}
    planned = S.plan(caps, S.Context(out=tmp_path, caps=caps), only=["collectives", "e2e"])
    outcomes = {"collectives": S.Outcome("partial", skipped=[("draft pass x", "no CUDA")]),
                "e2e": S.Outcome("skipped", "no server")}
    rows = skip_table(planned, outcomes)
    assert {"section": "collectives", "item": "draft pass x", "why": "no CUDA"} in rows
    assert {"section": "e2e", "item": "whole section", "why": "no server"} in rows


def test_scrub_removes_machine_paths():
    text = scrub({"p": f"{ROOT}/bench/out/x.json", "l": [str(ROOT)]})
    assert text == {"p": "./bench/out/x.json", "l": ["."]}


def test_run_all_costmodel_only(run_all, tmp_path, capsys):
    rc = run_all.main(["--only", "costmodel", "--no-git", "--out", str(tmp_path)])
    assert rc == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert validate(res, BenchResults) == []
    status = {s["name"]: s["status"] for s in res["sections"]}
    assert status["costmodel"] == "ok"
    assert all(v == "skipped" for k, v in status.items() if k != "costmodel")
    assert res["provenance"]["git"]["dirty"] is None  # --no-git
    assert res["provenance"]["git"]["sha"]
    report = (tmp_path / "report.md").read_text()
    assert "## Skipped (why)" in report and "not selected (--only costmodel)" in report
    assert (tmp_path / "costmodel-plan.png").read_bytes().startswith(b"\x89PNG")
    assert "costmodel-plan.png" in report
    assert str(ROOT) not in report and str(ROOT) not in json.dumps(res)
    out = capsys.readouterr().out
    assert "[1/7] costmodel" in out and "skipped (why):" in out


def test_verify_ratios_pair_cases_with_the_reference():
    def b(name, group, median, mn):
        return {"name": name, "group": group,
                "stats": {"median": median, "min": mn, "iqr": 0.1 * median, "q1": median * 0.9,
                          "q3": median * 1.1, "rounds": 7}}

    data = {"benchmarks": [b("test_sharded[0]", "g0", 0.001, 0.0005),
                           b("test_reference_full[0]", "g0", 0.004, 0.003),
                           b("test_other", "g1", 0.002, 0.001)]}
    rows = verify_ratios(data)
    assert [r["case"] for r in rows] == ["test_reference_full[0]", "test_sharded[0]",
                                         "test_other"]
    assert rows[0]["speedup_vs_reference"] == pytest.approx(1.0)
    assert rows[1]["speedup_vs_reference"] == pytest.approx(4.0)
    assert rows[1]["speedup_vs_reference_min"] == pytest.approx(6.0)
    assert rows[2]["reference"] is None and rows[2]["speedup_vs_reference"] is None


def test_kernel_script_arguments(tmp_path):
    def script(name, src):
        p = tmp_path / name
        p.write_text(src)
        return p

    out = tmp_path / "o"
    d = script("a.py", 'ap.add_argument("--out-dir")\nap.add_argument("--quick")')
    assert _script_args(d, out, True) == ["--out-dir", str(out), "--quick"]
    e = script("b.py", 'ap.add_argument("--out", type=Path)\n(args.out / "x.json")')
    assert _script_args(e, out, True) == ["--out", str(out)]
    f = script("c.py", "ap.add_argument('--out')\nPath(args.out).write_text(x)")
    assert _script_args(f, out, False) == ["--out", str(out / "c.json")]
    assert _script_args(script("d.py", "print(1)"), out, True) == []
