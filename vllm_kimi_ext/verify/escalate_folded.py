"""The folded escalation (``StepPlan.escalation == "folded"``): the exact top-p / min-p cut of
the picked uncertified rows from one small all-gather, no whole row per escalated row.

Round 1 sends each rank's first ``W`` tokens of a row in the order (value desc, id asc) and
certifies the cut when it provably lies inside the merged candidates
(:func:`.step_torch.merge_round1_torch`). A row it cannot certify needs more of the order, not
the whole row: this escalation sends, per picked row (``E = plan.escalation_slots``, in the
whole-row escalation's slot order, every request's first row first) and rank, the **next**
``W2 = plan.folded_candidates`` tokens of that order, each as one int32 (its 16-bit ordered
value key in the high half, ``65535 - local column`` in the low half: the value and the id
exactly, in 4 bytes), and in the same all-gather the whole shard rows of the first
``F = plan.row_fallback_slots`` picked rows. Every rank then runs round 1's own merge and
certificate again over ``W + W2`` candidates per rank for the picked rows: a row it certifies
gets its kept set's statistics from the candidates (exact by the same argument as round 1);
the first ``F`` picked rows are also cut on their gathered whole rows (the ``"rows"``
escalation's cut); a row neither decides is **deferred** like a row without a slot (exact,
never approximated: it shortens speculation, see :mod:`.graph_step`). Bytes per rank:
``E x W2 x 4 + F x S x 2`` (:func:`.step_plan.folded_round_bytes`): 1,536 B per picked row at
the default ``W2 = 384`` against 40,960 B for a whole Kimi shard row.

Cost when no row escalates: the all-gather is issued (its shape is fixed, as a CUDA graph
needs) and every kernel of this escalation returns at once on its slot's ``real`` flag (read
on the device, no host sync): the selection of the further candidates reads a shard row only
for a picked row.

Not the default plan anywhere until measured (:data:`.step_plan.DEFAULT_ESCALATION`); it needs
16-bit logits and one-hot drafts (:func:`.step_plan.choose_escalation` refuses others). The
torch functions here are the reference bodies of :mod:`._folded_kernels` (Triton), which the
GPU path runs for bf16 logits.
"""

from __future__ import annotations

import dataclasses

import torch

from .step_hist import HALF_DTYPES, _whole_row_stats, key_values, ordered_key16
from .step_plan import STAT_COLUMNS, StepInputs, StepPlan, folded_round_bytes
from .step_torch import Merged, constant, merge_round1_torch, pick_slots

#: The int32 key of "no token" (a rank with fewer than ``W + W2`` valid columns).
SENT32 = -(2**31)
NEG_INF = float("-inf")


# ---------------------------------------------------------------------------
# the shard pass: the further candidates of the picked rows (torch twin of _folded_kernels)
# ---------------------------------------------------------------------------
def row_keys16(z: torch.Tensor, n_valid: int) -> torch.Tensor:
    """int64 ``[n, S]`` keys of 16-bit rows ``z``: ``(ordered value - 32768) * 65536 +
    (65535 - column)``, descending = (value desc, column asc); :data:`SENT32` past
    ``n_valid``. Needs ``S <= 65536``."""
    S = z.shape[1]
    cols = torch.arange(S, device=z.device)
    k = (ordered_key16(z) - 32768) * 65536 + (65535 - cols)[None, :]
    return torch.where((cols < n_valid)[None, :], k, torch.full_like(k, SENT32))


def further_candidates_torch(logits_shard: torch.Tensor, idx: torch.Tensor, first: int,
                             width: int, n_valid: int) -> torch.Tensor:
    """int32 ``[E, width]``: the keys of the tokens ranked ``first .. first + width - 1`` of
    each picked row ``idx`` of this shard, in (value desc, id asc) order (last = smallest)."""
    k = row_keys16(logits_shard.index_select(0, idx), n_valid)
    n = min(first + width, k.shape[1])
    top = torch.topk(k, n, dim=1).values
    if n < first + width:
        top = torch.cat([top, top.new_full((top.shape[0], first + width - n), SENT32)], dim=1)
    return top[:, first:].to(torch.int32)


def decode_keys(keys: torch.Tensor, t: torch.Tensor, shard_width: int,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Gathered keys ``[TP, E, n]`` -> round 1's candidate columns: values ``s = z / T``
    (float32, the same division as :func:`.reference.scale_logits`) and global ids as
    float32; ``(-inf, -1)`` for :data:`SENT32` and ``-inf`` values, as round 1 sends them."""
    k = keys.long()
    sent = k == SENT32
    z = key_values(((k >> 16) + 32768).clamp(0, 65535), dtype).float()
    safe = torch.where(t == 0, torch.ones_like(t), t).float()
    s = z / safe[None, :, None]
    bad = sent | (s == NEG_INF)
    rank = torch.arange(k.shape[0], device=k.device)[:, None, None]
    gid = (65535 - (k & 0xFFFF)) + rank * shard_width
    return (torch.where(bad, torch.full_like(s, NEG_INF), s),
            torch.where(bad, torch.full_like(gid, -1), gid).to(torch.float32))


# ---------------------------------------------------------------------------
# the merge of the picked rows over W + W2 candidates per rank
# ---------------------------------------------------------------------------
def slot_plan(plan: StepPlan) -> StepPlan:
    """Round 1's plan for the ``E`` picked rows with ``W + W2`` candidates per rank."""
    E = plan.escalation_slots
    return dataclasses.replace(plan, num_rows=E, num_reqs=E, max_rows_per_req=1,
                               candidates=plan.candidates + plan.folded_candidates,
                               escalation_slots=0, escalation="rows", row_fallback_slots=0,
                               folded_candidates=0)


def slot_inputs(inp: StepInputs, idx: torch.Tensor, real: torch.Tensor) -> StepInputs:
    """The picked rows' inputs; a slot without a real row gets temperature 0 (no cut: the
    merge does nothing for it)."""
    t = inp.temperature.index_select(0, idx)
    E = idx.shape[0]
    ar = torch.arange(E, device=idx.device)
    return StepInputs(
        cu_num_rows=torch.arange(E + 1, device=idx.device), draft=inp.draft.index_select(0, idx),
        req_of_row=ar, row_in_req=torch.zeros_like(ar),
        temperature=torch.where(real.bool(), t, torch.zeros_like(t)),
        seeds=inp.seeds.index_select(0, idx), positions=inp.positions.index_select(0, idx),
        top_k=inp.top_k.index_select(0, idx), min_p=inp.min_p.index_select(0, idx),
        top_p=inp.top_p.index_select(0, idx))


def slot_payload(g: torch.Tensor, idx: torch.Tensor, W: int, vals: torch.Tensor,
                 gids: torch.Tensor) -> torch.Tensor:
    """``[TP, E, 5 + 2 (W + W2)]`` float32: round 1's gathered payload of the picked rows
    with each rank's further candidates after its first ``W``."""
    g1 = g.index_select(1, idx).float()
    c = STAT_COLUMNS
    return torch.cat([g1[..., :c + W], vals, g1[..., c + W:c + 2 * W], gids], dim=2)


def apply_certified(merged: Merged, m2: Merged, idx: torch.Tensor, real: torch.Tensor,
                    deferred: torch.Tensor) -> torch.Tensor:
    """Copy the statistics of the picked rows the second merge certified into ``merged``;
    returns ``deferred`` (bool) with those rows cleared."""
    ok = real.bool() & ~m2.uncertified.bool()
    for dst, val in ((merged.gval, m2.gval), (merged.gidx, m2.gidx), (merged.lse, m2.lse),
                     (merged.sx, m2.sx), (merged.nucleus_margin, m2.nucleus_margin)):
        dst[idx] = torch.where(ok, val.to(dst.dtype), dst[idx])
    out = deferred.bool().clone()
    out[idx] = out[idx] & ~ok
    return out


# ---------------------------------------------------------------------------
# the exchange
# ---------------------------------------------------------------------------
def pack(keys: torch.Tensor, rows: torch.Tensor | None, nbytes: int) -> torch.Tensor:
    """``[1, nbytes]`` uint8: the keys, then the whole rows, then zero padding."""
    parts = [keys.contiguous().view(torch.uint8).reshape(-1)]
    if rows is not None:
        parts.append(rows.contiguous().view(torch.uint8).reshape(-1))
    pad = nbytes - sum(p.numel() for p in parts)
    if pad:
        parts.append(constant(pad, 0, torch.uint8, keys.device))
    return torch.cat(parts)[None]


def unpack(gb: torch.Tensor, E: int, W2: int, F: int, S: int, dtype: torch.dtype):
    """Gathered ``[TP, nbytes]`` uint8 -> (keys ``[TP, E, W2]`` int32, whole rows ``[TP, F,
    S]`` in ``dtype`` or None), views of ``gb``."""
    TP = gb.shape[0]
    keys = gb.view(torch.int32)[:, :E * W2].view(TP, E, W2)
    if not F:
        return keys, None
    off = E * W2 * 4 // torch.empty((), dtype=dtype).element_size()
    return keys, gb.view(dtype)[:, off:off + F * S].view(TP, F, S)


def escalate_folded(step, logits_shard: torch.Tensor, inp: StepInputs, plan: StepPlan,
                    merged: Merged, g: torch.Tensor, tri: bool) -> torch.Tensor:
    """The folded escalation of :class:`.graph_step.GraphVerifyStep` ``step`` (one-hot drafts):
    updates ``merged`` in place and returns the deferred rows (in the dtype of
    ``merged.uncertified``). ``g``: round 1's gathered payload. ``tri``: the Triton kernels
    (bf16 logits, shard width <= 65536), else the torch bodies."""
    if logits_shard.dtype not in HALF_DTYPES:
        raise ValueError(f"the folded escalation needs 16-bit logits, got {logits_shard.dtype}")
    S = step.shard_width
    if S > 65536:
        raise ValueError(f"the folded escalation needs shard width <= 65536, got {S}")
    if tri and logits_shard.dtype == torch.bfloat16:
        from . import _folded_kernels as fk

        return fk.escalate_folded_triton(step, logits_shard, inp, plan, merged, g)
    E, W, W2, F = (plan.escalation_slots, plan.candidates, plan.folded_candidates,
                   plan.row_fallback_slots)
    V, dev = step.vocab_size, logits_shard.device
    n_valid = max(0, min(S, V - step.col_offset))
    unc = merged.uncertified.bool()
    idx, real = pick_slots(unc, inp.row_in_req, E)
    keys = further_candidates_torch(logits_shard, idx, W, W2, n_valid)
    rows = logits_shard.index_select(0, idx[:F]) if F else None
    nbytes = folded_round_bytes(E, W2, F, S, logits_shard.element_size())
    gb = step.all_gather(pack(keys, rows, nbytes))[:, 0]
    gkeys, grows = unpack(gb, E, W2, F, S, logits_shard.dtype)
    sub = slot_inputs(inp, idx, real)
    vals, gids = decode_keys(gkeys, sub.temperature, S, logits_shard.dtype)
    m2 = merge_round1_torch(slot_payload(g, idx, W, vals, gids), sub, slot_plan(plan), V,
                            step.rank_valid(dev), None)
    deferred = apply_certified(merged, m2, idx, real, unc)
    if F:
        TP = grows.shape[0]
        full = grows.permute(1, 0, 2).reshape(F, TP * S)[:, :V]
        _whole_row_stats(full, idx[:F], real[:F], inp, merged, V,
                         "triton" if tri else "torch")
        deferred[idx[:F]] = deferred[idx[:F]] & ~real[:F]
    return deferred.to(merged.uncertified.dtype)
