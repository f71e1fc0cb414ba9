"""The shipped latency tables are measurements with sources; the curve rules hold."""

from __future__ import annotations

import json

import pytest

from vllm_kimi_ext.costmodel.catalog import ProfileError, list_profiles, load_hardware, load_raw
from vllm_kimi_ext.costmodel.latency import (
    SOURCE_FIELDS,
    curve_from_points,
    load_latency_table,
    table_from_dict,
)

TABLES = list_profiles("latency")
SIZES = [2**i for i in range(4, 28)] + [7168 * 2 * n for n in (1, 3, 4, 8, 17, 64, 257)]


def test_every_hardware_profile_has_a_table():
    assert TABLES
    for hw in list_profiles("hardware"):
        assert load_hardware(hw).latency_table in TABLES


@pytest.mark.parametrize("name", TABLES)
def test_every_shipped_point_names_a_complete_source(name):
    t = load_latency_table(name)
    assert t.unsourced_points() == []
    raw = load_raw("latency", name)
    for sid, src in raw["sources"].items():
        assert all(src.get(f) for f in SOURCE_FIELDS), sid
        assert len(src["commit"]) == 40 and src["date"][:2] == "20", sid


def test_unsourced_points_are_found():
    t = table_from_dict({"name": "x", "sources": {"a": {"repo": "r", "file": "f", "commit": "c",
                                                        "date": "2026", "topology": "t"}},
                         "backends": {"nccl": {"ops": {"allreduce": [[1024, 20.0, "a"],
                                                                     [4096, 21.0],
                                                                     [8192, 22.0, "zz"]]}}}})
    assert t.unsourced_points() == ["nccl:allreduce@4096", "nccl:allreduce@8192"]


@pytest.mark.parametrize("name", TABLES)
def test_table_is_monotone_in_bytes(name):
    table = load_latency_table(name)
    for backend in table.backends:
        for op in ("allreduce", "allgather"):
            lat = [table.latency_us(op, s, backend) for s in sorted(SIZES)]
            assert all(b >= a for a, b in zip(lat, lat[1:])), (backend, op)
            assert all(x > 0 for x in lat)


def test_a_dip_is_kept_as_published_and_lifted_on_the_curve():
    # the PyNCCL microbenchmark measured 22.12 us at 64 KB after 24.49 us at 56 KB
    t = load_latency_table("rtx-pro-6000-pcie-x8")
    c = t.curves["nccl"]["allreduce"]
    assert 22.12 in c.measured_us
    assert (65536.0, 22.12, 24.49) in c.lifted
    assert t.latency_us("allreduce", 65536, "nccl") == pytest.approx(24.49)
    assert t.latency_us("allreduce", 57344, "nccl") == pytest.approx(24.49)


def test_interpolation_hits_the_points_and_stays_between():
    c = curve_from_points([[1000, 10.0], [4000, 20.0], [16000, 20.0]], "t")
    assert c(1000) == 10.0 and c(4000) == 20.0
    assert 10.0 < c(2000) < 20.0
    assert c(100) == 10.0  # flat below the first point
    assert c(32000) == 20.0  # the last segment's (zero) slope beyond the last point


def test_derived_allgather_and_auto_crossover():
    t = load_latency_table("rtx-pro-6000-pcie-switch-x8")
    # no all-gather was measured: NCCL's ring all-gather of S costs an all-reduce of S/2
    assert "allgather" not in t.curves["nccl"]
    assert (t.latency_us("allgather", 2 * 262144, "nccl") ==
        pytest.approx(t.latency_us("allreduce", 262144, "nccl")))
    # luke's kernel benchmarks itself against NCCL: min of both
    for size in (256, 8192, 32768, 65536, 262144):
        assert t.latency_us("allreduce", size, "custom_oneshot") == pytest.approx(min(
            t.curves["custom_oneshot"]["allreduce"](size), t.latency_us("allreduce", size,
                                                                        "nccl")))
    assert t.latency_us("allreduce", 8192, "custom_oneshot") == pytest.approx(9.2)
    assert t.latency_us("allreduce", 262144, "custom_oneshot") == pytest.approx(28.0)  # NCCL


def test_a_deployment_cutoff_replaces_the_crossover():
    t = load_latency_table("rtx-pro-6000-pcie-x8")
    forced = t.with_policy("custom_oneshot", 114688, auto_crossover=False)
    own = t.curves["custom_oneshot"]["allreduce"](114688)
    assert forced.latency_us("allreduce", 114688, "custom_oneshot") == pytest.approx(own)
    assert own > t.latency_us("allreduce", 114688, "nccl")  # NCCL would have been faster
    assert (forced.latency_us("allreduce", 200000, "custom_oneshot") ==
        t.latency_us("allreduce", 200000, "nccl"))


def test_the_issue_anchors_are_reproduced():
    # PCIe-switch box: parity near the 57 KB message of B=1, k=3 (NCCL 24.1 vs one-shot 25.9
    # at 64 KB), one-shot ahead at a few KB, NCCL ahead at 256 KB
    t = load_latency_table("rtx-pro-6000-pcie-switch-x8")
    nccl = t.latency_us("allreduce", 57344, "nccl")
    one = t.curves["custom_oneshot"]["allreduce"](57344)
    assert abs(one / nccl - 1) < 0.1
    assert t.curves["custom_oneshot"]["allreduce"](8192) < 0.5 * t.latency_us(
        "allreduce", 8192, "nccl")


@pytest.mark.parametrize("bad,field", [
    ({"backends": {"nccl": {"ops": {"allreduce": [[1024, 30.0], [1024, 31.0]]}}}},
     "strictly increasing"),
    ({"backends": {"nccl": {"ops": {"allreduce": [[1024, 30.0]]}}}}, "at least two"),
    ({"backends": {"nccl": {"ops": {"allreduce": [[1024, "x"], [2048, 3]]}}}}, "numbers"),
    ({"backends": {"nccl": {"ops": {"allreduce": [[1024, -1.0], [2048, 3]]}}}}, "positive"),
    ({"backends": {"nccl": {"ops": {"broadcast": [[1024, 1.0], [2048, 3]]}}}}, "unknown op"),
    ({"backends": {"gloo": {"ops": {"allreduce": [[1024, 1.0], [2048, 3]]}}}}, "'backends.nccl'"),
    ({"backends": {}}, "'backends'"),
])
def test_bad_tables_name_the_field(bad, field):
    with pytest.raises(ProfileError, match=field):
        table_from_dict({"name": "bad", **bad}, "bad.json")


def test_bench_schema_loads(tmp_path):
    """bench/allreduce_bench.py writes two-element points and a provenance line."""
    doc = {"name": "measured-x8", "provenance": ["MEASURED on box"], "backends": {
        "nccl": {"ops": {"allreduce": [[14336, 30.0], [57344, 31.0]]},
                 "measurements": {"allreduce": []}}}}
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(doc))
    t = load_latency_table(path)
    assert t.latency_us("allreduce", 14336, "nccl") == 30.0
    assert t.unsourced_points()  # a box's own table has provenance, not per-point sources
