"""The smaller escalation exchange's model (``testkit.verify_hist_exchange``) finds the same
top-p cut as the whole-row sort (``escalate.rows.exact_cut``) over 8 bf16 shards at Kimi's V."""

from __future__ import annotations

import pytest
import torch

from testkit.verify_hist_exchange import hist_exchange_cut
from vllm_kimi_ext.verify.escalate.rows import exact_cut
from vllm_kimi_ext.verify.rowmath import scale_logits

V, TP = 163840, 8


def _rows():
    g = torch.Generator().manual_seed(25)
    for i, scale in enumerate([0.3, 1.0, 3.0, 8.0]):
        (yield f"randn{scale}", (torch.randn(V, generator=g) * scale).to(torch.bfloat16),
            [1.0, 0.6][i % 2], [0.95, 0.9][i % 2])
    # three or more tied tokens past the cut, spread over several shards (ids far apart)
    z = (torch.randn(V, generator=g) * 0.5).to(torch.bfloat16)
    z[torch.arange(8) * 20480 + 1000 + torch.arange(8) * 7] = 11.25  # one per shard
    yield "ties-over-shards", z, 1.0, 0.3  # 4 of the 8 kept, 4 past the cut
    # a cut about 7 nats below the row maximum: one top token, a long flat tail
    z = torch.full((V,), 3.0) + torch.rand(V, generator=g) * 0.01
    z[12345] = 10.0
    yield "deep-cut", z.to(torch.bfloat16), 1.0, 0.95
    # about 14 nats below: inside the band ln(V / (1 - top_p)) + 1 = 16.0, outside ln(V / top_p)
    z = torch.full((V,), 6.0) + torch.rand(V, generator=g) * 0.01
    z[99] = 20.0
    yield "deeper-cut", z.to(torch.bfloat16), 1.0, 0.95


@pytest.mark.parametrize("name,z,t,p", list(_rows()), ids=lambda v: v if isinstance(v, str) else "")
def test_cut_equals_whole_row_sort(name, z, t, p):
    thr, tie, _ = exact_cut(scale_logits(z[None], torch.tensor([t])),
                            torch.zeros(1, dtype=torch.long), torch.zeros(1), torch.tensor([p]))
    got = hist_exchange_cut(z.clone(), t, p, TP)
    assert got is not None, name
    assert (got.value, got.tie_id) == (float(thr), int(tie)), name
    # bytes per rank: 3,080 B + at most 256 keys x 4 B, against 40,960 B for the shard row
    assert got.coarse_bytes == 3080 and got.boundary_bytes <= 1024


@pytest.mark.slow
def test_cut_equals_whole_row_sort_random_sweep():
    """120 random bf16 rows (scales 0.3-8, T 1.0 / 0.6, top_p 0.5-0.95, every fifth row with
    50 tokens tied at its maximum): no row deferred, every cut the whole-row sort's."""
    g = torch.Generator().manual_seed(2025)
    for i in range(120):
        z = (torch.randn(V, generator=g) * [1.0, 3.0, 0.3, 8.0][i % 4]).to(torch.bfloat16)
        if i % 5 == 0:
            z[torch.randint(0, V, (50,), generator=g)] = z.max()
        t, p = [1.0, 0.6][i % 2], [0.95, 0.9, 0.5][i % 3]
        thr, tie, _ = exact_cut(scale_logits(z[None], torch.tensor([t])),
                                torch.zeros(1, dtype=torch.long), torch.zeros(1),
                                torch.tensor([p]))
        got = hist_exchange_cut(z.clone(), t, p, TP)
        assert got is not None and (got.value, got.tie_id) == (float(thr), int(tie)), i
