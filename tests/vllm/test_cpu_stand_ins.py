"""The plain-torch stand-ins for vLLM's compiled CPU MoE ops match a dense reference."""

from __future__ import annotations

import pytest
import torch

from testkit import cpu_stand_ins

pytestmark = pytest.mark.vllm


def _dense_moe(x, w13, w2, topk_w, topk_ids):
    """Every expert on every token, masked by routing: independent of the loop."""
    inter = w13.shape[1] // 2
    h = torch.einsum("th,eih->tei", x, w13)
    act = torch.nn.functional.silu(h[..., :inter]) * h[..., inter:]
    y = torch.einsum("tei,ehi->teh", act, w2)
    gate = torch.zeros(x.shape[0], w13.shape[0])
    gate.scatter_add_(1, topk_ids.long(), topk_w)
    return (y * gate.unsqueeze(-1)).sum(1)


def test_fused_moe_stand_in_matches_dense_reference():
    cpu_stand_ins.install()
    g = torch.Generator().manual_seed(0)
    t, hdim, inter, e, k = 7, 16, 12, 5, 2
    x = torch.randn(t, hdim, generator=g)
    w13 = torch.randn(e, 2 * inter, hdim, generator=g) / 4
    w2 = torch.randn(e, hdim, inter, generator=g) / 4
    topk_ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()
    topk_w = torch.rand(t, k, generator=g)
    out = torch.empty(t, hdim)
    torch.ops._C.cpu_fused_moe(out, x, w13, w2, None, None, topk_w, topk_ids, False, "silu",
                               "vec")
    torch.testing.assert_close(out, _dense_moe(x, w13, w2, topk_w, topk_ids),
                               rtol=1e-5, atol=1e-5)
    packed = torch.empty_like(w13)
    torch.ops._C.prepack_moe_weight(w13, packed, "vec")
    assert torch.equal(packed, w13)


def test_install_is_idempotent():
    cpu_stand_ins.install()
    assert cpu_stand_ins.install() == []
