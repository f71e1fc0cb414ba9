"""Triton kernels of the histogram escalation's two shard passes
(``testkit/verify_hist_step.py``): the same contract as its torch twins
(:func:`testkit.verify_hist_step.coarse_torch`, :func:`testkit.verify_hist_step.boundary_torch`).

``_pass_kernel`` (one launch per round, programs ``(slot, chunk)``)
    Each program reads one chunk of its slot's shard row (16-bit ``z``), keeps the tokens
    at or above the min-p cut (``s = z / T``, the same float32 division as
    :func:`vllm_kimi_ext.verify.rowmath.scale_logits`) and, for the coarse round, adds
    ``exp(s - m)`` in float64 to 256 bins by the ordered key's high byte, one block of
    columns at a time (a one-hot sum per block, then one float64 atomic add per bin and
    program); for the
    boundary round it counts, per low byte, the tokens whose key lies in the slot's
    boundary bin (int32 atomics: the same counts on every run).

The float64 masses are summed in no fixed order (atomics); every rank reads the same
gathered bins, so the ranks agree, and a cut whose running mass lies within the edge
tolerance of ``top_p x Z`` goes to a whole-row slot, so the order never moves a cut.
No host read; fixed grids (CUDA-graph capturable).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_kimi_ext.verify._kernels.common import _LAUNCH_LOCK, _okey

#: Columns per program and per block inside it.
CHUNK = 2048
BLOCK = 128
WARPS = 4


@triton.jit
def _pass_kernel(z_ptr, stride, t_ptr, m_ptr, cut_ptr, bin_ptr, out_ptr, n_valid,
                 C: tl.constexpr, B: tl.constexpr, NB: tl.constexpr, BOUNDARY: tl.constexpr):
    """One chunk of one slot: float64 masses by high byte, or (``BOUNDARY``) int32 counts
    by low byte of the keys in the slot's boundary bin."""
    row = tl.program_id(0)
    c0 = tl.program_id(1) * C
    t = tl.load(t_ptr + row)
    m = tl.load(m_ptr + row).to(tl.float64)
    cut = tl.load(cut_ptr + row)
    target = tl.load(bin_ptr + row).to(tl.int32)
    slots = tl.arange(0, NB)
    if BOUNDARY:
        acc = tl.zeros([NB], dtype=tl.int32)
    else:
        acc = tl.zeros([NB], dtype=tl.float64)
    for off in range(0, C, B):
        cols = c0 + off + tl.arange(0, B)
        ok = cols < n_valid
        z = tl.load(z_ptr + row * stride + cols, mask=ok, other=0.0)
        s = z.to(tl.float32) / t
        live = ok & (s >= cut) & (s > float("-inf"))
        key = _okey(z)
        if BOUNDARY:
            inside = live & ((key >> 8) == target)
            hit = inside[:, None] & ((key & 255)[:, None] == slots[None, :])
            acc += tl.sum(hit.to(tl.int32), axis=0)
        else:
            w = tl.where(live, tl.exp(s.to(tl.float64) - m), 0.0)
            onehot = (key >> 8)[:, None] == slots[None, :]
            acc += tl.sum(tl.where(onehot, w[:, None], 0.0), axis=0)
    tl.atomic_add(out_ptr + row * NB + slots, acc)


def _launch(z: torch.Tensor, t: torch.Tensor, m: torch.Tensor, cutv: torch.Tensor,
            bin_id: torch.Tensor, n_valid: int, nb: int, dtype: torch.dtype) -> torch.Tensor:
    z = z.contiguous()
    out = torch.zeros((z.shape[0], nb), dtype=dtype, device=z.device)
    grid = (z.shape[0], max(1, -(-max(n_valid, 1) // CHUNK)))
    with _LAUNCH_LOCK:
        _pass_kernel[grid](z, z.stride(0), t.float().contiguous(), m.float().contiguous(),
                           cutv.float().contiguous(), bin_id.contiguous(), out, n_valid,
                           C=CHUNK, B=BLOCK, NB=nb, BOUNDARY=dtype == torch.int32,
                           num_warps=WARPS)
    return out


def coarse_hist(z: torch.Tensor, t: torch.Tensor, m: torch.Tensor, cutv: torch.Tensor,
                n_valid: int, bins: int) -> torch.Tensor:
    """float64 ``[E, bins]``: per slot, ``sum exp(s - m)`` of the kept tokens by key high
    byte. ``z [E, S]`` 16-bit shard rows, ``t`` / ``m`` / ``cutv`` ``[E]`` float32 (T, the
    row maximum, the min-p cut or -inf), ``n_valid``: the shard's non-padding columns."""
    return _launch(z, t, m, cutv, m.new_zeros(m.shape, dtype=torch.int64), n_valid, bins,
                   torch.float64)


def boundary_counts(z: torch.Tensor, t: torch.Tensor, cutv: torch.Tensor, bin_id: torch.Tensor,
                    n_valid: int, keys: int) -> torch.Tensor:
    """int32 ``[E, keys]``: per slot, the kept tokens of each key in the slot's boundary
    bin ``bin_id [E]`` (int64), by the key's low byte."""
    return _launch(z, t, t, cutv, bin_id, n_valid, keys, torch.int32)
