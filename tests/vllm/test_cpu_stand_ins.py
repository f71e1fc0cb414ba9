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


# ---- the engine tier's CPU_ATTN stand-ins (testkit/engine_ops.py) ----------------------------


def _paged_case(g, block_size=32, kv_heads=2, heads=4, head=32, blocks=9):
    """Three requests (a prefill, a 1-token decode, a 3-token verify) written into a paged
    cache through shuffled block tables; returns what the reference needs too."""
    from testkit import engine_ops

    seq_lens = [40, 70, 35]
    q_lens = [40, 1, 3]
    cache = torch.zeros(blocks, kv_heads, 2 * block_size, head)
    kc, vc = cache.chunk(2, dim=2)
    perm = torch.randperm(blocks, generator=g)
    tables, used = [], 0
    for n in seq_lens:
        nb = -(-n // block_size)
        tables.append(perm[used:used + nb].tolist() + [0] * (3 - nb))
        used += nb
    block_table = torch.tensor(tables, dtype=torch.int32)
    keys = [torch.randn(n, kv_heads, head, generator=g) for n in seq_lens]
    vals = [torch.randn(n, kv_heads, head, generator=g) for n in seq_lens]
    slots = [[tables[i][p // block_size] * block_size + p % block_size for p in range(n)]
             for i, n in enumerate(seq_lens)]
    k_all, v_all = torch.cat(keys), torch.cat(vals)
    slot_mapping = torch.tensor(sum(slots, []) + [-1, -1])  # two padding slots
    pad = torch.full((2, kv_heads, head), 1e4)
    engine_ops.stand_in_reshape_and_cache(torch.cat([k_all, pad]), torch.cat([v_all, pad]),
                                          kc, vc, slot_mapping, "vec")
    q = torch.randn(sum(q_lens), heads, head, generator=g)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return dict(cache=cache, kc=kc, vc=vc, keys=keys, vals=vals, q=q, qsl=qsl,
                seq_lens=torch.tensor(seq_lens, dtype=torch.int32), q_lens=q_lens,
                block_table=block_table)


def _dense_attention(q, k, v, scale):
    """One request, queries at the last ``len(q)`` positions: causal SDPA over heads."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s, n = k.shape[0], q.shape[0]
    mask = torch.arange(s)[None, :] <= torch.arange(s - n, s)[:, None]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale)
    return out.transpose(0, 1)


def test_cpu_attn_stand_ins_match_dense_attention():
    """Paged KV write + paged attention (prefill, decode, multi-token verify in one batch,
    padding slots) equal per-request dense causal attention on the unpaged K/V."""
    from testkit import engine_ops

    g = torch.Generator().manual_seed(1)
    c = _paged_case(g)
    meta = engine_ops.stand_in_get_scheduler_metadata(
        3, 4, 2, 32, c["seq_lens"], torch.float32, c["qsl"], True, -1, "vec", False)
    out = torch.zeros_like(c["q"])
    engine_ops.stand_in_attention_with_kv_cache(
        c["q"], c["kc"], c["vc"], out, c["qsl"], c["seq_lens"], 0.2, True, None, -1,
        c["block_table"], 0.0, meta, None)
    lo = 0
    for i, n in enumerate(c["q_lens"]):
        ref = _dense_attention(c["q"][lo:lo + n], c["keys"][i], c["vals"][i], 0.2)
        torch.testing.assert_close(out[lo:lo + n], ref, rtol=1e-5, atol=1e-5)
        lo += n
    # the padding slots wrote nothing: no 1e4 anywhere in the cache
    assert c["cache"].abs().max() < 100


def test_engine_ops_install_targets_vllm_cpu_ops_and_init_memory_env():
    """install() replaces exactly the three ``vllm._cpu_ops`` CPU_ATTN wrappers and makes
    ``_C::init_cpu_memory_env`` callable (CPUWorker calls it with a node list)."""
    from vllm import _cpu_ops

    from testkit import engine_ops

    engine_ops.install()
    assert _cpu_ops.cpu_attention_with_kv_cache is engine_ops.stand_in_attention_with_kv_cache
    assert _cpu_ops.cpu_attn_reshape_and_cache is engine_ops.stand_in_reshape_and_cache
    assert (_cpu_ops.cpu_attn_get_scheduler_metadata is
        engine_ops.stand_in_get_scheduler_metadata)
    torch.ops._C.init_cpu_memory_env([0])


def _splat_mask_kernel():
    """A kernel that ANDs a block mask with a scalar condition (as vLLM's ngram speculator
    does, ``ngram/speculator.py`` ``slot_valid``) and loads/stores under it."""
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(out_ptr, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK).to(tl.int64)
        ok = (tl.load(out_ptr) > 0) & (n > 0)
        m = (i < n) & ok
        x = tl.load(out_ptr + i, mask=m, other=0)
        tl.store(out_ptr + i, tl.where(m, x + 1, 0), mask=i < BLOCK)

    return kernel


def test_triton_interpreter_splat_fix(monkeypatch):
    """The installed Triton's interpreter has the ``create_splat`` bug (the kernel fails
    with "mask has unsupported dtype" under the original method) and the fix makes the
    same kernel compute the right values; skipped where Triton lacks the bug."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from triton.runtime import interpreter

    from testkit import engine_ops

    if not engine_ops.splat_bug_present():
        pytest.skip("this Triton's interpreter splats with the result type already")
    engine_ops.fix_triton_interpreter_splat()
    kernel = _splat_mask_kernel()
    out = torch.ones(8, dtype=torch.int64)
    kernel[(1,)](out, 5, BLOCK=8)
    assert out.tolist() == [2, 2, 2, 2, 2, 0, 0, 0]
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_splat",
                        engine_ops._STATE["original_splat"])
    with pytest.raises(Exception, match="mask has unsupported dtype"):
        kernel[(1,)](torch.ones(8, dtype=torch.int64), 5, BLOCK=8)
