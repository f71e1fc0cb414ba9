"""Shard-local statistics: fused torch vs a plain per-row model; Triton via its interpreter."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import vllm_kimi_ext
from vllm_kimi_ext.verify.hashing import DOMAIN_GUMBEL, gumbel_noise, row_keys
from vllm_kimi_ext.verify.shard_stats import shard_local_stats, shard_local_stats_torch

REPO = Path(vllm_kimi_ext.__file__).resolve().parents[1]
NEG_INF = float("-inf")


def _plain_row_stats(z, T, thr, draft, seed, pos, off, V, exclude):
    """One row at a time, python loops over the questions asked: the spec of the kernel."""
    S = z.shape[0]
    ids = list(range(off, off + S))
    valid = [i < V for i in ids]
    dcol = draft - off if (draft >= 0 and 0 <= draft - off < S and draft < V) else -1
    if T == 0:
        vals = [float(z[j]) if valid[j] else NEG_INF for j in range(S)]
        best = max(vals)
        j = vals.index(best)
        return [best, float(off + j), NEG_INF, NEG_INF]
    s = (z.float() / T).tolist()
    s = [x if valid[j] and x >= thr else NEG_INF for j, x in enumerate(s)]
    lse = float(torch.logsumexp(torch.tensor(s), 0))
    h1, h2 = row_keys(torch.tensor([seed]), torch.tensor([pos]), DOMAIN_GUMBEL)
    g = gumbel_noise(h1, h2, torch.arange(off, off + S))[0].tolist()
    sc = [(s[j] + g[j]) if s[j] > NEG_INF and not (exclude and j == dcol) else NEG_INF
          for j in range(S)]
    best = max(sc)
    j = sc.index(best)
    sx = s[dcol] if dcol >= 0 else NEG_INF
    return [best, float(off + j), lse, sx]


@pytest.mark.parametrize("exclude", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_torch_matches_plain_model(dtype, exclude):
    g = torch.Generator().manual_seed(3)
    R, S, V, off = 12, 23, 60, 46  # last shard: 14 valid columns + 9 padding
    z = (torch.randn(R, S, generator=g) * 3).to(dtype)
    z[:, 5] = z[:, 9]  # ties
    T = torch.tensor([0.0, 1.0, 0.5, 2.0] * 3)
    thr = torch.tensor([NEG_INF, 0.5, NEG_INF, -1.0] * 3)
    thr = torch.where(T == 0, NEG_INF, thr)
    draft = torch.tensor([49, -1, 51, 55, 59, 46, 2, 60, 53, 64, 47, 58])  # some not owned
    seeds = torch.arange(R) * 31 + 1
    pos = torch.arange(R)
    got = shard_local_stats_torch(z, T, thr, draft, seeds, pos, off, V, exclude)
    for r in range(R):
        want = _plain_row_stats(z[r], float(T[r]), float(thr[r]), int(draft[r]), int(seeds[r]),
                                int(pos[r]), off, V, exclude)
        for slot in range(4):
            a, b = float(got[r, slot]), want[slot]
            assert (a == b) or abs(a - b) < 1e-5 * max(1.0, abs(b)), (r, slot, a, b)
        assert got[r, 1] == want[1]


def test_auto_backend_on_cpu_is_torch():
    z = torch.randn(2, 8)
    T = torch.tensor([0.0, 1.0])
    args = (z, T, None, torch.tensor([-1, 2]), torch.tensor([1, 2]), torch.tensor([0, 0]), 0, 8)
    assert torch.equal(shard_local_stats(*args), shard_local_stats_torch(*args))


@pytest.mark.skipif(sys.platform != "linux", reason="Triton ships Linux wheels only")
def test_triton_kernel_in_interpreter():
    """The Triton kernels (run by Triton's CPU interpreter) agree with fused torch, their
    noise hash is bit-identical, an excluded draft that dominates its row is never the
    Gumbel-max, ties at a cut are kept up to the tie column, and the sharded step
    on the Triton backend equals the reference with top-p. Runs on every Linux CI
    machine: Triton is a test dependency (``pip install -e .[test]``), not optional."""
    assert importlib.util.find_spec("triton") is not None, (
        "triton is missing: install the test extras (pip install -e .[test])")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    r = subprocess.run(
        [sys.executable, "-m", "testkit.verify_kernel_check", "--device", "cpu",
         "--quick"],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=env, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)
    assert summary["hash_words_checked"] > 0
    assert len(summary["cases"]) >= 7
    assert sum(c["dominant_drafts"] for c in summary["cases"]) >= 2
    sharded = summary["sharded"]
    assert sharded["identical"] == sharded["num_reqs"]
    assert len(sharded["collectives"]) == 2  # statistics + candidates, escalation
