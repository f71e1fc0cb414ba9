"""``bench/kernels/bench_verify_graph.py`` without a GPU: its dry run (the cases, the
correctness checks, the byte counts per rank and the report's schema; with vLLM's source
files, vLLM's rejection sampler and batch-sharded sampling run by Triton's interpreter for
the greedy cases), the schema's refusals, and its table of bad arguments.

The dry run runs in a subprocess: loading vLLM's source files under stub parents must not
leave ``vllm`` stubs in this test process.
"""

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
KERNELS = ROOT / "bench" / "kernels"


def _load(name: str):
    sys.path.insert(0, str(KERNELS))
    spec = importlib.util.spec_from_file_location(name, KERNELS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


bvg = _load("bench_verify_graph")
schema = _load("_verify_graph_schema")


def _vllm_tree() -> Path | None:
    return next((p for p in (ROOT / ".vllm_src", ROOT / "build" / "vllm-0.34.0")
                 if all((p / f).is_file() for f in bvg.vllm_files())), None)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One ``--dry-run --quick`` in a subprocess; with vLLM's sources, from a folder that
    holds exactly :func:`vllm_files` (so the list a GPU machine is given is complete)."""
    tmp = tmp_path_factory.mktemp("dry")
    argv = [sys.executable, str(KERNELS / "bench_verify_graph.py"), "--dry-run", "--quick",
            "--out-dir", str(tmp / "out"), "--name", "dry"]
    tree = _vllm_tree()
    if tree is not None:
        carry = tmp / "vllm_src"
        for f in bvg.vllm_files():
            (carry / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(tree / f, carry / f)
        argv += ["--vllm-src", str(carry)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_TARGET_DEVICE": "cpu"}
    env.pop("TRITON_INTERPRET", None)
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    doc = None
    if (tmp / "out" / "dry.json").is_file():
        doc = json.loads((tmp / "out" / "dry.json").read_text())
    return p, doc, tree is not None


def test_dry_run_writes_a_valid_report(dry_run):
    p, doc, _ = dry_run
    assert p.returncode == 0, p.stderr[-2000:]
    assert doc is not None and schema.problems(doc) == []
    assert doc["dry_run"] and doc["vocab_size"] == bvg.DRY_V and doc["tp"] == 8
    want = {(k, r, m) for k in bvg.KS for r in bvg.ROWS[:2] for m in bvg.MODES
            if r % (k + 1) == 0}
    assert {(c["k"], c["rows"], c["mode"]) for c in doc["cases"]} == want
    for c in doc["cases"]:
        assert all(c.get(f) is None for f in schema.TIMED), c
        assert c["graph_equals_eager"] is True
        ref = c["reference"]
        assert ref["identical"] + ref["certified_flips"] + ref["score_ties"] == ref["requests"]


def test_dry_run_counts_the_bytes_of_each_verifier(dry_run):
    """Per rank and step, from the definitions: stock vLLM all-gathers [rows, V] bf16
    (each rank receives the other 7 shards); batch-sharded sampling's busiest rank (it owns
    requests 0, 8, 16, ...) receives the other 7 shards of its rows plus 7 packed outputs
    of ceil(B / 8) x (k + 3) int64; ours sends its plan's payload."""
    _, doc, _ = dry_run
    V, TP = doc["vocab_size"], doc["tp"]
    shard = V // TP * 2
    for c in doc["cases"]:
        rows, k = c["rows"], c["k"]
        reqs = rows // (k + 1)
        mine = len(range(0, reqs, TP)) * (k + 1)
        b = c["bytes_per_rank"]
        assert c["batch_sharded_rows"] == mine
        assert b["vllm_logits_gather"]["received"] == (TP - 1) * rows * shard
        packed = -(-reqs // TP) * (k + 1 + 2) * 8
        assert b["batch_sharded"]["received"] == (TP - 1) * (mine * shard + packed)
        assert b["ours"]["sent"] == c["payload_bytes_per_row_per_rank"] * rows
        assert b["ours"]["received"] == (TP - 1) * b["ours"]["sent"]


def test_dry_run_runs_vllm_batch_sharded_against_vllm(dry_run):
    """With vLLM's sources: for every greedy case the busiest rank's batch-sharded tokens
    equal vLLM's full-batch step's for its requests (vLLM's kernels, Triton's interpreter)."""
    _, doc, have_vllm = dry_run
    if not have_vllm:
        pytest.skip("no vLLM source tree (.vllm_src/ or build/vllm-0.34.0/)")
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed (its interpreter runs vLLM's kernels)")
    greedy = [c for c in doc["cases"] if c["mode"] == "greedy"]
    assert greedy and all(c["batch_sharded_equals_vllm"] is True for c in greedy), greedy
    assert "interpreter" in doc["dry_run_note"]


# ---------------------------------------------------------------------------------------------
# the schema
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("edit,words", [
    (lambda d: d["cases"][0].pop("bytes_per_rank"), "bytes_per_rank: missing"),
    (lambda d: d["cases"][0].update(vllm_graph_us=None), "vllm_graph_us: expected a positive"),
    (lambda d: d["cases"][0].update(batch_sharded_us=0), "batch_sharded_us: expected a positive"),
    (lambda d: d.update(dry_run=True), "a dry run times nothing"),
    (lambda d: d["cases"][0].update(speedup_vs_vllm=3.0), "speedup_vs_vllm: expected"),
    (lambda d: d["cases"][0].update(mode="nucleus"), "expected one of"),
    (lambda d: d["cases"][0].update(rows=5), "not a multiple of k + 1"),
    (lambda d: d["cases"][0]["bytes_per_rank"]["ours"].pop("sent"), "sent: missing"),
    (lambda d: d.update(surprise=1), "surprise: unknown field"),
    (lambda d: d.update(schema_problems=["$.x: missing"]), "the run found 1 problem"),
])
def test_schema_refuses(dry_run, edit, words):
    doc = schema.as_measured(dry_run[1])
    assert schema.problems(doc) == []
    edit(doc)
    assert any(words in p for p in schema.problems(doc)), schema.problems(doc)


def test_a_failed_case_may_lack_times(dry_run):
    doc = schema.as_measured(dry_run[1])
    doc["cases"][0].update(vllm_graph_us=None, speedup_vs_vllm=None, vllm_error="boom")
    assert schema.problems(doc) == []


# ---------------------------------------------------------------------------------------------
# bad arguments: exit 2, one line naming the argument, nothing written
# ---------------------------------------------------------------------------------------------
BAD = [
    (["--rounds", "0"], "--rounds"),
    (["--per-graph", "x"], "--per-graph"),
    (["--rows", "4,x"], "--rows"),
    (["--rows", "8192"], "--rows: expected row counts <= 4096"),
    (["--ks", "16"], "--ks: expected k <= 15"),
    (["--rows", "5", "--ks", "3"], "no row count is a multiple of k + 1"),
    (["--modes", "greedy,nucleus"], "--modes"),
    (["--escalation", "new"], "--escalation"),
    (["--name", "../up"], "--name"),
    (["--logits", "{tmp}/none.pt"], "--logits"),
    (["--out-dir", "{tmp}/file"], "exists and is not a directory"),
    (["--out-dir", "{tmp}/file/sub"], "is not a directory"),
    (["--vllm-src", "{tmp}/none"], "--vllm-src"),
    (["--vllm-src", "{tmp}/empty"], "lacks vllm/"),
    (["--surprise"], "unrecognized arguments"),
]


@pytest.mark.parametrize("argv,words", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_arguments(tmp_path, capsys, argv, words):
    (tmp_path / "file").write_text("keep")
    (tmp_path / "empty").mkdir()
    before = sorted((p.name, p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    rc = bvg.main([a.replace("{tmp}", str(tmp_path)) for a in argv] + ["--dry-run"])
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert words in err and "Traceback" not in out + err
    assert len(err.strip().splitlines()) == 1, err
    assert sorted((p.name, p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before


# ---------------------------------------------------------------------------------------------
# canary: the benchmark's vLLM side decides as vLLM 0.34.0's SamplingStates does
# ---------------------------------------------------------------------------------------------
STATES = "vllm/v1/worker/gpu/sample/states.py"
STATE_METHODS = ("add_request", "masks_logits", "apply_temperature", "apply_min_p",
                 "get_top_k_top_p", "apply_top_k_top_p")


def _sampling_states(tree: Path, calls: list):
    """vLLM's ``SamplingStates`` with the methods the verify path uses, compiled from the
    source; the kernels it launches record their call in ``calls`` instead."""
    import ast

    import numpy as np
    import torch

    node = next(n for n in ast.parse((tree / STATES).read_text()).body
                if isinstance(n, ast.ClassDef) and n.name == "SamplingStates")
    node.body = [f for f in node.body
                 if isinstance(f, ast.FunctionDef) and f.name in STATE_METHODS]
    assert {f.name for f in node.body} == set(STATE_METHODS), "SamplingStates changed"
    for f in node.body:
        f.returns = None
        for a in f.args.args:
            a.annotation = None
    ns = {"np": np, "torch": torch, "NO_LOGPROBS": -1,
          "_NP_INT64_MIN": np.iinfo(np.int64).min, "_NP_INT64_MAX": np.iinfo(np.int64).max,
          "apply_temperature": lambda *a: calls.append("temperature"),
          "apply_min_p": lambda *a: calls.append("min_p"),
          "apply_top_k_top_p": lambda x, k, p, has_topp_only_rows: calls.append(
              ("top_k_top_p", k is not None, p is not None, has_topp_only_rows)) or x}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(tree / STATES), "exec"), ns)
    return ns["SamplingStates"]


@pytest.mark.parametrize("mname", list(bvg.MODES))
def test_vllm_side_decides_as_vllm(mname):
    """Per mode: the float32 copy (vLLM: a request that ``add_request`` says needs processing
    or that ``masks_logits``), which of temperature / min-p / top-k-top-p run and with what,
    and ``skip_masked_vocab_blocks`` (``masks_logits``) are the same in the benchmark's
    ``VllmVerify`` and in vLLM's ``SamplingStates`` (compiled from its source)."""
    import types

    import numpy as np
    import torch

    # vLLM's SamplingStates is not among the files a GPU machine is given (.vllm_src/)
    tree = next((p for p in (ROOT / ".vllm_src", ROOT / "build" / "vllm-0.34.0")
                 if (p / STATES).is_file()), None)
    if tree is None:
        pytest.skip(f"no vLLM source tree with {STATES} (build/vllm-0.34.0/)")
    mode, V, k = bvg.MODES[mname], 1024, 3
    theirs: list = []
    states = _sampling_states(tree, theirs)
    st = states.__new__(states)
    st.vocab_size = V

    def arr(a):
        return types.SimpleNamespace(np=a, gpu=torch.from_numpy(a))

    st.temperature, st.top_p, st.min_p = (arr(np.zeros(1, np.float32)) for _ in range(3))
    st.top_k, st.seeds = arr(np.zeros(1, np.int32)), arr(np.zeros(1, np.int64))
    st.seeds_set, st.num_logprobs = np.zeros(1, bool), np.full(1, -1, np.int32)
    params = types.SimpleNamespace(temperature=mode["temperature"], top_k=mode["top_k"],
                                   top_p=mode["top_p"], min_p=mode["min_p"], seed=1,
                                   logprobs=None)
    needs = st.add_request(0, params)
    masks = bool(st.masks_logits(0))
    idx, eim = np.zeros(1, np.int64), torch.zeros(k + 1, dtype=torch.int64)
    logits = torch.zeros(k + 1, V)
    st.apply_temperature(logits, eim, idx)
    st.apply_min_p(logits, eim, idx)
    st.apply_top_k_top_p(logits, eim, idx)

    ours: list = []
    seen: dict = {}

    def rejection_sample(x, **kw):
        seen.update(fp32=x.dtype == torch.float32, skip=kw["skip_masked_vocab_blocks"])
        return x, None

    kern = {"temperature": lambda *a: ours.append("temperature"),
            "min_p": lambda *a: ours.append("min_p"),
            "top_k_top_p": lambda x, k, p, has_topp_only_rows: ours.append(
                ("top_k_top_p", k is not None, p is not None, has_topp_only_rows)) or x,
            "rejection_sample": rejection_sample}
    verify = bvg.VllmVerify(kern, mode, k, torch.zeros((1, k), dtype=torch.int64),
                            torch.zeros(1, dtype=torch.int64), V, "cpu")
    verify(torch.zeros(k + 1, V, dtype=torch.bfloat16), verify.full_kwargs())
    assert ours == theirs
    assert seen == {"fp32": bool(needs or masks), "skip": masks}


def test_old_escalation_switch_fails_closed():
    """The switch to the old escalation kernel works on today's step and refuses a step
    that does not hand its scratch to the kernels (the report then says why)."""
    from vllm_kimi_ext.verify.graph_step import GraphVerifyStep

    step = GraphVerifyStep(4096, 8, 0, lambda t: t[None], backend="torch")
    assert bvg.old_escalation(step) is None and step._escalation_scratch is None

    class Moved:  # a step whose escalation no longer reads _escalation_scratch
        _escalation_scratch: dict = {}

    assert "not available" in bvg.old_escalation(Moved())


def test_escalation_hist_runs_the_histogram_escalation():
    """``--escalation hist`` plans the histogram escalation (the GPU run times it); here a
    Kimi-width case with 2 requests of flat rows on the torch backend: its plan's rounds and
    the same tokens as the whole-row escalation."""
    import torch

    from vllm_kimi_ext.verify import VerifyBatch

    g = torch.Generator().manual_seed(3)
    V = 163840
    z = (torch.randn(8, V, generator=g) * 0.3).to(torch.bfloat16)
    b = VerifyBatch.from_draft_tokens(torch.randint(0, V, (2, 3), generator=g), [1.0, 1.0],
                                      [1, 2], top_p=[0.95, 0.95])
    got = {esc: bvg.ours_case(z, b, V, "torch", False, esc) for esc in ("rows", "hist")}
    plans = {esc: r[0] for esc, r in got.items()}
    assert [r.name for r in plans["hist"].rounds] == ["stats+candidates", "hist-coarse",
                                                      "hist-boundary", "hist-stats+rows"]
    assert plans["rows"].rounds[-1].name == "escalation"
    assert all(r[3] for r in got.values())  # graph (stand-in) equals eager
    assert torch.equal(got["rows"][1].sampled, got["hist"][1].sampled)
    assert int(got["hist"][1].uncertified.sum()) > 0
