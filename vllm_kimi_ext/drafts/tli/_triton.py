"""Triton kernel for the ``kimi_tli`` proposal logits (imported lazily: needs Triton).

One program per (block of target ids, row): ``out[r, t] = logits[r, table[t]]``
where ``table[t] < Vd`` (a shared token), else ``-inf``.  Writes are
contiguous; reads are gathers within one row of the draft logits.  The block
index varies fastest, so the programs working on one row run together and
its gathers hit L2 (a row is ``Vd`` x 2 bytes, e.g. 300 KB).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gather_logits_kernel(logits_ptr, logits_stride, table_ptr, out_ptr, out_stride,
                          draft_vocab, target_vocab, BLOCK: tl.constexpr):
    row = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_range = cols < target_vocab
    src = tl.load(table_ptr + cols, mask=in_range, other=draft_vocab)
    shared = src < draft_vocab
    val = tl.load(logits_ptr + row * logits_stride + src, mask=in_range & shared,
                  other=float("-inf"))
    tl.store(out_ptr + row * out_stride + cols, val, mask=in_range)


def gather_logits_triton(logits: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    n, vd = logits.shape
    vt = table.numel()
    out = logits.new_empty(n, vt)
    if n == 0:
        return out
    block = 2048
    _gather_logits_kernel[(triton.cdiv(vt, block), n)](
        logits, logits.stride(0), table, out, out.stride(0), vd, vt, BLOCK=block)
    return out
