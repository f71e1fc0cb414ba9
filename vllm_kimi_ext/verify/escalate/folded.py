"""The folded escalation (``StepPlan.escalation == "folded"``): the exact top-p / min-p cut of
the picked uncertified rows from one small all-gather, a whole shard row only for the first
``F`` of them.

Round 1 sends each rank's first ``W`` tokens of a row in the order (value desc, id asc) and
certifies the cut when it provably lies inside the merged candidates
(:mod:`..merge`). A row it cannot certify needs more of that order,
not the whole row. Of the ``E = plan.escalation_slots`` picked rows (the whole-row
escalation's slot order: every request's first row first) the first
``F = plan.row_fallback_slots`` are cut on their whole shard rows, as the ``"rows"``
escalation cuts every slot; for each other slot every rank sends the **next**
``W2 = plan.folded_candidates`` tokens of its shard in that order, each as one int32 (the
16-bit ordered value key in the high half, ``65535 - local column`` in the low half: value
and id exactly, in 4 bytes). Both go in **one** all-gather of
:func:`..protocol.folded_round_bytes` bytes per rank. Every rank then runs round 1's own merge
and certificate again over ``W + W2`` candidates per rank for those slots: a row it certifies
gets its kept set's statistics from the candidates (exact by round 1's argument); a row
neither decides is **deferred**, as a row without a slot is (exact, never approximated; it
shortens speculation, see :mod:`..graph_step`). With the defaults (``W2 = 384``, ``F = 1``)
an escalated row beyond the first costs 1,536 B per rank instead of a 40,960 B Kimi shard row.

When no row escalates: a plan with ``E <= F`` is the ``"rows"`` plan
(:func:`..protocol.folded_fields`), so the step is the whole-row step, launch for launch and
byte for byte. With ``E > F`` the launches are fixed (a CUDA graph needs it) and each one
returns at once for a slot without an uncertified row (read on the device, no host sync):
no shard row is read or copied for an empty slot (``tests/unit/test_verify_folded_counts.py``
counts both steps).

Needs 16-bit logits and one-hot drafts (:func:`..protocol.folded_fields` refuses others) and
shard width <= 65536.

:func:`resolve` is the variant: the torch bodies (any 16-bit logits) or, for bf16 logits on
the Triton path, the launchers (:func:`send_folded`, :func:`escalate_folded_triton`; kernels
in :mod:`.._kernels.escalate_folded`). Round 1's merge runs again through the step
(``rank.merge``, :meth:`..graph_step.GraphVerifyStep.merge`): an escalation variant imports
no other round. The whole-row slots are :mod:`.rows`'s cut.
"""

from __future__ import annotations

import dataclasses

import torch

from ..protocol import STAT_COLUMNS, StepPlan, folded_round_bytes
from ..ranks import ShardedRank
from ..step_io import Merged, StepInputs
from .rows import escalate_one_hot_triton, escalate_torch, pick_slots, pick_slots_triton

#: The int32 key of "no token" (a rank with fewer than ``W + W2`` valid columns).
SENT32 = -(2**31)
NEG_INF = float("-inf")
HALF_DTYPES = (torch.bfloat16, torch.float16)
#: Shard columns an int32 key can carry (16 bits).
MAX_SHARD_WIDTH = 65536
#: The send kernel's last program per key slot bisects for the rank keys (:func:`send_folded`)
#: instead of a top-k over every split's candidates: 85.0 -> 50.4 us per step on one H100
#: (k = 3, 16 rows, T = 1.0, real rows; ``bench/reports/profile_folded_h100.txt``).
SEND_SELECT = True


def ordered_key16(z: torch.Tensor) -> torch.Tensor:
    """int64 ordered key in ``[0, 65536)`` of 16-bit float ``z`` (``-0.0`` keyed as ``+0.0``)."""
    b = z.view(torch.int16).to(torch.int64)
    b = torch.where(b == -32768, torch.zeros_like(b), b)
    return (b ^ ((b >> 15) & 0x7FFF)) + 32768


def key_values(key: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The 16-bit float values (``dtype``) of ordered keys (inverse of :func:`ordered_key16`)."""
    o = key - 32768
    return (o ^ ((o >> 15) & 0x7FFF)).to(torch.int16).view(dtype)


# ---------------------------------------------------------------------------
# the shard pass: the further candidates of the picked rows (torch twin of the send kernel)
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
    (float32, the same division as :func:`.rowmath.scale_logits`) and global ids as
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
# the merge of the key slots over W + W2 candidates per rank
# ---------------------------------------------------------------------------
def slot_plan(plan: StepPlan, n: int) -> StepPlan:
    """Round 1's plan for ``n`` picked rows with ``W + W2`` candidates per rank."""
    return dataclasses.replace(plan, num_rows=n, num_reqs=n, max_rows_per_req=1,
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
    """``[TP, n, 5 + 2 (W + W2)]`` float32: round 1's gathered payload of the picked rows
    ``idx`` with each rank's further candidates after its first ``W``."""
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
# the exchange: [(E - F) x W2 int32 keys | F whole shard rows | padding] per rank
# ---------------------------------------------------------------------------
def unpack(gb: torch.Tensor, E: int, W2: int, F: int, S: int, dtype: torch.dtype):
    """Gathered ``[TP, nbytes]`` uint8 -> (keys ``[TP, E - F, W2]`` int32, whole rows
    ``[TP, F, S]`` in ``dtype`` or None), views of ``gb``."""
    TP = gb.shape[0]
    kb = (E - F) * W2 * 4
    keys = gb[:, :kb].view(torch.int32).view(TP, E - F, W2)
    if not F:
        return keys, None
    rb = F * S * torch.empty((), dtype=dtype).element_size()
    return keys, gb[:, kb:kb + rb].view(dtype).view(TP, F, S)


def check_folded(step, logits_shard: torch.Tensor) -> None:
    if logits_shard.dtype not in HALF_DTYPES:
        raise ValueError(f"the folded escalation needs 16-bit logits, got {logits_shard.dtype}")
    if step.shard_width > MAX_SHARD_WIDTH:
        raise ValueError("the folded escalation needs shard width <= "
                         f"{MAX_SHARD_WIDTH}, got {step.shard_width}")


def resolve(rank: ShardedRank, logits_shard: torch.Tensor, inp: StepInputs, plan: StepPlan,
            merged: Merged, q_full: torch.Tensor | None, *, g: torch.Tensor, scratch: dict,
            triton: bool) -> torch.Tensor:
    """The folded escalation of :class:`..graph_step.GraphVerifyStep` ``rank`` (one-hot
    drafts: ``q_full`` is None, :func:`..protocol.folded_fields` refuses others): updates
    ``merged`` in place and returns the deferred rows (in the dtype of
    ``merged.uncertified``). ``g``: round 1's gathered payload. ``triton``: the Triton
    kernels (bf16 logits), else the torch bodies; ``scratch``: the step's persistent
    buffers."""
    check_folded(rank, logits_shard)
    if triton and logits_shard.dtype == torch.bfloat16:
        return escalate_folded_triton(rank, logits_shard, inp, plan, merged, g, scratch)
    E, W, W2, F = (plan.escalation_slots, plan.candidates, plan.folded_candidates,
                   plan.row_fallback_slots)
    S, V, dev = rank.shard_width, rank.vocab_size, logits_shard.device
    n_valid = max(0, min(S, V - rank.col_offset))
    unc = merged.uncertified.bool()
    idx, real = pick_slots(unc, inp.row_in_req, E)
    kidx, kreal = idx[F:], real[F:]
    keys = further_candidates_torch(logits_shard, kidx, W, W2, n_valid)
    send = [keys.reshape(-1).view(torch.uint8),
            logits_shard.index_select(0, idx[:F]).reshape(-1).view(torch.uint8)]
    nbytes = folded_round_bytes(E, W2, F, S, logits_shard.element_size())
    pad = nbytes - sum(p.numel() for p in send)
    send.append(torch.zeros(pad, dtype=torch.uint8, device=dev))
    gb = rank.all_gather(torch.cat(send)[None])[:, 0]
    gkeys, grows = unpack(gb, E, W2, F, S, logits_shard.dtype)
    sub = slot_inputs(inp, kidx, kreal)
    vals, gids = decode_keys(gkeys, sub.temperature, S, logits_shard.dtype)
    m2 = rank.merge(slot_payload(g, kidx, W, vals, gids), sub, slot_plan(plan, E - F), None,
                    triton=False)
    deferred = apply_certified(merged, m2, kidx, kreal, unc)
    if F:
        # the first F slots: the "rows" escalation's cut on the gathered whole rows
        whole = dataclasses.replace(plan, escalation_slots=F, escalation="rows",
                                    row_fallback_slots=0, folded_candidates=0)
        left = escalate_torch(logits_shard, inp, whole, merged, lambda _t: grows, V, None,
                              "triton" if triton else "torch")
        deferred[idx[:F]] = left[idx[:F]]
    return deferred.to(merged.uncertified.dtype)


# ---------------------------------------------------------------------------
# Triton launchers (the kernels: _kernels/escalate_folded.py)
# ---------------------------------------------------------------------------

def _counters(store: dict, dev: torch.device, n: int) -> torch.Tensor:
    """The send kernel's persistent zeroed per-slot counters (each launch leaves them zeroed),
    kept in ``store`` (the step's, allocated by its first, eager call, before any capture)."""
    cur = store.get(str(dev))
    if cur is None or cur.shape[0] < n:
        if cur is not None:  # a captured graph may still use it: keep it alive
            store.setdefault("retired", []).append(cur)
        cur = store[str(dev)] = torch.zeros(max(n, 1), dtype=torch.int32, device=dev)
    return cur


def send_folded(store: dict, logits_shard, idx, real8, W: int, W2: int, F: int, n_valid: int,
                nbytes: int, fill: int | None = None,
                select: bool | None = None) -> torch.Tensor:
    """This rank's send buffer (``[1, nbytes]`` uint8: the key slots' further candidates,
    then the whole-row slots' shard rows) from one launch; empty slots write nothing
    (``fill``: the byte the buffer starts with, for tests; default uninitialised).
    ``store``: where the send kernel's counters persist (the step's folded scratch).
    ``select`` (default :data:`SEND_SELECT`): a key slot's last program finds its ranks
    ``W .. W + W2 - 1`` over the splits by bisecting for the two rank keys, else by one
    ``tl.topk`` over every split's first ``W + W2`` (the same keys)."""
    select = SEND_SELECT if select is None else bool(select)
    import triton

    from .._kernels import escalate_folded as kf

    E, S = idx.shape[0], logits_shard.shape[1]
    dev = logits_shard.device
    buf = (torch.empty(nbytes, dtype=torch.uint8, device=dev) if fill is None else
           torch.full((nbytes,), fill, dtype=torch.uint8, device=dev))
    kb = (E - F) * W2 * 4
    keys = buf[:kb].view(torch.int32)
    rows = buf[kb:kb + F * S * logits_shard.element_size()].view(logits_shard.dtype)
    KP = triton.next_power_of_2(W + W2)
    C = max(kf.CHUNK, KP)
    nsplit = max(1, triton.cdiv(max(S, 1), C))
    part = torch.empty((max(E - F, 1), nsplit, W + W2), dtype=torch.int32, device=dev)
    done = _counters(store, dev, E - F)
    with kf._LAUNCH_LOCK:
        kf._fold_send_kernel[(E, nsplit)](
            logits_shard, logits_shard.stride(0), idx, real8, part, done, keys, rows, S,
            n_valid, nsplit, F=F, W=W, W2=W2, WT=W + W2, C=C, KP=KP,
            PK=max(triton.next_power_of_2(nsplit * (W + W2)), KP), SELECT=select,
            P2=triton.next_power_of_2(W2), num_warps=8)
    return buf[None]


def escalate_folded_triton(step, logits_shard, inp, plan, merged, g, scratch: dict | None):
    """:func:`resolve` on the Triton kernels (bf16 logits); ``scratch``: the step's
    persistent buffers (the send kernel's counters under ``"folded"``, the whole-row
    slots' split escalation beside them)."""
    E, W, W2, F = (plan.escalation_slots, plan.candidates, plan.folded_candidates,
                   plan.row_fallback_slots)
    S, V = step.shard_width, step.vocab_size
    if logits_shard.stride(1) != 1:
        logits_shard = logits_shard.contiguous()
    n_valid = max(0, min(S, V - step.col_offset))
    idx, real8, deferred = pick_slots_triton(merged.uncertified, inp.row_in_req, E)
    nbytes = folded_round_bytes(E, W2, F, S, logits_shard.element_size())
    # no scratch: the one-program-per-row escalation switched on by the benchmark (fresh
    # zeroed counters then, as each launch leaves them)
    store = {} if scratch is None else scratch.setdefault("folded", {})
    buf = send_folded(store, logits_shard, idx, real8, W, W2, F, n_valid, nbytes)
    gb = step.all_gather(buf)[:, 0]
    gkeys, grows = unpack(gb, E, W2, F, S, logits_shard.dtype)
    if E > F:
        _merge_key_slots(step, g, gkeys, idx[F:], real8[F:], inp, plan, merged, deferred)
    if F:
        escalate_one_hot_triton(grows, idx[:F], real8[:F], inp, merged, V, deferred, scratch)
    return deferred


def _merge_key_slots(step, g, gkeys, kidx, kreal, inp, plan, merged, deferred) -> None:
    """Round 1's merge again over ``W + W2`` candidates per rank for the key slots; the rows
    it certifies are copied over ``merged`` and cleared in ``deferred``."""
    import triton

    from .._kernels import escalate_folded as kf

    n, W, W2 = kidx.shape[0], plan.candidates, plan.folded_candidates
    dev, TP, WT = g.device, gkeys.shape[0], W + W2
    g = g if g.dtype == torch.float32 and g.stride(2) == 1 else g.float().contiguous()
    g2 = torch.empty((TP, n, STAT_COLUMNS + 2 * WT), dtype=torch.float32, device=dev)
    i64 = dict(dtype=torch.int64, device=dev)
    f32 = dict(dtype=torch.float32, device=dev)
    sub = StepInputs(cu_num_rows=inp.cu_num_rows, draft=torch.empty(n, **i64),
                     req_of_row=kidx, row_in_req=kidx, temperature=torch.empty(n, **f32),
                     seeds=torch.empty(n, **i64), positions=torch.empty(n, **i64),
                     top_k=torch.empty(n, **i64), min_p=torch.empty(n, **f32),
                     top_p=torch.empty(n, **f32))
    with kf._LAUNCH_LOCK:
        kf._fold_build_kernel[(n,)](
            g, g.stride(0), g.stride(1), gkeys, gkeys.stride(0), kidx, kreal, inp.temperature,
            inp.top_k, inp.min_p, inp.top_p, inp.draft, inp.seeds, inp.positions,
            g2, g2.stride(0), g2.stride(1), sub.temperature, sub.top_k, sub.min_p, sub.top_p,
            sub.draft, sub.seeds, sub.positions, step.shard_width, TP=TP, W=W, W2=W2,
            PW=triton.next_power_of_2(W), PW2=triton.next_power_of_2(W2), num_warps=4)
    m2 = step.merge(g2, sub, slot_plan(plan, n), None, triton=True)
    with kf._LAUNCH_LOCK:
        kf._fold_apply_kernel[(n,)](kidx, kreal, m2.uncertified, m2.gval, m2.gidx, m2.lse, m2.sx,
                                 m2.nucleus_margin, merged.gval, merged.gidx, merged.lse,
                                 merged.sx, merged.nucleus_margin, deferred, num_warps=1)
