"""Exact speculative-decoding verification over vocabulary shards.

Each of the ``TP`` ranks holds only its slice ``z[:, r*S:(r+1)*S]`` of the target
logits (``S = ceil(V / TP)`` by default; columns ``>= V`` are padding and never
win). Instead of all-gathering ``[rows, V]`` logits (``2 * V`` bytes per row in
bf16; 327,680 bytes for Kimi-K2.5), the ranks exchange a few shard statistics
per row through an injected ``all_gather(t: [rows, n]) -> [TP, rows, n]`` and
every rank then reaches the same decisions as the full-vocabulary
:class:`~.reference.ReferenceVerifier`.

Why one all-gather suffices (greedy and one-hot drafts)
-------------------------------------------------------
Every quantity the rejection rule needs is a *decomposable* reduction over
the vocabulary, so a per-shard summary of constant size is enough:

* ``argmax_v z_v`` = the best of the per-shard ``(max, argmax)`` pairs
  (compare values, then lowest global id: exactly the full argmax with its
  lowest-id tie-break).
* ``LSE = log sum_v exp(s_v)`` (``s = mask(z / T)``) = ``logsumexp_r LSE_r`` of
  the per-shard log-sum-exps.
* ``s_x`` of the draft token lives on exactly one shard (the others send
  ``-inf``, so a max recovers it). The accept test ``u < p(x) = exp(s_x - LSE)``
  therefore needs only ``(LSE_r, s_x|r)``.
* Sampling, both the recovered token after a rejection (one-hot residual = ``p``
  without ``x``, see :mod:`.reference`) and the bonus token, is Gumbel-max
  ``argmax_v (s_v + g_v)``. The noise ``g_v`` is a pure function of
  ``(seed, position, global id v)``, so each rank computes exactly the scores
  the reference computes for its ids and the argmax of the whole vocabulary
  is the best of the per-shard ``(max, argmax)`` pairs. No normalisation is
  needed: Gumbel-max is invariant to the per-row constant ``LSE``.

Why per-shard Gumbel-max + argmax merge is exact: by the Gumbel-max theorem,
with i.i.d. standard Gumbel ``g_v``, ``argmax_v (w_v + g_v)`` is distributed as
``softmax(w)`` (``-inf`` weights never win). ``max`` is associative, so the
argmax over the vocabulary equals the best of the per-shard argmaxes, and
because every shard evaluates the *same* ``w_v + g_v`` numbers the reference
would, the merged token is the reference's token, not merely one with the same
distribution (exact float ties are resolved by the lowest id on both sides).
The speculative-sampling theorem additionally needs the recovered sample to be
independent of the accept test: the accept uniform lives in another hash domain
and rows use different positions. (Independence and uniformity are those of a
counter-based hash; the chi-square tests in ``tests/unit`` check them.)

The rank cannot know which row will be the first rejection before the
exchange, so it sends, for every row, the Gumbel-max *with that row's draft
token excluded* (on bonus rows nothing is excluded). Per row and rank that is
4 float32 = 16 bytes: ``(gval, gidx, LSE_r, s_x|r)``; a batch of greedy rows
only sends ``(max, argmax)`` = 8 bytes. Token ids travel as float32, exact
below ``2**24``.

Min-p, top-k and top-p (exact, one extra round)
-----------------------------------------------
vLLM's mask (min-p, then top-k, then top-p) keeps a prefix of the row in the
order (value descending, token id ascending); :mod:`.cuts` finds it from each
rank's first ``W`` values in that order (``W = max(k_max, m)`` with ``m`` =
:func:`top_p_width_for` when a row uses top-p, else ``k_max``; 1 for min-p
alone) plus, with top-p, the shard log-sum-exp (two float32): ``4 * (W + 2)``
bytes per row. Every rank then masks its shard with its share of the prefix and
the stats round runs on the masked logits: 2 collectives. Min-p and top-k are
always exact from this round. A top-p cut is exact when it lies above every
rank's ``W``-th value (every nucleus token was sent) or top-k bounds the
candidates; the other rows repeat the round with the wider ``top_p_escalation``
widths and finally with the whole shard (counted in
:attr:`VocabShardedVerifier.escalations`; each repeat is one more collective and
one host synchronisation).

Probabilistic drafts (q not one-hot): 2 collectives
----------------------------------------------------
Acceptance needs ``p(x) / q(x)``: the owner of ``x`` sends ``s_x - log q(x)``
in the ``s_x`` slot, so the first round is unchanged. The residual
``max(0, p - q)`` however depends on the *normalised* ``p = exp(s - LSE)``,
whose ``LSE`` is only known after round 1. Round 2 therefore computes, at the
decision row of each sampling request, the per-shard Gumbel-max of the residual
log-weights ``log p + log1p(-q/p)`` (``-inf`` where ``q >= p``) and gathers
``(gval, gidx)``: 8 bytes per request. Residual sampling by Gumbel-max is exact
for the same reason as above: the residual's log-weights are shard-local once
``LSE`` is known, and Gumbel-max samples proportionally to ``exp(weight)``
without needing the residual's normaliser.

Anything that needs the full row (logprobs, penalties, bad words, logit bias,
structured output, ...) must use the full gather: see
:func:`.plan.plan_verification`.

Numerics: the shards' per-token scores are bitwise identical to the
reference's. The only rounding-level difference is the LSE (a different
summation order), which can flip an accept decision only when the uniform lies
within float rounding of ``p(x)/q(x)`` (probability ~1e-7 per test; see
:attr:`.batch.VerifyOutput.accept_margin`) and, for probabilistic drafts,
reorder two residual candidates whose scores tie to rounding. Every rank
computes the merge from the same gathered bytes, so ranks never disagree.

Cost per rank and step (Triton path): 3 kernel launches (shard statistics,
split merge, decide) around the all-gather and no host synchronisation, so a
step can be captured in a CUDA graph (top-k/min-p and probabilistic drafts add
torch ops for their extra round; a top-p row that needs a wider round costs a
host synchronisation).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .batch import HostModes, VerifyBatch, VerifyOutput
from .cuts import LSE_COLUMNS, join_float64, local_cut, local_top, merge_cuts, split_float64
from .hashing import DOMAIN_GUMBEL, gumbel_noise, row_keys
from .kernels import decide, masked_scaled_shard, merge_argmax, merge_lse, shard_local_stats
from .reference import residual_log_weights

NEG_INF = float("-inf")

#: ``all_gather(t [rows, n]) -> [TP, rows, n]`` (rank order).
AllGather = Callable[[torch.Tensor], torch.Tensor]

#: Token ids are exchanged as float32.
MAX_EXACT_FLOAT_ID = 2**24

STATS_WIDTH = 4
GREEDY_STATS_WIDTH = 2
RESIDUAL_WIDTH = 2
FLOAT_BYTES = 4

#: Values each rank sends per top-p row in the threshold round (``m``), chosen from
#: the fallback-rate benchmark (docs/sharded-verification.md): at least
#: :data:`MIN_TOP_P_WIDTH`, and more while the round stays within
#: :data:`TOP_P_ROUND_BYTES` per rank (small batches: the single-stream case).
MIN_TOP_P_WIDTH = 128
#: 16 KiB sent per rank (128 KiB received at TP = 8) keeps an all-gather in the
#: small-message range where PCIe latency is nearly flat.
TOP_P_ROUND_BYTES = 16384
#: Wider rounds for top-p rows whose cut ``m`` values cannot certify; the whole
#: shard follows as the last (always exact) round.
DEFAULT_TOP_P_ESCALATION = (1024,)


def top_p_width_for(modes: HostModes, top_p_width: int | None) -> int:
    """``m`` of a batch: ``top_p_width`` if given, else the byte-budget rule above
    (capped at the first escalation width)."""
    if top_p_width is not None:
        return top_p_width
    n = 0 if modes.thr_rows is None else int(modes.thr_rows.numel())
    fit = TOP_P_ROUND_BYTES // (FLOAT_BYTES * max(n, 1)) - LSE_COLUMNS
    return max(MIN_TOP_P_WIDTH, min(fit, DEFAULT_TOP_P_ESCALATION[0]))


def threshold_width(modes: HostModes, top_p_width: int | None) -> int:
    """float32 columns per row of the threshold round (values, + the LSE with top-p)."""
    if not modes.has_top_p:
        return max(modes.thr_width, 1)
    return max(modes.thr_width, top_p_width_for(modes, top_p_width)) + LSE_COLUMNS


# ---------------------------------------------------------------------------
# communication plan
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Collective:
    """One all-gather: every rank sends ``rows x width`` float32."""

    name: str
    rows: int
    width: int

    @property
    def bytes_per_rank(self) -> int:
        return self.rows * self.width * FLOAT_BYTES


@dataclass(frozen=True)
class BatchModes:
    """What decides the communication of a verification step.

    ``threshold_rows``/``threshold_width``: rows that need the min-p/top-k/top-p
    round and the float32 columns each rank sends per such row (``k_max``, 1 for
    min-p alone; with top-p ``max(k_max, m) + 2``). ``prob_requests``: sampling
    requests verified against a probabilistic draft (they need the residual round).
    """

    all_greedy: bool
    threshold_rows: int = 0
    threshold_width: int = 0
    prob_requests: int = 0

    @staticmethod
    def from_batch(batch: VerifyBatch, vocab_size: int, probabilistic: bool,
                   top_p_width: int | None = None) -> BatchModes:
        m = batch.layout().host_modes(vocab_size)
        return BatchModes(
            all_greedy=m.all_greedy,
            threshold_rows=0 if m.thr_rows is None else int(m.thr_rows.numel()),
            threshold_width=0 if m.thr_rows is None else threshold_width(m, top_p_width),
            prob_requests=m.num_sampling_reqs if probabilistic else 0,
        )


@dataclass(frozen=True)
class CommPlan:
    """Collectives of one sharded verification step (per rank)."""

    tp_size: int
    num_rows: int
    collectives: tuple[Collective, ...]

    @property
    def num_collectives(self) -> int:
        return len(self.collectives)

    @property
    def bytes_sent_per_rank(self) -> int:
        return sum(c.bytes_per_rank for c in self.collectives)

    @property
    def bytes_received_per_rank(self) -> int:
        """All-gather output size on each rank (``TP x`` what each rank sends)."""
        return self.bytes_sent_per_rank * self.tp_size

    @property
    def bytes_per_row_per_rank(self) -> float:
        return self.bytes_sent_per_rank / max(self.num_rows, 1)

    def describe(self) -> str:
        parts = [f"{c.name}[{c.rows}x{c.width}f32]" for c in self.collectives]
        return (f"{self.num_collectives} all-gather(s): " + ", ".join(parts)
                + f"; {self.bytes_sent_per_rank} B sent/rank, "
                f"{self.bytes_received_per_rank} B received/rank")


def comm_plan(num_rows: int, tp_size: int, modes: BatchModes) -> CommPlan:
    """Collectives and bytes of one step of :class:`VocabShardedVerifier`.

    * all greedy: 1 all-gather, 8 B/row/rank (``max, argmax``);
    * any sampling with one-hot drafts: 1 all-gather, 16 B/row/rank;
    * + top-k/min-p/top-p: a threshold all-gather first (``4 * k_max`` B per such
      row; with top-p ``4 * (max(k_max, m) + 2)``);
    * + probabilistic drafts: a residual all-gather after (8 B per sampling request).

    Top-p rows whose cut the first threshold round cannot certify add one
    all-gather per wider round (data-dependent; :attr:`VocabShardedVerifier.last_plan`
    lists what a step actually sent).
    """
    cols: list[Collective] = []
    if modes.threshold_rows > 0:
        cols.append(Collective("threshold", modes.threshold_rows, modes.threshold_width))
    width = GREEDY_STATS_WIDTH if modes.all_greedy else STATS_WIDTH
    cols.append(Collective("stats", num_rows, width))
    if modes.prob_requests > 0:
        cols.append(Collective("residual", modes.prob_requests, RESIDUAL_WIDTH))
    return CommPlan(tp_size=tp_size, num_rows=num_rows, collectives=tuple(cols))


def full_gather_bytes_per_row(vocab_size: int, dtype_bytes: int = 2) -> int:
    """Bytes each rank receives per row when gathering full logits (vLLM today)."""
    return vocab_size * dtype_bytes


# ---------------------------------------------------------------------------
# verifier
# ---------------------------------------------------------------------------
class ShardedRank:
    """One rank of a vocabulary-sharded group: the vocabulary, the group size, this rank's
    shard (``shard_width`` columns from ``col_offset``) and the ``all_gather`` of the group.
    Shared by :class:`VocabShardedVerifier` and the graph step."""

    def __init__(self, vocab_size: int, tp_size: int, rank: int, all_gather: AllGather,
                 shard_width: int | None = None, backend: str = "auto"):
        if vocab_size >= MAX_EXACT_FLOAT_ID:
            raise ValueError("token ids are exchanged as float32: vocab must be < 2**24")
        self.vocab_size = int(vocab_size)
        self.tp_size = int(tp_size)
        self.rank = int(rank)
        self.all_gather = all_gather
        self.shard_width = int(shard_width) if shard_width else -(-self.vocab_size // self.tp_size)
        if self.shard_width * self.tp_size < self.vocab_size:
            raise ValueError("shards do not cover the vocabulary")
        self.col_offset = self.rank * self.shard_width
        self.backend = backend

    def shard_lengths(self) -> list[int]:
        """Valid (non-padding) columns of each rank's shard, in rank order."""
        S, V = self.shard_width, self.vocab_size
        return [max(0, min(S, V - r * S)) for r in range(self.tp_size)]


class VocabShardedVerifier(ShardedRank):
    """Verification on one rank that holds a vocabulary shard of the target logits."""

    def __init__(
        self,
        vocab_size: int,
        tp_size: int,
        rank: int,
        all_gather: AllGather,
        shard_width: int | None = None,
        backend: str = "auto",
        top_p_width: int | None = None,
        top_p_escalation: tuple[int, ...] = DEFAULT_TOP_P_ESCALATION,
    ):
        super().__init__(vocab_size, tp_size, rank, all_gather, shard_width, backend)
        if top_p_width is not None and (top_p_width < 1 or any(
                w <= top_p_width for w in top_p_escalation)):
            raise ValueError("top_p_width must be >= 1 and every escalation width larger")
        #: ``m`` (None: :func:`top_p_width_for`'s rule per batch).
        self.top_p_width = top_p_width
        #: Rounds after the first: the given widths (below the shard), then the shard.
        self.top_p_escalation = tuple(sorted({min(int(w), self.shard_width)
                                              for w in top_p_escalation}
                                             | {self.shard_width}))
        self.last_plan: CommPlan | None = None
        #: Rows per top-p round since construction: ``top_p_rows`` (first round),
        #: ``top_p_round_<width>`` (rows repeated at that width; the shard width is
        #: the full-row fallback).
        self.escalations: Counter[str] = Counter()
        self._n_valid = torch.tensor(self.shard_lengths())

    # --- hooks (overridden by the deliberately wrong verifiers of the tests) ---
    def _owner_accept_numerator(self, s_x, logq_x):
        """What the owner of ``x`` sends: ``log(p(x) q-normaliser)``, i.e. ``s_x - log q(x)``."""
        return s_x - logq_x

    exclude_rejected_draft: bool = True

    def _residual(self, logp, logq):
        return residual_log_weights(logp, logq)

    # ---------------------------------------------------------------------
    def _gather(self, t: torch.Tensor, width: int) -> torch.Tensor:
        """All-gather ``t [rows, width]`` -> ``[TP, rows, width]`` (the last dim must have
        unit stride; any other strides are accepted, e.g. a broadcast view in benchmarks)."""
        out = self.all_gather(t if t.is_contiguous() else t.contiguous())
        if tuple(out.shape) != (self.tp_size, t.shape[0], width):
            raise RuntimeError(f"all_gather returned {tuple(out.shape)}")
        return out

    def plan(self, batch: VerifyBatch, probabilistic: bool) -> CommPlan:
        """The step's planned collectives (without data-dependent top-p repeats)."""
        cache = batch.layout()._modes
        key = ("plan", self.vocab_size, self.tp_size, probabilistic, self.top_p_width)
        if key not in cache:
            cache[key] = comm_plan(batch.num_rows, self.tp_size,
                                   BatchModes.from_batch(batch, self.vocab_size, probabilistic,
                                                         self.top_p_width))
        return cache[key]

    def _thresholds(self, logits_shard, L):
        """Round 0 (some sampling row uses min-p/top-k/top-p): this rank's exact share of
        the kept prefix per row, ``(threshold, tie_col, nucleus_margin)``, or None.

        Top-p rows the first round cannot certify repeat it with the wider
        :attr:`top_p_escalation` widths (one all-gather each, after a host sync
        that every rank reaches with the same gathered bytes)."""
        V = self.vocab_size
        m = L.host_modes(V)
        if m.thr_rows is None:
            return None
        rows = m.thr_rows
        dev = logits_shard.device
        s = masked_scaled_shard(logits_shard[rows], L.temperature[rows], None,
                                self.col_offset, V)
        lse = torch.logsumexp(s.double(), dim=1) if m.has_top_p else None
        thr = torch.full((L.num_rows,), NEG_INF, device=dev)
        lim = torch.full((L.num_rows,), self.shard_width, dtype=torch.int64, device=dev)
        margin = torch.full((L.num_rows,), float("nan"), dtype=torch.float64, device=dev)
        rank_valid = self._n_valid.to(dev)
        pending = torch.arange(int(rows.numel()), device=dev)
        first = threshold_width(m, self.top_p_width) - (LSE_COLUMNS if m.has_top_p else 0)
        widths = [first] + [w for w in self.top_p_escalation if w > first]
        if m.has_top_p:
            self.escalations["top_p_rows"] += m.num_top_p_rows
        for level, width in enumerate(widths):
            vals, cols = local_top(s if level == 0 else s[pending], width)
            payload = vals if lse is None else torch.cat(
                [vals, split_float64(lse[pending])], dim=1)
            if level > 0:
                self._record_extra_round(width, int(pending.numel()), payload.shape[1])
            g = self._gather(payload, payload.shape[1])
            merged = merge_cuts(
                g[..., :width], None if lse is None else join_float64(g[..., width:]),
                m.thr_top_k[pending], m.thr_min_p[pending], m.thr_top_p[pending],
                rank_complete=width >= rank_valid)
            t, c = local_cut(vals, cols, merged, self.rank, self.shard_width)
            done = merged.resolved
            target = rows[pending]
            thr[target] = torch.where(done, t, thr[target])
            lim[target] = torch.where(done, c, lim[target])
            margin[target] = torch.where(done, merged.margin, margin[target])
            # Only top-p rows without top-k can stay unresolved; checking costs a host sync.
            if level == len(widths) - 1 or not m.top_p_may_escalate or bool(done.all()):
                break
            pending = pending[~done]
        return thr, lim, margin

    def _record_extra_round(self, width: int, rows: int, columns: int) -> None:
        """Count a wider top-p round and insert it before the stats round in ``last_plan``."""
        self.escalations[f"top_p_round_{width}"] += rows
        base = self.last_plan
        assert base is not None
        cols = list(base.collectives)
        at = next(i for i, c in enumerate(cols) if c.name == "stats")
        cols.insert(at, Collective(f"top_p_round_{width}", rows, columns))
        self.last_plan = CommPlan(base.tp_size, base.num_rows, tuple(cols))

    def verify(
        self,
        logits_shard: torch.Tensor,
        batch: VerifyBatch,
        draft_probs_shard: torch.Tensor | None = None,
    ) -> VerifyOutput:
        """Verify a batch from this rank's shard.

        ``logits_shard [num_rows, S]`` (any float dtype); ``draft_probs_shard
        [num_rows, S]`` is this rank's slice of the draft probabilities (None for
        one-hot drafts). Collective: every rank of the group must call it with the
        same ``batch``. Returns the same :class:`VerifyOutput` on every rank.
        """
        L = batch.layout()
        V, S, off = self.vocab_size, self.shard_width, self.col_offset
        if logits_shard.shape != (L.num_rows, S):
            raise ValueError(f"expected logits shard [{L.num_rows}, {S}], "
                             f"got {tuple(logits_shard.shape)}")
        probabilistic = draft_probs_shard is not None
        self.last_plan = self.plan(batch, probabilistic)
        cut = self._thresholds(logits_shard, L)
        thr, lim, nuc_margin = (None, None, None) if cut is None else cut

        # Round 1: shard statistics -> one all-gather -> identical decisions on every rank.
        modes = L.host_modes(V)
        width = GREEDY_STATS_WIDTH if modes.all_greedy else STATS_WIDTH
        exclude = (not probabilistic) and self.exclude_rejected_draft
        stats = shard_local_stats(logits_shard, L.temperature, thr, L.draft, L.seeds,
                                  L.positions, off, V, exclude_draft=exclude,
                                  backend=self.backend, width=width, tie_col=lim)
        if probabilistic and not modes.all_greedy:
            draft = L.draft
            owned = (draft >= off) & (draft < min(off + S, V))
            dcol = torch.where(owned, draft - off, torch.zeros_like(draft))
            logq_x = torch.log(draft_probs_shard.float().gather(1, dcol[:, None]).squeeze(1))
            num = self._owner_accept_numerator(stats[:, 3], logq_x)
            stats[:, 3] = torch.where(owned & (L.temperature != 0), num,
                                      torch.full_like(num, NEG_INF))
        g = self._gather(stats, width)  # [TP, rows, width]
        sampled, num_sampled, drow, margin = decide(g, L, V, backend=self.backend)
        if probabilistic and modes.num_sampling_reqs > 0:
            lse = merge_lse(g[..., 2])
            res_tok, use = self._residual_round(logits_shard, draft_probs_shard, L, thr, lim,
                                                lse, drow)
            reqs = modes.sampling_reqs
            last = (num_sampled[reqs] - 1).long()
            sampled = sampled.clone()
            sampled[reqs, last] = torch.where(use, res_tok, sampled[reqs, last])
        return VerifyOutput(sampled=sampled, num_sampled=num_sampled, accept_margin=margin,
                            nucleus_margin=nuc_margin)

    def _residual_round(self, logits_shard, q_shard, L, thr, lim, lse, drow):
        """Round 2 (probabilistic drafts): Gumbel-max of ``max(0, p - q)`` at the decision
        rows of the sampling requests. Returns ``(token, use)``: where ``use`` is False
        (bonus row, placeholder draft, empty residual) the round-1 sample from ``p``
        (no exclusion in probabilistic mode) stands."""
        V, off = self.vocab_size, self.col_offset
        reqs = L.host_modes(V).sampling_reqs
        rows = drow[reqs]
        s = masked_scaled_shard(logits_shard[rows], L.temperature[rows],
                                None if thr is None else thr[rows], off, V,
                                None if lim is None else lim[rows])
        gid = torch.arange(s.shape[1], device=s.device) + off
        h1, h2 = row_keys(L.seeds[rows], L.positions[rows], DOMAIN_GUMBEL)
        g = gumbel_noise(h1, h2, gid)
        logp = s - lse[rows][:, None]
        res = self._residual(logp, torch.log(q_shard[rows].float()))
        scores = res + g
        idx = torch.argmax(scores, dim=1)
        local = torch.stack([scores.gather(1, idx[:, None]).squeeze(1),
                             (idx + off).to(torch.float32)], dim=1)
        gg = self._gather(local, RESIDUAL_WIDTH)
        best, res_tok = merge_argmax(gg[..., 0], gg[..., 1])
        d = L.draft[rows]
        return res_tok, (d >= 0) & (d < V) & (best > NEG_INF)


# ---------------------------------------------------------------------------
# communication back-ends
# ---------------------------------------------------------------------------
def torch_distributed_all_gather(group=None) -> AllGather:
    """``all_gather`` over a ``torch.distributed`` process group (gloo, NCCL, ...)."""
    import torch.distributed as dist

    def all_gather(t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous()
        ws = dist.get_world_size(group)
        out = torch.empty((ws, *t.shape), dtype=t.dtype, device=t.device)
        dist.all_gather(list(out.unbind(0)), t, group=group)
        return out

    return all_gather


def group_coordinator_all_gather(group) -> AllGather:
    """Adapter for a vLLM ``GroupCoordinator`` (e.g. ``get_tp_group()``), without importing vLLM.

    ``GroupCoordinator.all_gather(t, dim=0)`` concatenates along dim 0; this
    reshapes to ``[world_size, rows, n]``. It goes through vLLM's device
    communicator (NCCL, or a custom all-gather where configured).
    """

    def all_gather(t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous()
        return group.all_gather(t, dim=0).view(group.world_size, *t.shape)

    return all_gather


@dataclass
class CountingAllGather:
    """Wraps an ``all_gather`` and records the shape and bytes of every call."""

    inner: AllGather
    calls: list[tuple[tuple[int, ...], int]] = field(default_factory=list)

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        self.calls.append((tuple(t.shape), t.numel() * t.element_size()))
        return self.inner(t)

    @property
    def num_calls(self) -> int:
        return len(self.calls)

    @property
    def bytes_sent(self) -> int:
        return sum(b for _, b in self.calls)
