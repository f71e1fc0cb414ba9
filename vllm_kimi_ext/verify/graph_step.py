"""One vocabulary-sharded verification step per rank that a CUDA graph can hold.

:class:`GraphVerifyStep` makes the same decisions as the full-logits
:class:`~.reference.ReferenceVerifier` (and as the eager
:class:`~.sharded.VocabShardedVerifier`) for every mode the sharded verifier
supports (greedy, temperature, top-k, min-p, top-p, one-hot and probabilistic
drafts) with a fixed sequence of launches and collectives: no host
synchronisation and no data-dependent Python branch, so the whole step can be
captured once per shape and replayed.

Rounds (all-gathers of fixed-size payloads; see :class:`StepPlan`)
------------------------------------------------------------------
1. **Statistics + candidates.** Per row each rank sends ``5 + 2 W`` float32:
   the Gumbel-max ``(gval, gidx)`` over its shard (greedy rows: the argmax), the
   shard log-sum-exp in float64 (two float32 halves), ``s_x`` of the draft token
   if it owns it, and, when some row has a cut (top-k / min-p / top-p), its first
   ``W`` tokens in the order (value descending, id ascending) as ``W`` values and
   ``W`` global ids. Every rank merges the same ``[TP, rows, 5 + 2W]`` bytes.
   A row whose kept set (the min-p / top-k / top-p prefix) provably lies inside
   the merged candidates is *certified* (the test of :mod:`.cuts`): its nucleus,
   its log-sum-exp, the accept ratio of the draft and the Gumbel-max of the
   nucleus (the draft excluded for one-hot residuals; the residual
   ``max(0, p - q)`` for probabilistic drafts) are all computed from the
   candidates, with the same counter-based noise the reference uses. Rows
   without a cut use the statistics directly. So a step whose rows are all
   certified needs this one collective.
2. **Escalation** (only when some row can be uncertified: top-p or min-p
   without top-k). A fixed number ``E`` of slots; each rank sends its whole
   shard row (the logits' own dtype) for the uncertified rows picked on the
   device, in order of (row within request, row): every request's first row
   first. On the gathered full rows the cut is exact by construction (a sort),
   and the statistics of those rows replace the round-1 ones. ``E`` is at least
   the number of requests, so every request's first row always has a slot.
   An uncertified row left without a slot is *deferred*: if the verification
   reaches it (every earlier draft of its request accepted) the step emits the
   accepted drafts up to it and no token at it (the next step verifies that
   position again with fresh drafts). Whether a row is deferred depends on the
   logits alone, never on the random draws, and the noise of a position is a
   pure function of ``(seed, position)`` that is not consumed by a deferred
   row, so a deferral shortens speculation without changing any output
   distribution. It needs ``j >= 1`` accepted drafts before the row, which the
   slot order guarantees.
3. **Residual** (only with probabilistic drafts and sampling rows without a
   cut): the per-shard Gumbel-max of ``max(0, p - q)`` at each request's
   decision row, 8 bytes per request (as in :class:`~.sharded.VocabShardedVerifier`).

The decisions (first rejection, recovered / bonus token, deferral) are made by
one program per request from the merged per-row statistics.

Two implementations of round 1's shard pass and merge share this module's
contract: fused torch (any device; the CPU tier runs it) and Triton
(:mod:`._graph_kernels`, split-row: many programs per row at small batches).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .batch import RowLayout
from .cuts import LSE_COLUMNS, join_float64, local_top, split_float64
from .hashing import DOMAIN_GUMBEL, element_hash, gumbel_from_bits, row_keys
from .kernels import merge_argmax, shard_local_stats, triton_available
from .reference import exclusive_cumsum, min_p_threshold, nucleus_margin, residual_log_weights
from .sharded import AllGather, ShardedRank

NEG_INF = float("-inf")

#: Round-1 columns before the candidates: gval, gidx, lse (hi, lo), s_x.
STAT_COLUMNS = 5
#: Candidates per rank and row when a cut is present (at least the largest top-k).
DEFAULT_CANDIDATES = 128
FLOAT_BYTES = 4


# ---------------------------------------------------------------------------
# inputs and the one host-side plan
# ---------------------------------------------------------------------------
@dataclass
class StepInputs:
    """Per-row device tensors of one step (fixed shapes; built without host reads)."""

    #: int64 [num_reqs + 1]
    cu_num_rows: torch.Tensor
    #: int64 [rows]: draft verified at each row, -1 on bonus rows / placeholders.
    draft: torch.Tensor
    req_of_row: torch.Tensor
    row_in_req: torch.Tensor
    temperature: torch.Tensor  # float32 [rows], 0 = greedy
    seeds: torch.Tensor  # int64 [rows]
    positions: torch.Tensor  # int64 [rows]
    top_k: torch.Tensor  # int64 [rows], 0 = off (greedy rows off)
    min_p: torch.Tensor  # float32 [rows], 0 = off
    top_p: torch.Tensor  # float32 [rows], 1 = off

    @property
    def num_rows(self) -> int:
        return int(self.draft.shape[0])

    @property
    def num_reqs(self) -> int:
        return int(self.cu_num_rows.shape[0]) - 1

    @staticmethod
    def from_layout(L: RowLayout, vocab_size: int) -> StepInputs:
        """From a :class:`~.batch.RowLayout` (tests, benchmarks)."""
        r = L.req_of_row
        return StepInputs(
            cu_num_rows=L.cu_num_rows, draft=L.draft, req_of_row=r, row_in_req=L.row_in_req,
            temperature=L.temperature, seeds=L.seeds, positions=L.positions,
            top_k=L.effective_top_k(vocab_size)[r], min_p=L.effective_min_p()[r],
            top_p=L.effective_top_p()[r])

    @staticmethod
    def from_requests(cu_num_rows: torch.Tensor, draft: torch.Tensor, temperature: torch.Tensor,
                      seeds: torch.Tensor, positions: torch.Tensor, top_k: torch.Tensor,
                      min_p: torch.Tensor, top_p: torch.Tensor, vocab_size: int) -> StepInputs:
        """From per-request parameters and per-row drafts/positions, with device ops only
        (``searchsorted`` instead of ``repeat_interleave``): safe inside graph capture.
        ``draft`` must already be -1 on bonus rows."""
        cu = cu_num_rows.long()
        R = draft.shape[0]
        rows = torch.arange(R, device=draft.device)
        req = torch.searchsorted(cu[1:], rows, right=True).clamp(max=cu.shape[0] - 2)
        t = temperature.float()[req]
        greedy = t == 0
        k = top_k.long()[req]
        k = torch.where(greedy | (k >= vocab_size) | (k < 0), torch.zeros_like(k), k)
        mp = torch.where(greedy, torch.zeros_like(t), min_p.float()[req])
        tp = torch.where(greedy, torch.ones_like(t), top_p.float()[req])
        return StepInputs(cu_num_rows=cu, draft=draft.long(), req_of_row=req,
                          row_in_req=rows - cu[req], temperature=t, seeds=seeds.long()[req],
                          positions=positions.long(), top_k=k, min_p=mp, top_p=tp)


@dataclass(frozen=True)
class Round:
    """One all-gather of a step: every rank sends ``rows x width`` elements."""

    name: str
    rows: int
    width: int
    element_bytes: int = FLOAT_BYTES

    @property
    def bytes_per_rank(self) -> int:
        return self.rows * self.width * self.element_bytes


@dataclass(frozen=True)
class StepPlan:
    """Everything host-side a step needs: shapes, widths and the collectives it issues.

    Built once per distinct batch shape from facts the host already has (the
    requests' sampling parameters), never from device data; the graph of a step
    is keyed by it.
    """

    tp_size: int
    num_rows: int
    num_reqs: int
    max_rows_per_req: int
    #: Candidates per rank and row in round 1 (0: no row has a cut).
    candidates: int
    #: Escalation slots (0: no row can be uncertified).
    escalation_slots: int
    #: Every row is greedy: round 1 sends only (max, argmax).
    all_greedy: bool
    #: Probabilistic drafts and sampling rows without a cut: the residual round runs.
    residual_round: bool
    probabilistic: bool
    shard_width: int
    logits_bytes: int = 2

    @property
    def stats_only(self) -> bool:
        """No cut and one-hot drafts: round 1 is the statistics alone and the decision
        merges them directly (``(gval, gidx)``, + ``(lse, s_x)`` when sampling)."""
        return self.candidates == 0 and not self.probabilistic

    @property
    def round1_width(self) -> int:
        if self.all_greedy:
            return 2
        if self.stats_only:
            return 4
        return STAT_COLUMNS + 2 * self.candidates

    @property
    def rounds(self) -> tuple[Round, ...]:
        out = [Round("stats" if self.stats_only else "stats+candidates", self.num_rows,
                     self.round1_width)]
        if self.escalation_slots:
            out.append(Round("escalation", self.escalation_slots, self.shard_width,
                             self.logits_bytes))
        if self.residual_round:
            out.append(Round("residual", self.num_reqs, 2))
        return tuple(out)

    @property
    def collectives(self) -> tuple[Round, ...]:
        """The rounds (the name the eager verifier's plan uses)."""
        return self.rounds

    @property
    def num_collectives(self) -> int:
        return len(self.rounds)

    @property
    def bytes_sent_per_rank(self) -> int:
        return sum(r.bytes_per_rank for r in self.rounds)

    @property
    def bytes_per_row_per_rank(self) -> float:
        return self.bytes_sent_per_rank / max(self.num_rows, 1)

    def describe(self) -> str:
        parts = [f"{r.name}[{r.rows}x{r.width}]" for r in self.rounds]
        return (f"{len(self.rounds)} all-gather(s): " + ", ".join(parts)
                + f"; {self.bytes_sent_per_rank} B sent/rank")


def plan_step(*, tp_size: int, shard_width: int, num_rows: int, num_reqs: int,
              max_rows_per_req: int, all_greedy: bool, any_cut: bool, max_top_k: int = 0,
              may_escalate: bool = False, probabilistic: bool = False,
              any_uncut_sampling: bool = False, candidates: int | None = None,
              escalation_slots: int | None = None, logits_bytes: int = 2) -> StepPlan:
    """The step plan from host-known facts of the batch.

    ``any_cut``: some sampling row has top-k, min-p or top-p; ``max_top_k``: the
    largest top-k (the candidates must hold it); ``may_escalate``: some row has
    top-p or min-p without top-k (its kept set may exceed the candidates);
    ``any_uncut_sampling``: some sampling row has no cut (probabilistic drafts then
    need the residual round). ``escalation_slots`` defaults to the number of
    requests (every request's first row has a slot).
    """
    w = 0
    if any_cut and not all_greedy:
        w = max(candidates or DEFAULT_CANDIDATES, max_top_k)
        w = min(w, shard_width)
    e = 0
    if may_escalate and not all_greedy:
        e = max(num_reqs, escalation_slots or 0)
        e = min(e, num_rows)
    return StepPlan(tp_size=tp_size, num_rows=num_rows, num_reqs=num_reqs,
                    max_rows_per_req=max_rows_per_req, candidates=w, escalation_slots=e,
                    all_greedy=all_greedy,
                    residual_round=probabilistic and not all_greedy and any_uncut_sampling,
                    probabilistic=probabilistic, shard_width=shard_width,
                    logits_bytes=logits_bytes)


def plan_for_layout(L: RowLayout, *, tp_size: int, shard_width: int, vocab_size: int,
                    probabilistic: bool = False, candidates: int | None = None,
                    escalation_slots: int | None = None, logits_bytes: int = 2) -> StepPlan:
    """:func:`plan_step` from a :class:`~.batch.RowLayout` (reads its host modes once)."""
    m = L.host_modes(vocab_size)
    r = L.req_of_row
    k = L.effective_top_k(vocab_size)[r]
    mp = L.effective_min_p()[r]
    tp = L.effective_top_p()[r]
    sampling = L.temperature > 0
    cut = sampling & ((k > 0) | (mp > 0) | (tp < 1))
    return plan_step(
        tp_size=tp_size, shard_width=shard_width, num_rows=L.num_rows, num_reqs=L.num_reqs,
        max_rows_per_req=L.max_rows_per_req, all_greedy=m.all_greedy,
        any_cut=bool(cut.any()), max_top_k=int(k.max()) if L.num_rows else 0,
        may_escalate=bool((cut & (k == 0) & ((tp < 1) | (mp > 0))).any()),
        probabilistic=probabilistic, any_uncut_sampling=bool((sampling & ~cut).any()),
        candidates=candidates, escalation_slots=escalation_slots, logits_bytes=logits_bytes)


@dataclass
class StepOutput:
    """vLLM's ``(sampled, num_sampled)`` plus diagnostics (all device tensors)."""

    sampled: torch.Tensor  # int64 [num_reqs, max_rows_per_req], -1 padded
    num_sampled: torch.Tensor  # int32 [num_reqs]
    #: float32 [rows]: accept margin (see :class:`~.batch.VerifyOutput`); NaN on greedy rows.
    accept_margin: torch.Tensor
    #: float64 [rows]: nucleus margin (NaN without top-p).
    nucleus_margin: torch.Tensor
    #: [rows], bool (int8 on the Triton path): the cut was not certified by round 1.
    uncertified: torch.Tensor
    #: [rows], bool or int8: uncertified and no escalation slot.
    deferred: torch.Tensor
    #: [num_reqs], bool or int8: this request stopped at a deferred row.
    stopped: torch.Tensor

    def tokens(self) -> list[list[int]]:
        return [row[:n] for row, n in zip(self.sampled.tolist(), self.num_sampled.tolist())]


# ---------------------------------------------------------------------------
# round 1: the shard pass (torch; Triton in _graph_kernels)
# ---------------------------------------------------------------------------
def _logq_at(q_full: torch.Tensor | None, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """log q at ids ``[rows, n]`` (0 where ``q_full`` is None: one-hot drafts)."""
    if q_full is None:
        return torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
    q = q_full[:, :vocab_size].float().gather(1, ids.clamp(0, vocab_size - 1))
    return torch.log(q)


def round1_payload_torch(logits_shard: torch.Tensor, inp: StepInputs, plan: StepPlan,
                         col_offset: int, vocab_size: int,
                         q_full: torch.Tensor | None) -> torch.Tensor:
    """This rank's round-1 payload ``[rows, plan.round1_width]`` float32."""
    R, S = logits_shard.shape
    dev = logits_shard.device
    n_valid = max(0, min(S, vocab_size - col_offset))
    exclude = q_full is None
    st = shard_local_stats(logits_shard, inp.temperature, None, inp.draft, inp.seeds,
                           inp.positions, col_offset, vocab_size, exclude_draft=exclude,
                           backend="torch", width=4)
    if plan.all_greedy:
        return st[:, :2].contiguous()
    out = torch.full((R, plan.round1_width), NEG_INF, dtype=torch.float32, device=dev)
    out[:, :2] = st[:, :2]
    from .reference import scale_logits

    s = scale_logits(logits_shard, inp.temperature)
    cols = torch.arange(S, device=dev)
    s = s.masked_fill((cols >= n_valid)[None, :], NEG_INF)
    sampling = inp.temperature > 0
    lse = torch.logsumexp(s.double(), dim=1)
    lse = torch.where(sampling, lse, torch.full_like(lse, NEG_INF))
    out[:, 2:2 + LSE_COLUMNS] = split_float64(lse)
    sx = st[:, 3]
    if q_full is not None:
        sx = sx - _logq_at(q_full, inp.draft[:, None], vocab_size)[:, 0]
    out[:, 4] = sx
    W = plan.candidates
    if W:
        vals, lcols = local_top(s, W)
        ok = (lcols >= 0) & (vals > NEG_INF)
        out[:, STAT_COLUMNS:STAT_COLUMNS + W] = torch.where(ok, vals, NEG_INF)
        gid = torch.where(ok, lcols + col_offset, torch.full_like(lcols, -1))
        out[:, STAT_COLUMNS + W:] = gid.to(torch.float32)
    return out


# ---------------------------------------------------------------------------
# round 1: the merge (identical on every rank)
# ---------------------------------------------------------------------------
@dataclass
class Merged:
    """Per-row merged statistics, the input of the decision."""

    gval: torch.Tensor  # float32: best Gumbel score (sampling) / max (greedy)
    gidx: torch.Tensor  # int64: its token
    lse: torch.Tensor  # float32: log-sum-exp of the kept set
    sx: torch.Tensor  # float32: s_x - log q(x) if x is kept, else -inf
    res_tok: torch.Tensor  # int64: residual sample (probabilistic drafts), -1 if none
    uncertified: torch.Tensor  # bool
    nucleus_margin: torch.Tensor  # float64
    #: int64: size of the kept set (rows with a cut; -1 elsewhere). Diagnostic only.
    n_kept: torch.Tensor | None = None
    #: float32: the row's maximum of ``z / T`` (rows with a cut; the Triton merge only,
    #: read by the split escalation).
    row_max: torch.Tensor | None = None


def _gumbel_at(seeds: torch.Tensor, positions: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Gumbel noise of global ``ids [rows, n]`` (the reference's numbers)."""
    h1, h2 = row_keys(seeds, positions, DOMAIN_GUMBEL)
    return gumbel_from_bits(element_hash(h1[:, None], h2[:, None], ids.clamp(min=0)))


def _argmax_lowest_id(score: torch.Tensor, ids: torch.Tensor):
    """Best score per row and the lowest id among entries attaining it."""
    best = score.max(dim=1).values
    big = torch.iinfo(torch.int64).max
    tok = torch.where(score == best[:, None], ids, torch.full_like(ids, big)).min(dim=1).values
    return best, torch.where(tok == big, torch.full_like(tok, -1), tok)


def merge_round1_torch(g: torch.Tensor, inp: StepInputs, plan: StepPlan, vocab_size: int,
                       rank_valid: torch.Tensor, q_full: torch.Tensor | None) -> Merged:
    """Merge ``g [TP, rows, width]`` (every rank computes the same result).

    Long because: it is the readable reference of ``_graph_kernels._merge_kernel`` and keeps
    the kernel's steps in the kernel's order (statistics, candidate sort, exact prefix, cut,
    certificate, kept-set decisions), so the two can be compared line by line."""
    TP, R, _ = g.shape
    dev = g.device
    best, tok = merge_argmax(g[..., 0], g[..., 1])
    nan64 = torch.full((R,), float("nan"), dtype=torch.float64, device=dev)
    none = torch.full((R,), -1, dtype=torch.int64, device=dev)
    no = torch.zeros(R, dtype=torch.bool, device=dev)
    if plan.all_greedy:
        neg = torch.full((R,), NEG_INF, device=dev)
        return Merged(best, tok, neg, neg, none, no, nan64, none)
    lse_all = torch.logsumexp(join_float64(g[..., 2:2 + LSE_COLUMNS]), dim=0)
    sx = g[..., 4].max(dim=0).values
    merged = Merged(best, tok, lse_all.float(), sx, none, no, nan64, none)
    W = plan.candidates
    if not W:
        return merged
    vals = g[..., STAT_COLUMNS:STAT_COLUMNS + W]  # [TP, R, W]
    gids = g[..., STAT_COLUMNS + W:].round().long()
    flat = vals.permute(1, 0, 2).reshape(R, TP * W)
    fid = gids.permute(1, 0, 2).reshape(R, TP * W)
    # rank-major and each rank in (value desc, id asc): a stable sort on the value
    # gives (value desc, id asc) because ranks own increasing id ranges.
    sv, order = torch.sort(flat, dim=1, descending=True, stable=True)
    sid = fid.gather(1, order)
    pos = torch.arange(TP * W, device=dev)
    finite = sv > NEG_INF
    inv = torch.empty_like(order)
    inv.scatter_(1, order, pos.expand(R, -1).contiguous())
    last_pos = inv[:, torch.arange(TP, device=dev) * W + (W - 1)]  # [R, TP]
    full = (vals[:, :, W - 1].T > NEG_INF) & ~(W >= rank_valid)[None, :]
    unbounded = TP * W + 1
    exact_len = torch.where(full, last_pos + 1,
                            torch.full_like(last_pos, unbounded)).min(dim=1).values
    k, mp, tp = inp.top_k, inp.min_p, inp.top_p.double()
    cutv = min_p_threshold(sv[:, 0], mp)
    n_minp = ((sv >= cutv[:, None]) & finite).sum(dim=1)
    has_k = k > 0
    n_kept = torch.where(has_k, torch.minimum(n_minp, k), n_minp)
    bounded = has_k | (mp > 0)
    nucleus = tp < 1
    # top-p over the candidate set (bounded: the min-p/top-k prefix; else every token,
    # normalised by the shard log-sum-exps)
    cand = torch.where(bounded[:, None], pos[None, :] < n_kept[:, None], finite)
    w = torch.where(cand, sv.double(), torch.full_like(sv, NEG_INF, dtype=torch.float64))
    norm = torch.where(bounded, torch.logsumexp(w, dim=1), lse_all)
    prob = torch.exp(w - norm[:, None])
    before, cum = exclusive_cumsum(prob)
    n_nuc = ((before < tp[:, None]) & cand).sum(dim=1).clamp(min=1)
    through = cum.gather(1, (n_nuc - 1)[:, None]).squeeze(1)
    walk_ok = (exact_len == unbounded) | ((through >= tp) & (n_nuc <= exact_len))
    known = has_k | (n_minp < exact_len)
    cert_p = torch.where(bounded, known, walk_ok)
    certified = torch.where(nucleus, cert_p, known)
    n_kept = torch.where(nucleus, n_nuc, n_kept)
    margin = torch.where(nucleus, nucleus_margin(before, cum, tp, n_nuc), nan64)
    kept = (pos[None, :] < n_kept[:, None]) & finite
    x = inp.draft
    is_x = (sid == x[:, None]) & (x[:, None] >= 0)
    lse_c = torch.logsumexp(torch.where(kept, sv, NEG_INF), dim=1)
    sx_c = torch.where(kept & is_x, sv, NEG_INF).max(dim=1).values
    noise = _gumbel_at(inp.seeds, inp.positions, sid)
    if q_full is None:
        score = torch.where(kept & ~is_x, sv + noise, NEG_INF)
        res_tok = none
    else:
        logq = _logq_at(q_full, sid, vocab_size)
        sx_c = sx_c - _logq_at(q_full, x[:, None], vocab_size)[:, 0]
        score = torch.where(kept, sv + noise, NEG_INF)
        res = residual_log_weights(sv - lse_c[:, None], logq)
        rbest, rtok = _argmax_lowest_id(torch.where(kept, res + noise, NEG_INF), sid)
        res_tok = torch.where(rbest > NEG_INF, rtok, none)
    cbest, ctok = _argmax_lowest_id(score, sid)
    has_cut = (inp.temperature > 0) & (has_k | (mp > 0) | nucleus)
    return Merged(
        gval=torch.where(has_cut, cbest, merged.gval),
        gidx=torch.where(has_cut, ctok, merged.gidx),
        lse=torch.where(has_cut, lse_c, merged.lse),
        sx=torch.where(has_cut, sx_c, merged.sx),
        res_tok=torch.where(has_cut, res_tok, none),
        uncertified=has_cut & ~certified,
        nucleus_margin=torch.where(has_cut, margin, nan64),
        n_kept=torch.where(has_cut, n_kept, none),
    )


# ---------------------------------------------------------------------------
# round 2: escalation on whole rows
# ---------------------------------------------------------------------------
def pick_slots(uncertified: torch.Tensor, row_in_req: torch.Tensor, slots: int):
    """``slots`` uncertified rows in (row within request, row) order, and which are real."""
    R = uncertified.shape[0]
    big = torch.iinfo(torch.int64).max // 4
    key = torch.where(uncertified, row_in_req * (R + 1) + torch.arange(R, device=row_in_req.device),
                      torch.full_like(row_in_req, big))
    top = torch.topk(-key, slots, dim=0)
    return top.indices, (-top.values) < big


def exact_cut(s: torch.Tensor, top_k: torch.Tensor, min_p: torch.Tensor, top_p: torch.Tensor):
    """The exact ``(threshold, tie_col)`` of whole rows ``s [n, V]`` (no host reads) and
    the nucleus margin: the kept prefix in (value desc, id asc) order."""
    n, V = s.shape
    sv, sid = torch.sort(s, dim=1, descending=True, stable=True)
    pos = torch.arange(V, device=s.device)
    finite = sv > NEG_INF
    cutv = min_p_threshold(sv[:, 0], min_p)
    n_kept = ((sv >= cutv[:, None]) & finite).sum(dim=1)
    n_kept = torch.where(top_k > 0, torch.minimum(n_kept, top_k), n_kept)
    tp = top_p.double()
    cand = pos[None, :] < n_kept[:, None]
    w = torch.where(cand, sv.double(), torch.full_like(sv, NEG_INF, dtype=torch.float64))
    prob = torch.exp(w - torch.logsumexp(w, dim=1, keepdim=True))
    before, cum = exclusive_cumsum(prob)
    n_nuc = ((before < tp[:, None]) & cand).sum(dim=1).clamp(min=1)
    nucleus = tp < 1
    margin = torch.where(nucleus, nucleus_margin(before, cum, tp, n_nuc),
                         torch.full_like(tp, float("nan")))
    n_kept = torch.where(nucleus, n_nuc, n_kept).clamp(min=1)
    last = (n_kept - 1)[:, None]
    return sv.gather(1, last).squeeze(1), sid.gather(1, last).squeeze(1), margin


def escalate(logits_shard: torch.Tensor, inp: StepInputs, plan: StepPlan, merged: Merged,
             all_gather: AllGather, vocab_size: int, q_full: torch.Tensor | None,
             backend: str, scratch: dict | None = None) -> torch.Tensor:
    """Round 2: whole rows for the picked uncertified rows; updates ``merged`` in place.
    Returns the deferred rows (uncertified, no slot). ``scratch``: the step's persistent
    buffers of the split bf16 escalation (without it, the one-program-per-row kernel)."""
    E = plan.escalation_slots
    if backend == "triton" and q_full is None:
        from . import _graph_kernels as gk

        idx, real8, deferred = gk.pick_slots(merged.uncertified, inp.row_in_req, E)
        g = all_gather(logits_shard.index_select(0, idx))  # [TP, E, S]
        return gk.escalate_one_hot(g, idx, real8, inp, merged, vocab_size, deferred, scratch)
    idx, real = pick_slots(merged.uncertified, inp.row_in_req, E)
    rows = logits_shard.index_select(0, idx)
    g = all_gather(rows.contiguous())  # [TP, E, S]
    TP, _, S = g.shape
    full = g.permute(1, 0, 2).reshape(E, TP * S)[:, :vocab_size]
    from .reference import scale_logits

    t = inp.temperature[idx]
    # probabilistic drafts (and the torch backend): the whole-row cut by a sort
    thr, tie, margin = exact_cut(scale_logits(full, t), inp.top_k[idx], inp.min_p[idx],
                                 inp.top_p[idx])
    st = shard_local_stats(full, t, thr, inp.draft[idx], inp.seeds[idx], inp.positions[idx], 0,
                           vocab_size, exclude_draft=q_full is None, backend=backend, width=4,
                           tie_col=tie)
    sx = st[:, 3]
    res_tok = torch.full_like(idx, -1)
    if q_full is not None:
        s = scale_logits(full, t)
        q = q_full[idx, :vocab_size].float()
        x = inp.draft[idx]
        sx = sx - _logq_at(q_full.index_select(0, idx), x[:, None], vocab_size)[:, 0]
        keep = (s > thr[:, None]) | ((s == thr[:, None]) & (
            torch.arange(vocab_size, device=s.device)[None, :] <= tie[:, None]))
        sm = torch.where(keep, s, NEG_INF)
        res = residual_log_weights(sm - st[:, 2:3], torch.log(q))
        ids = torch.arange(vocab_size, device=s.device).expand(E, -1)
        rbest, rtok = _argmax_lowest_id(res + _gumbel_at(inp.seeds[idx], inp.positions[idx], ids),
                                        ids)
        res_tok = torch.where(rbest > NEG_INF, rtok, res_tok)

    def put(dst: torch.Tensor, val: torch.Tensor) -> None:
        dst[idx] = torch.where(real, val.to(dst.dtype), dst[idx])

    put(merged.gval, st[:, 0])
    put(merged.gidx, st[:, 1].round().long())
    put(merged.lse, st[:, 2])
    put(merged.sx, sx)
    put(merged.res_tok, res_tok)
    put(merged.nucleus_margin, margin)
    assigned = torch.zeros_like(merged.uncertified)
    assigned[idx] = real
    return merged.uncertified & ~assigned


# ---------------------------------------------------------------------------
# decision
# ---------------------------------------------------------------------------
def decide_merged_torch(merged: Merged, deferred: torch.Tensor, inp: StepInputs,
                        plan: StepPlan, vocab_size: int):
    """First rejection (or deferral) per request; returns ``(sampled, num_sampled,
    decision_row, accept_margin, stopped)``."""
    from .hashing import accept_uniform

    R, Lmax = plan.num_rows, plan.max_rows_per_req
    dev = merged.gval.device
    x = inp.draft
    greedy = inp.temperature == 0
    valid = (x >= 0) & (x < vocab_size)
    log_u = torch.log(accept_uniform(inp.seeds, inp.positions))
    margin = (merged.sx - merged.lse) - log_u
    accept = torch.where(greedy, valid & (merged.gidx == x), valid & (margin > 0))
    lens = inp.cu_num_rows[1:] - inp.cu_num_rows[:-1]
    bonus = inp.row_in_req == (lens[inp.req_of_row] - 1)
    accept = accept & ~bonus & ~deferred
    steps = torch.arange(Lmax, device=dev)
    idx = (inp.cu_num_rows[:-1, None] + steps[None, :]).clamp(max=max(R - 1, 0))
    in_req = steps[None, :] < lens[:, None]
    acc = accept[idx] & in_req
    n_acc = torch.cumprod(acc.long(), dim=1).sum(dim=1)
    drow = inp.cu_num_rows[:-1] + n_acc
    stopped = deferred[drow.clamp(max=max(R - 1, 0))] & (n_acc < lens)
    tok = merged.gidx[drow]  # argmax on greedy rows, the Gumbel-max on sampling rows
    if plan.probabilistic:
        use_res = (merged.res_tok[drow] >= 0) & valid[drow] & ~greedy[drow]
        tok = torch.where(use_res, merged.res_tok[drow], tok)
    drafts = x[idx]
    sampled = torch.where(steps[None, :] < n_acc[:, None], drafts, torch.full_like(drafts, -1))
    dec = torch.where(stopped, torch.full_like(tok, -1), tok)
    sampled.scatter_(1, n_acc.clamp(max=Lmax - 1)[:, None], dec[:, None])
    sampled = torch.where(steps[None, :] < (n_acc + (~stopped).long())[:, None], sampled,
                          torch.full_like(sampled, -1))
    num_sampled = (n_acc + (~stopped).long()).to(torch.int32)
    margin = torch.where(greedy, torch.full_like(margin, float("nan")), margin)
    return sampled, num_sampled, drow, margin, stopped


# ---------------------------------------------------------------------------
# the step
# ---------------------------------------------------------------------------
_CONSTANTS: dict = {}


def constant(n: int, value, dtype: torch.dtype, device) -> torch.Tensor:
    """A cached read-only ``[n]`` tensor filled with ``value``, made on first use (the
    eager warm-up, before any capture): a captured step reads it with no fill launch."""
    key = (n, value if value == value else "nan", dtype, str(device))
    if key not in _CONSTANTS:
        _CONSTANTS[key] = torch.full((n,), value, dtype=dtype, device=device)
    return _CONSTANTS[key]


class GraphVerifyStep(ShardedRank):
    """The per-rank verification step (see the module docstring).

    ``all_gather(t [rows, n]) -> [TP, rows, n]`` (any dtype). ``backend``:
    ``"torch"``, ``"triton"`` or ``"auto"`` (Triton for CUDA tensors when available).
    Call :meth:`run` eagerly or inside ``torch.cuda.graph`` capture; it reads no
    device value on the host.
    """

    def __init__(self, vocab_size: int, tp_size: int, rank: int, all_gather: AllGather,
                 shard_width: int | None = None, backend: str = "auto"):
        super().__init__(vocab_size, tp_size, rank, all_gather, shard_width, backend)
        self._rank_valid: dict[torch.device, torch.Tensor] = {}
        #: Persistent buffers of the split escalation (see ``_escalate_kernels``).
        self._escalation_scratch: dict = {}

    def rank_valid(self, device: torch.device) -> torch.Tensor:
        if device not in self._rank_valid:
            self._rank_valid[device] = torch.tensor(self.shard_lengths(), device=device)
        return self._rank_valid[device]

    def plan(self, L: RowLayout, probabilistic: bool = False, logits_bytes: int = 2,
             **kw) -> StepPlan:
        return plan_for_layout(L, tp_size=self.tp_size, shard_width=self.shard_width,
                               vocab_size=self.vocab_size, probabilistic=probabilistic,
                               logits_bytes=logits_bytes, **kw)

    def _triton(self, t: torch.Tensor) -> bool:
        return self.backend == "triton" or (
            self.backend == "auto" and t.is_cuda and triton_available())

    def run(self, logits_shard: torch.Tensor, inp: StepInputs, plan: StepPlan,
            q_full: torch.Tensor | None = None) -> StepOutput:
        V, off = self.vocab_size, self.col_offset
        if tuple(logits_shard.shape) != (plan.num_rows, self.shard_width):
            raise ValueError(f"expected logits shard [{plan.num_rows}, {self.shard_width}], "
                             f"got {tuple(logits_shard.shape)}")
        if (q_full is not None) != plan.probabilistic:
            raise ValueError("q_full must be given exactly when the plan is probabilistic")
        tri = self._triton(logits_shard)
        if plan.stats_only:
            return self._stats_only(logits_shard, inp, plan, tri)
        if tri:
            from . import _graph_kernels as gk

            payload = gk.round1_payload(logits_shard, inp, plan, off, V, q_full)
        else:
            payload = round1_payload_torch(logits_shard, inp, plan, off, V, q_full)
        g = self.all_gather(payload)
        if tuple(g.shape) != (self.tp_size, plan.num_rows, plan.round1_width):
            raise RuntimeError(f"all_gather returned {tuple(g.shape)}")
        rv = self.rank_valid(g.device)
        if tri:
            merged = gk.merge_round1(g, inp, plan, V, rv, q_full)
        else:
            merged = merge_round1_torch(g, inp, plan, V, rv, q_full)
        if plan.escalation_slots:
            deferred = escalate(logits_shard, inp, plan, merged, self.all_gather, V, q_full,
                                "triton" if tri else "torch", self._escalation_scratch)
        else:
            deferred = constant(plan.num_rows, 0, merged.uncertified.dtype, g.device)
        decide = gk.decide_merged if tri else decide_merged_torch
        sampled, num_sampled, drow, margin, stopped = decide(merged, deferred, inp, plan, V)
        if plan.residual_round:
            sampled = self._residual_round(logits_shard, inp, plan, merged, drow, num_sampled,
                                           stopped, sampled, q_full)
        return StepOutput(sampled=sampled, num_sampled=num_sampled, accept_margin=margin,
                          nucleus_margin=merged.nucleus_margin, uncertified=merged.uncertified,
                          deferred=deferred, stopped=stopped)

    def _stats_only(self, logits_shard, inp, plan, tri) -> StepOutput:
        """Greedy / temperature rows without a cut, one-hot drafts: one all-gather of
        ``(gval, gidx[, lse, s_x])`` per row and one decision launch (as
        :class:`~.sharded.VocabShardedVerifier`'s fast path)."""
        V, off, R = self.vocab_size, self.col_offset, plan.num_rows
        st = shard_local_stats(logits_shard, inp.temperature, None, inp.draft, inp.seeds,
                               inp.positions, off, V, exclude_draft=True,
                               backend="triton" if tri else "torch", width=plan.round1_width)
        g = self.all_gather(st)
        if tuple(g.shape) != (self.tp_size, R, plan.round1_width):
            raise RuntimeError(f"all_gather returned {tuple(g.shape)}")
        dev = g.device
        # read-only constants made once (no fill launches inside the captured step)
        nan64 = constant(R, float("nan"), torch.float64, dev)
        no = constant(R, False, torch.bool, dev)
        if tri:
            from . import _triton_kernels as tk

            Q, Lmax = plan.num_reqs, plan.max_rows_per_req
            sampled = torch.empty((Q, Lmax), dtype=torch.int64, device=dev)
            num_sampled = torch.empty((Q,), dtype=torch.int32, device=dev)
            drow = torch.empty((Q,), dtype=torch.int64, device=dev)
            margin = torch.empty((R,), dtype=torch.float32, device=dev)
            gg = g if g.dtype == torch.float32 and g.stride(2) == 1 else g.float().contiguous()
            tk.launch_decide(gg, inp.cu_num_rows, inp.draft, inp.temperature, inp.seeds,
                             inp.positions, sampled, num_sampled, drow, margin, V)
            stopped = constant(Q, False, torch.bool, dev)
        else:
            best, tok = merge_argmax(g[..., 0], g[..., 1])
            if plan.all_greedy:
                neg = torch.full((R,), NEG_INF, device=dev)
                lse, sx = neg, neg
            else:
                lse = torch.logsumexp(g[..., 2], dim=0)
                sx = g[..., 3].max(dim=0).values
            none = torch.full((R,), -1, dtype=torch.int64, device=dev)
            merged = Merged(best, tok, lse, sx, none, no, nan64, none)
            sampled, num_sampled, drow, margin, stopped = decide_merged_torch(
                merged, no, inp, plan, V)
        return StepOutput(sampled=sampled, num_sampled=num_sampled, accept_margin=margin,
                          nucleus_margin=nan64, uncertified=no, deferred=no, stopped=stopped)

    def _residual_round(self, logits_shard, inp, plan, merged, drow, num_sampled, stopped,
                        sampled, q_full):
        """Round 3: Gumbel-max of ``max(0, p - q)`` over the shard at each request's decision
        row, for sampling rows without a cut (rows with a cut took it from the candidates)."""
        from .reference import scale_logits

        V, off, S = self.vocab_size, self.col_offset, self.shard_width
        rows = drow.clamp(max=plan.num_rows - 1)
        t = inp.temperature[rows]
        s = scale_logits(logits_shard.index_select(0, rows), t)
        cols = torch.arange(S, device=s.device)
        s = s.masked_fill((cols + off >= V)[None, :], NEG_INF)
        logp = s - merged.lse[rows][:, None]
        hi = min(off + S, V)
        q = torch.zeros_like(s)
        if hi > off:
            q[:, :hi - off] = q_full[rows, off:hi].float()
        res = residual_log_weights(logp, torch.log(q))
        ids = (cols + off).expand(rows.shape[0], -1)
        score = res + _gumbel_at(inp.seeds[rows], inp.positions[rows], ids)
        best, tok = _argmax_lowest_id(score, ids)
        g = self.all_gather(torch.stack([best, tok.to(torch.float32)], dim=1).contiguous())
        gbest, gtok = merge_argmax(g[..., 0], g[..., 1])
        d = inp.draft[rows]
        has_cut = (inp.top_k[rows] > 0) | (inp.min_p[rows] > 0) | (inp.top_p[rows] < 1)
        use = (t > 0) & ~has_cut & (d >= 0) & (d < V) & (gbest > NEG_INF) & ~stopped
        last = (num_sampled.long() - 1).clamp(min=0)
        cur = sampled.gather(1, last[:, None]).squeeze(1)
        new = torch.where(use, gtok, cur)
        return sampled.scatter(1, last[:, None], new[:, None])


# ---------------------------------------------------------------------------
# CUDA graphs of the step
# ---------------------------------------------------------------------------
class StepGraphs:
    """One CUDA graph per :class:`StepPlan`, replayed with the step's inputs copied into
    static buffers preallocated for the largest batch (``max_rows`` rows).

    vLLM 0.34.0 runs ``GPUModelRunner.sample`` after the model forward, outside the
    model's CUDA graphs, in FULL and PIECEWISE modes alike; this captures the
    verification step itself, so it is independent of vLLM's ``cudagraph_mode``.
    Every rank captures the same plans in the same order (the plan is a function of
    the batch's sampling parameters, identical on every rank), so the collectives
    inside the graphs pair up. All graphs share one memory pool (they never run
    concurrently). Off the GPU, or past ``max_graphs`` plans, the step runs eagerly.
    The returned tensors are the graph's static outputs: valid until the next call.
    """

    def __init__(self, step: GraphVerifyStep, max_rows: int, max_graphs: int = 64):
        self.step = step
        self.max_rows = int(max_rows)
        self.max_graphs = int(max_graphs)
        self._graphs: dict = {}
        self._pool = None
        self._static: dict = {}
        #: Steps run eagerly because capture was impossible (counted, not silent).
        self.eager_steps = 0

    def __getattr__(self, name: str):
        if name == "step" or name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.step, name)  # vocab_size, tp_size, ... of the step

    def _buffers(self, logits_shard: torch.Tensor, q_full: torch.Tensor | None) -> dict:
        key = (logits_shard.dtype, logits_shard.device, q_full is None)
        if key not in self._static:
            R, dev = self.max_rows, logits_shard.device
            i64 = dict(dtype=torch.int64, device=dev)
            f32 = dict(dtype=torch.float32, device=dev)
            self._static[key] = {
                "logits": torch.zeros((R, logits_shard.shape[1]), dtype=logits_shard.dtype,
                                      device=dev),
                "cu": torch.zeros(R + 1, **i64), "draft": torch.full((R,), -1, **i64),
                "req": torch.zeros(R, **i64), "rin": torch.zeros(R, **i64),
                "temp": torch.zeros(R, **f32), "seeds": torch.zeros(R, **i64),
                "pos": torch.zeros(R, **i64), "top_k": torch.zeros(R, **i64),
                "min_p": torch.zeros(R, **f32), "top_p": torch.ones(R, **f32),
                "q": None if q_full is None else torch.zeros((R, q_full.shape[1]),
                                                             dtype=q_full.dtype, device=dev),
            }
        return self._static[key]

    def _views(self, b: dict, plan: StepPlan):
        R, Q = plan.num_rows, plan.num_reqs
        inp = StepInputs(cu_num_rows=b["cu"][:Q + 1], draft=b["draft"][:R],
                         req_of_row=b["req"][:R], row_in_req=b["rin"][:R],
                         temperature=b["temp"][:R], seeds=b["seeds"][:R],
                         positions=b["pos"][:R], top_k=b["top_k"][:R], min_p=b["min_p"][:R],
                         top_p=b["top_p"][:R])
        q = None if b["q"] is None else b["q"][:R]
        return b["logits"][:R], inp, q

    @staticmethod
    def _copy_in(dst_logits, dst_inp: StepInputs, dst_q, logits, inp: StepInputs, q) -> None:
        dst_logits.copy_(logits)
        for name in ("cu_num_rows", "draft", "req_of_row", "row_in_req", "temperature",
                     "seeds", "positions", "top_k", "min_p", "top_p"):
            getattr(dst_inp, name).copy_(getattr(inp, name))
        if dst_q is not None:
            dst_q.copy_(q)

    def __call__(self, logits_shard: torch.Tensor, inp: StepInputs, plan: StepPlan,
                 q_full: torch.Tensor | None = None) -> StepOutput:
        if (not logits_shard.is_cuda or plan.num_rows > self.max_rows
                or (plan not in self._graphs and len(self._graphs) >= self.max_graphs)):
            self.eager_steps += 1
            return self.step.run(logits_shard, inp, plan, q_full)
        b = self._buffers(logits_shard, q_full)
        s_logits, s_inp, s_q = self._views(b, plan)
        self._copy_in(s_logits, s_inp, s_q, logits_shard, inp, q_full)
        entry = self._graphs.get(plan)
        if entry is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.step.run(s_logits, s_inp, plan, s_q)  # compile + warm up
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self._pool):
                out = self.step.run(s_logits, s_inp, plan, s_q)
            entry = self._graphs[plan] = (graph, out)
        graph, out = entry
        graph.replay()
        return out
