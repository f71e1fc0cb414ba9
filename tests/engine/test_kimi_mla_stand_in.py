"""The ``CPU_MLA`` decode stand-in (testkit/engine_mla_ops.py) against a dense reference.

The reference walks every cached token one at a time through the block table (slot =
``block_table[t // 16] · 16 + t % 16``) and computes the softmax in float64 with explicit
``exp`` / sum: no gather, no reshape shared with the stand-in. Called through vLLM's own
wrapper ``vllm._cpu_ops.mla_decode_kvcache_cpu``, as ``cpu_mla.py`` calls it.
"""

from __future__ import annotations

import math

import pytest
import torch

from testkit import engine_mla_ops

pytestmark = [pytest.mark.engine, pytest.mark.vllm]

D, V, B = (engine_mla_ops.KERNEL_HEAD_DIM, engine_mla_ops.KERNEL_V_HEAD_DIM,
           engine_mla_ops.KERNEL_BLOCK_SIZE)


def _dense(q, cache, scale, table, lens):
    out = torch.zeros(q.shape[0], q.shape[1], V, dtype=torch.float64)
    for s in range(q.shape[0]):
        rows = [cache[int(table[s, t // B]), t % B].double() for t in range(int(lens[s]))]
        for h in range(q.shape[1]):
            logits = [float(q[s, h].double() @ r) * scale for r in rows]
            top = max(logits)
            w = [math.exp(x - top) for x in logits]
            total = sum(w)
            for wi, r in zip(w, rows):
                out[s, h] += (wi / total) * r[:V]
    return out


def _case(seed: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor([1, 16, 17, 40], dtype=torch.int32)  # one token, a full block, +1, 3
    blocks = 12
    perm = torch.randperm(blocks, generator=g)[:12].to(torch.int32)
    table = perm.view(4, 3).contiguous()  # blocks scattered over the cache, not in order
    cache = torch.randn(blocks, B, D, generator=g).to(dtype)
    q = torch.randn(4, 3, D, generator=g).to(dtype)  # 3 heads: the odd head count path
    return q, cache, table, lens


def test_stand_in_matches_dense_reference_through_vllms_wrapper():
    engine_mla_ops.install()
    from vllm import _cpu_ops

    q, cache, table, lens = _case(0)
    scale = 1 / math.sqrt(192)
    out = torch.full((4, 3, V), float("nan"))
    _cpu_ops.mla_decode_kvcache_cpu(out, q, cache, scale, table, lens)
    ref = _dense(q, cache, scale, table, lens)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    # a sequence must not see the next one's blocks: the 1-token row is its own value row
    torch.testing.assert_close(out[0, 0].double(), cache[table[0, 0], 0, :V].double())


def test_stand_in_writes_out_dtype_bf16():
    engine_mla_ops.install()
    q, cache, table, lens = _case(1, torch.bfloat16)
    out = torch.zeros(4, 3, V, dtype=torch.bfloat16)
    torch.ops._C.mla_decode_kvcache(out, q, cache, 0.1, table, lens)
    ref = _dense(q.float(), cache.float(), 0.1, table, lens)
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("shape", [(4, 3, 64), (2, 8, 16)])  # other head / block dims
def test_stand_in_refuses_what_the_kernel_does_not_compile(shape):
    engine_mla_ops.install()
    blocks, block, head = shape
    cache = torch.zeros(blocks, block, head)
    q = torch.zeros(1, 2, head)
    out = torch.zeros(1, 2, min(V, head))
    with pytest.raises(RuntimeError, match="Unsupported block size"):
        torch.ops._C.mla_decode_kvcache(out, q, cache, 1.0, torch.zeros(1, 1, dtype=torch.int32),
                                        torch.ones(1, dtype=torch.int32))
