"""Shard-local verification statistics in one fused pass over a logits shard.

For each row ``j`` of a rank's shard ``z[j, 0:S]`` (global ids
``col_offset .. col_offset + S - 1``; ids ``>= vocab_size`` are padding and never
win) this computes the 4 float32 numbers the rank contributes to the single
all-gather of a verification step:

=====  =====================================================================
slot   meaning
=====  =====================================================================
0      ``gval``: greedy row: ``max_v z_v``; sampling row: ``max_v s_v + g_v``
       where ``s = mask(z / T)`` and ``g_v`` is the counter-based Gumbel noise
       of global token ``v`` (:mod:`.hashing`), with the row's draft token
       excluded when ``exclude_draft`` is set (one-hot residual).
1      ``gidx``: global token id of slot 0 (float32; exact below ``2**24``),
       lowest id on ties.
2      ``lse``: ``log sum_v exp(s_v)`` over the shard (``-inf`` if empty;
       ``-inf`` on greedy rows).
3      ``s_x``: ``s`` at the draft token if this shard owns it, else ``-inf``.
=====  =====================================================================

``mask`` keeps ``s_v > threshold`` and, at ``s_v == threshold``, the columns
``<= tie_col`` (an exact min-p/top-k/top-p cut already merged over ranks: the
rank's share of a prefix of the row in (value, id) order); it sets every other
``s_v`` and the padding to ``-inf``. When every row is greedy only slots 0-1 are
produced (``width=2``: 8 bytes per row). Round 1 (:mod:`.stats`) sends these statistics in
stats-only steps and the escalation (:mod:`.escalate`) runs them on gathered whole rows;
:func:`.rowmath.merge_argmax` merges the ``(max, argmax)`` pairs.

Two implementations with the same contract:

* :func:`shard_local_stats_torch`: fused torch ops; runs anywhere (CPU in CI)
  and is the reference of the Triton kernel.
* Triton kernels (:mod:`._kernels.stats`; grid ``rows x splits``: each
  program streams a slice of the shard once, keeping an online max/sum-exp
  and a running Gumbel-argmax; a second tiny kernel merges the splits; row
  keys are derived in-kernel). Used automatically for CUDA tensors when
  Triton is importable. Triton is imported lazily: this module imports
  without it. No host synchronisation: CUDA-graph capturable.

Both use the identical integer hash, so the noise bits agree exactly; float
transcendental functions (``log``, ``log1p``, ``exp``) may differ by a few
ulps between backends, so cross-backend checks compare values with a
tolerance and tokens up to near-ties. Within one backend, the sharded
verifier and the reference see bitwise identical per-token scores.
"""

from __future__ import annotations

import functools

import torch

from .backend import use_triton
from .hashing import DOMAIN_GUMBEL, gumbel_noise, row_keys
from .rowmath import scale_logits

NEG_INF = float("-inf")


# ---------------------------------------------------------------------------
# fused torch implementation
# ---------------------------------------------------------------------------


def masked_scaled_shard(
    logits_shard: torch.Tensor,
    temperature: torch.Tensor,
    threshold: torch.Tensor | None,
    col_offset: int,
    vocab_size: int,
    tie_col: torch.Tensor | None = None,
) -> torch.Tensor:
    """``mask(z / T)`` on a shard: the cut (``s > threshold``, or ``s == threshold``
    at columns ``<= tie_col``; all ties kept without ``tie_col``) and padding."""
    S = logits_shard.shape[1]
    s = scale_logits(logits_shard, temperature)
    cols = torch.arange(S, device=s.device)
    drop = ~((cols + col_offset) < vocab_size)[None, :]
    if threshold is not None:
        thr = threshold[:, None]
        keep = s > thr
        if tie_col is None:
            keep = keep | (s == thr)
        else:
            keep = keep | ((s == thr) & (cols[None, :] <= tie_col[:, None]))
        drop = drop | ~keep
    return s.masked_fill(drop, NEG_INF)


def _owned_cols(draft: torch.Tensor, col_offset: int, n_valid: int) -> torch.Tensor:
    """Local column of each row's draft token if this shard owns it, else -1."""
    local = draft - col_offset
    owned = (draft >= 0) & (local >= 0) & (local < n_valid)
    return torch.where(owned, local, torch.full_like(local, -1))


def shard_local_stats_torch(
    logits_shard: torch.Tensor,
    temperature: torch.Tensor,
    threshold: torch.Tensor | None,
    draft: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    col_offset: int,
    vocab_size: int,
    exclude_draft: bool = True,
    width: int = 4,
    tie_col: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fused-torch shard statistics ``[rows, width]`` (see module docstring)."""
    R, S = logits_shard.shape
    dev = logits_shard.device
    out = torch.full((R, 4), NEG_INF, dtype=torch.float32, device=dev)
    if R == 0:
        return out[:, :width]
    n_valid = max(0, min(S, vocab_size - col_offset))
    s = masked_scaled_shard(logits_shard, temperature, threshold, col_offset, vocab_size,
                            tie_col)
    greedy = temperature == 0
    dcol = _owned_cols(draft.to(torch.int64), col_offset, n_valid)
    owned = dcol >= 0
    s_x = s.gather(1, dcol.clamp(min=0)[:, None]).squeeze(1)
    out[:, 3] = torch.where(owned & ~greedy, s_x, torch.full_like(s_x, NEG_INF))

    g_rows = greedy.nonzero().squeeze(1)
    if g_rows.numel():
        sg = s[g_rows]
        idx = torch.argmax(sg, dim=1)
        out[g_rows, 0] = sg.gather(1, idx[:, None]).squeeze(1)
        out[g_rows, 1] = (idx + col_offset).to(torch.float32)

    r_rows = (~greedy).nonzero().squeeze(1)
    if r_rows.numel():
        sr = s[r_rows]
        out[r_rows, 2] = torch.logsumexp(sr, dim=1)
        gid = torch.arange(S, device=dev) + col_offset
        h1, h2 = row_keys(seeds[r_rows], positions[r_rows], DOMAIN_GUMBEL)
        score = sr + gumbel_noise(h1, h2, gid)
        if exclude_draft:
            drop = torch.arange(S, device=dev)[None, :] == dcol[r_rows, None]
            score = score.masked_fill(drop, NEG_INF)
        idx = torch.argmax(score, dim=1)
        out[r_rows, 0] = score.gather(1, idx[:, None]).squeeze(1)
        out[r_rows, 1] = (idx + col_offset).to(torch.float32)
    return out if width == 4 else out[:, :width].contiguous()


# ---------------------------------------------------------------------------
# Triton launcher (the kernels: _kernels/stats.py)
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _num_sms_cached(index: int) -> int:
    try:
        return torch.cuda.get_device_properties(index).multi_processor_count
    except (RuntimeError, AssertionError):
        return 132


def _num_sms(device: torch.device) -> int:
    return _num_sms_cached(device.index if device.index is not None
                           else torch.cuda.current_device())


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` as a contiguous ``dtype`` tensor, without a dispatcher round trip when it is."""
    if t.dtype == dtype and t.is_contiguous():
        return t
    return t.to(dtype).contiguous()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def shard_local_stats_triton(
    logits_shard: torch.Tensor,
    temperature: torch.Tensor,
    threshold: torch.Tensor | None,
    draft: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    col_offset: int,
    vocab_size: int,
    exclude_draft: bool = True,
    width: int = 4,
    tie_col: torch.Tensor | None = None,
    *,
    block: int = 1024,
    splits: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """Triton shard statistics ``[rows, 4]``; same contract as the torch version.

    ``splits`` (programs per row) defaults to about two programs per SM; each
    program streams ``ceil(blocks / splits)`` tiles of ``block`` columns.
    Issues no host synchronisation (CUDA-graph capturable).
    """
    from ._kernels import stats as ks

    if logits_shard.stride(1) != 1:
        logits_shard = logits_shard.contiguous()
    R, S = logits_shard.shape
    dev = logits_shard.device
    out = torch.empty((R, width), dtype=torch.float32, device=dev)
    if R == 0:
        return out
    n_valid = max(0, min(S, vocab_size - col_offset))
    nblk = max(1, _cdiv(max(n_valid, 1), block))
    if splits is None:
        target = 2 * _num_sms(dev) if dev.type == "cuda" else 1
        splits = min(nblk, max(1, _cdiv(target, R)))
    splits = max(1, min(int(splits), nblk))
    chunk = _cdiv(nblk, splits) * block
    splits = _cdiv(max(n_valid, 1), chunk)
    temp = _as(temperature, torch.float32)
    thr = _as(threshold, torch.float32) if threshold is not None else temp
    if threshold is None:
        lim = seeds  # never read
    elif tie_col is None:
        lim = torch.full((R,), S, dtype=torch.int64, device=dev)
    else:
        lim = _as(tie_col, torch.int64)
    parts = None
    if splits > 1:
        pm = torch.empty((R, splits), dtype=torch.float32, device=dev)
        parts = (pm, torch.empty_like(pm), torch.empty_like(pm),
                 torch.empty((R, splits), dtype=torch.int32, device=dev))
    ks.launch_stats(logits_shard, temp, thr, lim, _as(draft, torch.int64),
                    _as(seeds, torch.int64), _as(positions, torch.int64), out, parts, n_valid,
                    col_offset, chunk, splits,
                    threshold is not None, bool(exclude_draft), block, num_warps, width)
    return out


def shard_local_stats(
    logits_shard: torch.Tensor,
    temperature: torch.Tensor,
    threshold: torch.Tensor | None,
    draft: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    col_offset: int,
    vocab_size: int,
    exclude_draft: bool = True,
    backend: str = "auto",
    width: int = 4,
    tie_col: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dispatch: Triton on CUDA when available (``backend="auto"``), else fused torch.

    Per-row arguments (length ``rows``): ``temperature`` (0 = greedy),
    ``threshold`` (cut on ``z / T``; None = no cut), ``tie_col`` (last local
    column kept among values equal to the threshold; None = all), ``draft`` (global draft token
    id, -1 for none), ``seeds``/``positions`` (noise keys). ``exclude_draft``:
    exclude the row's draft token (when this shard owns it) from the Gumbel-max
    (the one-hot residual); False for probabilistic drafts. ``width``: 4, or 2
    when every row is greedy (only ``gval, gidx`` are exchanged then).
    """
    args = (logits_shard, temperature, threshold, draft, seeds, positions, col_offset,
            vocab_size, exclude_draft, width, tie_col)
    if use_triton(backend, logits_shard):
        return shard_local_stats_triton(*args)
    return shard_local_stats_torch(*args)
