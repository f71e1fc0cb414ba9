"""The top-p fallback-rate bench on a tiny synthetic distribution (no model, no download):
its ``need_m`` rule agrees with the library's merge row for row, the second-round
share falls with ``m``, and missing data is a one-line exit 2."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "topp_fallback.py"

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_topp_fallback_t", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_need_m_rule_matches_the_merge_and_falls_with_m(bench):
    g = torch.Generator().manual_seed(0)
    V = 4096
    # Zipf-like rows (frequent ids first, as in a BPE vocabulary) at three sharpnesses
    base = -torch.log1p(torch.arange(V, dtype=torch.float32))
    rows = {name: (base * a + torch.randn(24, V, generator=g) * 0.5).to(torch.bfloat16)
            for name, a in (("sharp", 3.0), ("medium", 1.2), ("flat", 0.4))}
    res = bench.measure(rows)  # raises if the merge disagrees with need_m on any row
    for key, r in res.items():
        assert r["merge_rows_checked"] == len(bench.M_MERGE) * 72
        shares = [r["second_round_share"][str(m)] for m in bench.M_CURVE]
        assert shares == sorted(shares, reverse=True), key
    # frequent ids on rank 0 (contiguous) are harder to certify than shuffled ids
    c = sum(res["contiguous/T=1"]["second_round_share"].values())
    p = sum(res["permuted/T=1"]["second_round_share"].values())
    assert c > p
    assert res["contiguous/T=1"]["second_round_share"]["8"] > 0  # the flat rows escalate


def test_payload_counts_every_round(bench):
    assert bench.payload_bytes(64, 0.0, 0.0, 20480) == 4 * 66 + 16
    assert bench.payload_bytes(64, 0.5, 0.0, 20480) == 4 * 66 + 16 + 0.5 * 4 * 1026


def test_missing_data_is_exit_2(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name: None)
    assert bench.main(["--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not found" in err
