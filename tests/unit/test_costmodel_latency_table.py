"""The shipped collective latency tables load, are monotone, and interpolate sanely."""

from __future__ import annotations

import json

import pytest

from vllm_kimi_ext.costmodel.catalog import list_profiles, load_hardware
from vllm_kimi_ext.costmodel.latency import load_latency_table, table_from_dict

TABLES = list_profiles("latency")
SIZES = [2**i for i in range(4, 28)] + [7168 * 2 * n for n in (1, 3, 4, 8, 17, 64, 257)]


def test_every_hardware_profile_has_a_table():
    assert TABLES
    for hw in list_profiles("hardware"):
        assert load_hardware(hw).latency_table in TABLES


@pytest.mark.parametrize("name", TABLES)
def test_table_loads_and_is_monotone_in_bytes(name):
    table = load_latency_table(name)  # validate() runs on load
    assert "nccl" in table.backends
    for backend in table.backends:
        for op in ("allreduce", "allgather"):
            lat = [table.latency_us(op, s, backend) for s in sorted(SIZES)]
            assert all(b >= a for a, b in zip(lat, lat[1:], strict=False)), (backend, op)
            assert all(x > 0 for x in lat)


@pytest.mark.parametrize("name", TABLES)
def test_interpolation_hits_the_points_and_stays_between(name):
    table = load_latency_table(name)
    for backend, ops in table.curves.items():
        for op, curve in ops.items():
            limit = table.max_bytes.get(backend)
            for (x0, y0), (x1, y1) in zip(zip(curve.sizes, curve.latencies_us),
                                          zip(curve.sizes[1:], curve.latencies_us[1:]),
                                          strict=False):
                if limit is not None and x1 > limit:
                    continue
                assert table.latency_us(op, x0, backend) == pytest.approx(y0)
                mid = table.latency_us(op, (x0 * x1) ** 0.5, backend)
                assert y0 <= mid <= y1


def test_pcie_anchors():
    t = load_latency_table("rtx-pro-6000-pcie-x8")
    # public anchors: NCCL 24-45 us at <= 8 KB; one-shot kernels 7.5-9 us at small sizes
    assert 24 <= t.latency_us("allreduce", 8192, "nccl") <= 45
    assert 7.0 <= t.latency_us("allreduce", 4096, "custom_oneshot") <= 9.0
    # above its IPC buffer a custom backend falls back to NCCL
    big = 64 * 2**20
    assert t.latency_us("allreduce", big, "custom_oneshot") == t.latency_us("allreduce", big,
                                                                             "nccl")


def test_scaling_and_bad_tables():
    t = load_latency_table("rtx-pro-6000-pcie-x8")
    assert t.scaled(0.5).latency_us("allreduce", 14336, "nccl") == pytest.approx(
        0.5 * t.latency_us("allreduce", 14336, "nccl"))
    bad = {"name": "bad", "backends": {"nccl": {"ops": {
        "allreduce": [[1024, 30.0], [2048, 20.0]], "allgather": [[1024, 30.0], [2048, 31.0]]}}}}
    with pytest.raises(ValueError, match="must not decrease"):
        table_from_dict(bad)
    with pytest.raises(KeyError, match="valid"):
        t.latency_us("allreduce", 1024, "nope")


def test_file_is_plain_json_with_provenance():
    from importlib import resources

    path = resources.files("vllm_kimi_ext.costmodel").joinpath(
        "profiles", "latency", "rtx-pro-6000-pcie-x8.json")
    doc = json.loads(path.read_text())
    assert doc["provenance"] and doc["units"]
