"""``bench/gpu/release_runs.py`` without a GPU: ``run --dry-run`` (the three steps in their CPU
form, the summary it writes), ``prepare`` (the vLLM files a GPU machine is given),
``install`` (what it refuses, what it copies) and its table of bad arguments."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


_spec = importlib.util.spec_from_file_location("release_runs_under_test",
                                               ROOT / "bench" / "gpu" / "release_runs.py")
rr = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = rr
_spec.loader.exec_module(rr)
schema = rr._load(ROOT / "bench" / "kernels" / "_verify_graph_schema.py", "_vg_schema_rr")


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    out = tmp_path_factory.mktemp("rr") / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_TARGET_DEVICE": "cpu"}
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "release_runs.py"), "run",
                        "--dry-run", "--out", str(out)], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=600)
    return p, out


def test_dry_run_runs_every_step(dry):
    p, out = dry
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    s = json.loads((out / "release_runs.json").read_text())
    assert s["schema"] == rr.SCHEMA and s["dry_run"] is True
    assert [(r["step"], r["rc"], r["timed_out"]) for r in s["steps"]] == [
        ("tests", 0, False), ("bench", 0, False), ("folded", 0, False)]
    # every GPU test file is collected, patch 0002's tests are picked out
    files = {f"tests/gpu/{f.name}" for f in (ROOT / "tests" / "gpu").glob("test_*.py")}
    assert {k.split("::")[0] for k in s["tests"]["cases"]} == files
    assert s["tests"]["patch_0002"] and all(
        k.startswith(rr.PATCH_0002_FILE) for k in s["tests"]["patch_0002"])
    assert s["bench"] == {"report": f"{rr.REPORT}.json", "cases": s["bench"]["cases"],
                          "failed_cases": 0, "dry_run": True}
    assert schema.problems(json.loads((out / f"{rr.REPORT}.json").read_text())) == []
    # the folded benchmark: Kimi's top-p modes, one request (the whole-row plan) and four
    folded = json.loads((out / f"{rr.FOLDED_REPORT}.json").read_text())
    assert schema.problems(folded) == [] and s["folded"]["failed_cases"] == 0
    assert {(c["rows"], c["mode"]) for c in folded["cases"]} == {
        (r, m) for r in (4, 16) for m in ("top_p_T1", "top_p_T0.6")}
    assert all(("escalation-folded" in c["plan"]) == (c["rows"] == 16) for c in folded["cases"])
    assert all(c["ours_rows_equals_ours"] for c in folded["cases"])
    assert any(("folded" in k) for k in s["tests"]["cases"])
    # what comes back from a GPU machine: at most 8 plain files, no folders
    assert len(list(out.iterdir())) <= 8 and all(f.is_file() for f in out.iterdir())


def test_replay_count_is_read_from_the_log(tmp_path):
    (tmp_path / "tests_gpu.log").write_text(
        "...\nsteps 1000, replayed 997, uncaptured {'no graph fits': 3}, escalated rows 41\n")
    r = rr.summarize_tests(tmp_path, dry_run=False)["replay"]
    assert (r["steps"], r["uncaptured_steps"]) == (1000, 3)
    assert r["uncaptured_by_reason"] == "{'no graph fits': 3}"
    (tmp_path / "tests_gpu.log").write_text("no such line")
    assert rr.summarize_tests(tmp_path, dry_run=False)["replay"]["uncaptured_steps"] is None


def test_test_workers_spread_the_gpu_tests_over_xdist_processes(tmp_path):
    """One process prints as it goes (``-s``); with workers the replay line must come back
    through ``-rA``'s PASSES section, so ``-s`` is dropped (it would swallow it)."""
    args = rr.build_parser().parse_args(["run", "--out", str(tmp_path)])
    one = rr.step_command("tests", args)
    assert "-s" in one and "-n" not in one and "-rA" in one
    args = rr.build_parser().parse_args(["run", "--out", str(tmp_path), "--test-workers", "8"])
    many = rr.step_command("tests", args)
    assert many[many.index("-n") + 1] == "8" and "-s" not in many and "-rA" in many


def test_outcomes_from_junit_xml(tmp_path):
    name = rr.REPLAY_TEST.split("::")[1]
    (tmp_path / "tests_gpu.xml").write_text(
        '<testsuites><testsuite>'
        '<testcase classname="tests.gpu.test_patch_0002_gpu" name="test_a"/>'
        f'<testcase classname="tests.gpu.test_verify_step_graphs_gpu" name="{name}">'
        '<skipped message="needs 1 CUDA device(s), found 0"/></testcase>'
        '<testcase classname="tests.gpu.test_x" name="test_replay_c"><failure message="boom"/>'
        '</testcase></testsuite></testsuites>')
    s = rr.summarize_tests(tmp_path, dry_run=False)
    assert s["counts"] == {"passed": 1, "skipped": 1, "failed": 1}
    assert list(s["patch_0002"]) == ["tests.gpu.test_patch_0002_gpu::test_a"]
    assert s["replay"]["cases"] == {f"tests.gpu.test_verify_step_graphs_gpu::{name}": {
        "outcome": "skipped", "message": "needs 1 CUDA device(s), found 0"}}


def _tree() -> Path | None:
    files = rr.vllm_files()
    return next((p for p in (ROOT / ".vllm_src", ROOT / "build" / "vllm-0.34.0")
                 if all((p / f).is_file() for f in files)), None)


def test_prepare_copies_exactly_the_files_the_runs_load(tmp_path, capsys):
    tree = _tree()
    if tree is None:
        pytest.skip("no patched vLLM source tree (build/vllm-0.34.0/)")
    dest = tmp_path / "carry"
    assert rr.main(["prepare", "--vllm-tree", str(tree), "--dest", str(dest)]) == 0
    got = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert got == sorted(rr.vllm_files())
    assert "run --out" in capsys.readouterr().out
    # enough for patch 0002's GPU test: its vLLM pieces load from the copy alone
    t0002 = rr._load(ROOT / rr.PATCH_0002_FILE, "t0002_from_carry")
    assert t0002.Vllm(dest).shard(163840, 7, 8) == (143360, 163840)
    # a tree missing one file: refused, the earlier copy left as it was
    part = tmp_path / "part"
    shutil.copytree(dest, part)
    (part / rr.vllm_files()[-1]).unlink()
    before = sorted(p.stat().st_mtime_ns for p in dest.rglob("*"))
    assert rr.main(["prepare", "--vllm-tree", str(part), "--dest", str(dest)]) == 2
    assert rr.vllm_files()[-1] in capsys.readouterr().err
    assert sorted(p.stat().st_mtime_ns for p in dest.rglob("*")) == before


def _checkout(tmp_path: Path) -> Path:
    """A checkout for ``install --reports``: bench/reports, the docs page, the package copy's
    folder."""
    root = tmp_path / "checkout"
    (root / "bench" / "reports").mkdir(parents=True)
    (root / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "sharded-verification.md", root / "docs")
    (root / rr.PACKAGE_COPY).parent.mkdir(parents=True)
    return root


def test_install_refuses_a_dry_run_and_copies_a_measured_report(dry, tmp_path, capsys):
    _, out = dry
    reports = tmp_path / "reports"
    reports.mkdir()
    assert rr.main(["install", str(out), "--reports", str(reports)]) == 1
    err = capsys.readouterr().err
    assert err.count("a dry run") == 2 and not list(reports.iterdir())  # both reports
    got = tmp_path / "got"
    shutil.copytree(out, got)
    for suffix in ("json", "md"):
        (got / f"{rr.FOLDED_REPORT}.{suffix}").unlink()
    doc = schema.as_measured(json.loads((got / f"{rr.REPORT}.json").read_text()))
    doc["cases"][0]["batch_sharded_equals_vllm"] = False
    (got / f"{rr.REPORT}.json").write_text(json.dumps(doc))
    assert rr.main(["install", str(got), "--reports", str(reports)]) == 1
    assert "failed a check" in capsys.readouterr().err and not list(reports.iterdir())
    doc["cases"][0]["batch_sharded_equals_vllm"] = True
    (got / f"{rr.REPORT}.json").write_text(json.dumps(doc))
    assert rr.main(["install", str(got), "--reports", str(reports)]) == 0
    assert json.loads((reports / f"{rr.REPORT}.json").read_text()) == doc


def test_install_of_the_folded_report(dry, tmp_path, capsys):
    """A measured folded report alone: checked like the verify report (a failed case is
    refused, nothing written), then copied into bench/reports and the package copy, and the
    docs' generated table priced from it; a checkout without the docs page is a usage error
    before anything is written."""
    _, out = dry
    got = tmp_path / "got"
    got.mkdir()
    for suffix in ("json", "md"):
        shutil.copy(out / f"{rr.FOLDED_REPORT}.{suffix}", got)
    doc = schema.as_measured(json.loads((got / f"{rr.FOLDED_REPORT}.json").read_text()))
    for c in doc["cases"]:
        c["ours_rows_us"] = c["ours_graph_us"] + 1.0
    doc["cases"][1]["ours_rows_equals_ours"] = False
    (got / f"{rr.FOLDED_REPORT}.json").write_text(json.dumps(doc))
    root = _checkout(tmp_path)
    reports = root / "bench" / "reports"
    assert rr.main(["install", str(got), "--reports", str(reports)]) == 1
    assert "cases[1]" in capsys.readouterr().err and not list(reports.iterdir())
    doc["cases"][1]["ours_rows_equals_ours"] = True
    (got / f"{rr.FOLDED_REPORT}.json").write_text(json.dumps(doc))
    bare = tmp_path / "bare" / "bench" / "reports"
    bare.mkdir(parents=True)
    assert rr.main(["install", str(got), "--reports", str(bare)]) == 2
    assert "lacks" in capsys.readouterr().err and not list(bare.iterdir())
    before = (root / "docs" / "sharded-verification.md").read_text()
    assert rr.main(["install", str(got), "--reports", str(reports)]) == 0
    assert json.loads((reports / f"{rr.FOLDED_REPORT}.json").read_text()) == doc
    assert json.loads((root / rr.PACKAGE_COPY).read_text()) == doc
    after = (root / "docs" / "sharded-verification.md").read_text()
    assert after != before and "| k | sampling | batch | folded" in after


BAD = [
    (["run"], "--out"),
    (["run", "--out", "{tmp}/o", "--steps", "tests,nope"], "--steps"),
    (["run", "--out", "{tmp}/o", "--step-timeout", "0"], "--step-timeout"),
    (["run", "--out", "{tmp}/o", "--test-workers", "0"], "--test-workers"),
    (["run", "--out", "{tmp}/o", "--test-workers", "many"], "--test-workers"),
    (["run", "--out", "{tmp}/file"], "is not a directory"),
    (["run", "--out", "{tmp}/o", "--logits", "{tmp}/none.pt"], "--logits"),
    (["prepare", "--vllm-tree", "{tmp}/none"], "--vllm-tree"),
    (["prepare", "--vllm-tree", "{tmp}", "--dest", "{tmp}/file"], "--dest"),
    (["install", "{tmp}/none"], "not a directory"),
    (["install", "{tmp}"], "no such file"),
    (["install", "{tmp}/bad"], "not valid JSON"),
    (["install", "{tmp}", "--reports", "{tmp}/file"], "--reports"),
    (["install", "{tmp}/badfolded"], "not valid JSON"),
    (["install", "{tmp}/nomd"], "no such file"),
    (["launch"], "invalid choice"),
]


@pytest.mark.parametrize("argv,words", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_arguments(tmp_path, capsys, argv, words):
    (tmp_path / "file").write_text("keep")
    (tmp_path / "bad").mkdir()
    (tmp_path / "badfolded").mkdir()
    (tmp_path / "nomd").mkdir()
    (tmp_path / "nomd" / f"{rr.FOLDED_REPORT}.json").write_text("{}")
    for suffix in ("json", "md"):
        (tmp_path / "bad" / f"{rr.REPORT}.{suffix}").write_text("{not json")
        (tmp_path / "badfolded" / f"{rr.FOLDED_REPORT}.{suffix}").write_text("{not json")
    before = sorted((str(p), p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    rc = rr.main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert words in err and "Traceback" not in out + err
    assert len(err.strip().splitlines()) == 1, err
    assert sorted((str(p), p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before
