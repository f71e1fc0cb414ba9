"""The all-reduce bench writes a latency table the cost model loads."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_kimi_ext.costmodel.latency import load_latency_table, table_from_dict

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "allreduce_bench.py"


@pytest.fixture(scope="module")
def ar():
    spec = importlib.util.spec_from_file_location("bench_allreduce_t", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _rec(nbytes, p50):
    return {"bytes": nbytes, "p50_us": p50, "p10_us": p50 * 0.9, "p90_us": p50 * 1.2,
            "mean_us": p50, "min_us": p50 * 0.8, "reps": 10}


def _partial(label="nccl"):
    sizes = [t * 7168 * 2 for t in (1, 4, 8, 16, 32, 64, 256)]
    lat = [30.0, 29.0, 35.0, 40.0, 55.0, 90.0, 300.0]  # noisy: 4 tokens faster than 1
    return {"measurement": {"world_size": 8, "devices": ["NVIDIA RTX PRO 6000"] * 8,
                            "mode": "graph", "inner": 20, "reps": 50, "warmup": 10,
                            "torch": "2.x", "nccl": "2.27", "date": "2026-01-01"},
            "backends": {label: {"measurements": {
                "allreduce": [_rec(b, t) for b, t in zip(sizes, lat)],
                "allgather": [_rec(b, t / 2) for b, t in zip(sizes, lat)]}, "env": {}}},
            "errors": {"flashinfer_pcie_ipc": "skipped: flashinfer not importable"}}


def test_table_loads_with_the_cost_model_loader(ar, tmp_path):
    table = ar.build_table([_partial(), _partial("nccl_p2p_off")])
    t = table_from_dict(json.loads(json.dumps(table)))  # validates monotonicity, fallback
    assert t.name == "measured-nvidia-rtx-pro-6000-x8"
    assert set(t.backends) == {"nccl", "nccl_p2p_off"}
    # the curve is the running max of the medians: the faster 4-token point is lifted
    assert t.latency_us("allreduce", 14336, "nccl") == 30.0
    assert t.latency_us("allreduce", 57344, "nccl") == pytest.approx(30.0)
    assert t.latency_us("allreduce", 256 * 7168 * 2, "nccl") == pytest.approx(300.0)
    raw = table["backends"]["nccl"]["measurements"]["allreduce"]
    assert raw[1]["p50_us"] == 29.0  # raw percentiles are kept
    assert "flashinfer_pcie_ipc" in table["not_measured"]
    path = tmp_path / "measured.json"
    ar.write_table(table, path)
    assert load_latency_table(path).latency_us("allgather", 14336, "nccl") == pytest.approx(15.0)


def test_base_table_keeps_unmeasured_backends(ar):
    from vllm_kimi_ext.costmodel.catalog import load_raw

    base = load_raw("latency", "rtx-pro-6000-pcie-x8")
    table = ar.build_table([_partial()], base=base, base_name="rtx-pro-6000-pcie-x8")
    t = table_from_dict(table)
    assert set(t.backends) == {"nccl", "custom_oneshot"}
    assert t.latency_us("allreduce", 14336, "nccl") == 30.0  # measured replaces
    assert table["backends"]["custom_oneshot"] == base["backends"]["custom_oneshot"]
    assert any("Carried over" in p for p in table["provenance"])


def test_summary_takes_the_slowest_rank(ar):
    st = ar.summarize([[10.0, 11.0, 12.0], [13.0, 9.0, 12.5]])
    assert st["p50_us"] == 12.5 and st["min_us"] == 11.0 and st["reps"] == 3


def test_gloo_run_on_cpu_is_loadable(tmp_path):
    """The real script, 2 gloo ranks on CPU (mechanics only), merged into the shipped
    table: the cost model loads the result."""
    out = tmp_path / "ar.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--launch", "2", "--device", "cpu", "--tokens", "1,4",
         "--logit-rows", "1", "--reps", "3", "--inner", "2", "--warmup", "1",
         "--base", "rtx-pro-6000-pcie-x8", "--out", str(out), "--timeout", "120"],
        capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    t = load_latency_table(out)
    assert "gloo" in t.backends and "nccl" in t.backends
    assert t.latency_us("allreduce", 14336, "gloo") > 0
    data = json.loads(out.read_text())
    assert data["measurement"]["world_size"] == 2
    assert ([p["bytes"] for p in data["backends"]["gloo"]["measurements"]["allreduce"]] ==
        [14336, 57344])
