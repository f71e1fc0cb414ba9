"""One vocabulary-sharded verification step per rank that a CUDA graph can hold.

:class:`GraphVerifyStep` makes the same decisions as the full-logits
:class:`~.reference.ReferenceVerifier` for every mode the sharded verifier
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
   the merged candidates is *certified* (no rank that sent ``W`` candidates can
   hold an unsent token before the cut; :mod:`.merge`): its nucleus,
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
   decision row, 8 bytes per request.

The decisions (first rejection, recovered / bonus token, deferral) are made by
one program per request from the merged per-row statistics.

Each round is one module with its torch body (any device; the CPU tier runs it) and its
Triton launcher side by side: :mod:`.stats` (round 1's shard pass), :mod:`.merge`,
:mod:`.escalate` (one module per escalation kind), :mod:`.decide` and :mod:`.residual`.
:meth:`run` asks the one backend switch (:func:`.backend.use_triton`) once and hands the
answer to every round; the Triton kernels (:mod:`._kernels`) sit behind one availability
guard.
"""

from __future__ import annotations

import logging
from collections import Counter

import torch

from . import decide, escalate, merge, residual, stats
from .protocol import RESIDUAL_COLUMNS, StepPlan, plan_step
from .ranks import AllGather, ShardedRank
from .step_io import StepInputs, StepOutput

logger = logging.getLogger(__name__)



class GraphVerifyStep(ShardedRank):
    """The per-rank verification step (see the module docstring).

    ``all_gather(t [rows, n]) -> [TP, rows, n]`` (any dtype). ``backend``:
    ``"torch"``, ``"triton"`` or ``"auto"`` (Triton for CUDA tensors when available).
    Call :meth:`run` eagerly or inside ``torch.cuda.graph`` capture; it reads no
    device value on the host.
    """

    #: The escalation kinds this step runs, by :attr:`.protocol.StepPlan.escalation`.
    escalations = escalate.VARIANTS

    def __init__(self, vocab_size: int, tp_size: int, rank: int, all_gather: AllGather,
                 shard_width: int | None = None, backend: str = "auto"):
        super().__init__(vocab_size, tp_size, rank, all_gather, shard_width, backend)
        self._rank_valid: dict[torch.device, torch.Tensor] = {}
        #: Persistent buffers of the split escalation (see :mod:`.escalate.rows`).
        self._escalation_scratch: dict = {}

    def rank_valid(self, device: torch.device) -> torch.Tensor:
        if device not in self._rank_valid:
            self._rank_valid[device] = torch.tensor(self.shard_lengths(), device=device)
        return self._rank_valid[device]

    def run(self, logits_shard: torch.Tensor, inp: StepInputs, plan: StepPlan,
            q_full: torch.Tensor | None = None) -> StepOutput:
        """The step's rounds in the contract's order (:attr:`.protocol.StepPlan.rounds`)."""
        V, off = self.vocab_size, self.col_offset
        if tuple(logits_shard.shape) != (plan.num_rows, self.shard_width):
            raise ValueError(f"expected logits shard [{plan.num_rows}, {self.shard_width}], "
                             f"got {tuple(logits_shard.shape)}")
        if (q_full is not None) != plan.probabilistic:
            raise ValueError("q_full must be given exactly when the plan is probabilistic")
        tri = self.uses_triton(logits_shard)  # the one backend switch, for every round
        # round 1: statistics (+ candidates)
        g = self._gather(stats.round1_payload(logits_shard, inp, plan, off, V, q_full,
                                              triton=tri),
                         plan.num_rows, plan.round1_width)
        if plan.stats_only:
            return decide.decide_stats_only(g, inp, plan, V, triton=tri)
        merged = self.merge(g, inp, plan, q_full, triton=tri)
        # round 2: the escalation of uncertified rows (none without slots); the folded kind
        # merges round 1's payload ``g`` again over more candidates
        deferred = escalate.resolve(self, logits_shard, inp, plan, merged, q_full, g=g,
                                    scratch=self._escalation_scratch, triton=tri,
                                    variants=self.escalations)
        sampled, num_sampled, drow, margin, stopped = decide.decide_merged(
            merged, deferred, inp, plan, V, triton=tri)
        # round 3: the residual at each request's decision row
        if plan.residual_round:
            rows = drow.clamp(max=plan.num_rows - 1)
            res = residual.residual_payload(logits_shard, inp, merged, rows, q_full, off, V)
            sampled = residual.apply_residual(self._gather(res, plan.num_reqs, RESIDUAL_COLUMNS),
                                              inp, rows, num_sampled, stopped, sampled, V)
        return StepOutput(sampled=sampled, num_sampled=num_sampled, accept_margin=margin,
                          nucleus_margin=merged.nucleus_margin, uncertified=merged.uncertified,
                          deferred=deferred, stopped=stopped)

    def merge(self, g: torch.Tensor, inp: StepInputs, plan: StepPlan,
              q_full: torch.Tensor | None, *, triton: bool):
        """Round 1's merge (:func:`.merge.merge_round1`) of gathered payloads ``g`` on this
        rank; the folded escalation (:mod:`.escalate.folded`) runs it again over ``W + W2``
        candidates per rank through here, as an escalation variant imports no other round."""
        return merge.merge_round1(g, inp, plan, self.vocab_size, self.rank_valid(g.device),
                                  q_full, triton=triton)

    def _gather(self, t: torch.Tensor, rows: int, width: int) -> torch.Tensor:
        g = self.all_gather(t)
        if tuple(g.shape[:3]) != (self.tp_size, rows, width):
            raise RuntimeError(f"all_gather returned {tuple(g.shape)}")
        return g


# ---------------------------------------------------------------------------
# CUDA graphs of the step, captured at warm-up
# ---------------------------------------------------------------------------
#: A plan's flavour: what decides its launches besides the shapes
#: ``(all_greedy, candidates > 0, escalation, residual_round, probabilistic)``.
Flavour = tuple[bool, bool, bool, bool, bool]
ONE_HOT_FLAVOURS: tuple[Flavour, ...] = (
    (True, False, False, False, False),  # greedy
    (False, False, False, False, False),  # temperature, no cut
    (False, True, False, False, False),  # top-k (bounded cut)
    (False, True, True, False, False),  # top-p / min-p (the escalation round)
)
PROBABILISTIC_FLAVOURS: tuple[Flavour, ...] = ((True, False, False, False, True),) + tuple(
    (False, c, e, r, True) for c, e, r in ((False, False, True), (True, False, False),
                                           (True, False, True), (True, True, False),
                                           (True, True, True)))
#: Reasons a step ran without a captured graph (counted by :class:`StepGraphs`).
UNCAPTURED_REASONS = {
    "not_warmed_up": "no graph was captured at warm-up (CUDA graphs off, or warm-up not run)",
    "batch_above_captured": "more requests than the largest captured size",
    "rows_per_request": "a request has more rows than the captured k + 1",
    "plan_not_captured": "a plan outside the captured flavours (e.g. top-k above the "
                         "candidates, or a logits dtype / draft kind not warmed up)",
}


def default_capture_sizes(max_reqs: int) -> tuple[int, ...]:
    """Request counts captured at warm-up: 1, 2, 4, 8, then steps of 8 to 64, of 16 to 128
    and of 32 above (as vLLM's own decode sizes grow), and ``max_reqs`` itself."""
    sizes = {1, 2, 4, 8, *range(16, 65, 8), *range(80, 129, 16), *range(160, max_reqs + 1, 32)}
    return tuple(sorted({q for q in sizes if q <= max_reqs} | {max_reqs}))


def flavour(plan: StepPlan) -> Flavour:
    return (plan.all_greedy, plan.candidates > 0, plan.escalation_slots > 0,
            plan.residual_round, plan.probabilistic)


class _StandIn:
    """What a captured graph does, off the GPU: ``replay()`` runs the step again on the
    static inputs and writes its results into the outputs of the capture (the memory a
    CUDA graph would overwrite), so the hazards of static outputs are the same."""

    def __init__(self, fn):
        self.fn = fn
        self.out = fn()

    def replay(self) -> None:
        new = self.fn()
        for name in StepOutput.__dataclass_fields__:
            old_t, new_t = getattr(self.out, name), getattr(new, name)
            if new_t is not old_t:  # read-only constants are shared, not copied
                old_t.copy_(new_t)


class _Captured:
    """A CUDA graph and the static outputs its replay overwrites."""

    def __init__(self, graph, out: StepOutput):
        self.graph, self.out = graph, out

    def replay(self) -> None:
        self.graph.replay()


def canonical_device(device) -> torch.device:
    """``device`` as the logits will carry it: ``"cuda"`` without an index is the current
    CUDA device (``cuda:N``), so a graph captured for it is found again by the logits'
    ``str(device)`` while serving."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


class StepGraphs:
    """The step's graphs for a fixed list of padded request counts, captured at warm-up
    (:meth:`warm_up`) and never during serving, as vLLM does for its own graphs.

    A step of ``n`` requests with at most ``k + 1`` rows each is padded to the next
    captured size ``Q >= n`` with ``Q x (k + 1)`` rows: request ``i``'s rows go to rows
    ``i (k + 1) ...`` of the static buffers (one device ``index_copy``, no host read), and
    every other row is a greedy placeholder (draft ``-1``): a request stops at its own
    last row (its draft is ``-1``: rejected, the token sampled as at a bonus row) and
    never reaches the padding, greedy padding never takes an escalation slot, and the
    padded requests' outputs are dropped. A step no captured graph fits (see
    :data:`UNCAPTURED_REASONS`) runs eagerly; it is counted per reason in
    :attr:`uncaptured` and logged once per reason.

    The returned ``sampled`` / ``num_sampled`` are **copies** (the graph's static outputs
    are overwritten by the next replay, while vLLM may still be copying the previous
    step's tokens asynchronously); the other diagnostics are gathered per real row.

    Every rank warms up the same sizes and flavours in the same order, so the collectives
    inside the graphs pair up; all graphs share one memory pool (they never run
    concurrently). Off the GPU a stand-in (:class:`_StandIn`) replays by re-running the
    step on the static buffers, so the padding and copy logic runs in the CPU tier.
    """

    def __init__(self, step: GraphVerifyStep, max_reqs: int, rows_per_req: int,
                 capture_sizes: tuple[int, ...] | None = None,
                 log: logging.Logger | None = None):
        self.step = step
        self.rows_per_req = int(rows_per_req)
        self.capture_sizes = tuple(sorted(capture_sizes or default_capture_sizes(max_reqs)))
        self.max_reqs = self.capture_sizes[-1]
        self._graphs: dict = {}
        self._pool = None
        self._static: dict = {}
        self._log = log or logger
        self._bytes = 2  # the logits' element size (set by warm_up)
        #: Steps that ran without a captured graph, per reason (see UNCAPTURED_REASONS).
        self.uncaptured: Counter[str] = Counter()
        self.replayed = 0

    def __getattr__(self, name: str):
        if name == "step" or name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.step, name)  # vocab_size, tp_size, ... of the step

    # --- warm-up ------------------------------------------------------------------
    def padded_plan(self, q: int, fl: Flavour) -> StepPlan:
        greedy, cut, esc, res, prob = fl
        S = self.step.shard_width
        return plan_step(tp_size=self.step.tp_size, shard_width=S, num_rows=q * self.rows_per_req,
                         num_reqs=q, max_rows_per_req=self.rows_per_req, all_greedy=greedy,
                         any_cut=cut, may_escalate=esc, probabilistic=prob,
                         any_uncut_sampling=res, logits_bytes=self._bytes)

    def warm_up(self, logits_dtype: torch.dtype, device, probabilistic: bool = False,
                q_width: int | None = None) -> int:
        """Capture every (size, flavour) graph; returns how many. Run it on every rank, in
        the same order, before serving (vLLM's ``capture_model``)."""
        self._bytes = torch.empty((), dtype=logits_dtype).element_size()
        flavours = ONE_HOT_FLAVOURS + (PROBABILISTIC_FLAVOURS if probabilistic else ())
        dev = canonical_device(device)
        for q in self.capture_sizes:
            for fl in flavours:
                self._capture(q, fl, logits_dtype, dev, q_width)
        return len(self._graphs)

    def _buffers(self, dtype, device, q_width) -> dict:
        key = (dtype, str(device), q_width)
        if key not in self._static:
            R, dev = self.max_reqs * self.rows_per_req, device
            i64 = dict(dtype=torch.int64, device=dev)
            f32 = dict(dtype=torch.float32, device=dev)
            rows = torch.arange(R, **i64)
            self._static[key] = {
                "logits": torch.zeros((R, self.step.shard_width), dtype=dtype, device=dev),
                "cu": torch.arange(self.max_reqs + 1, **i64) * self.rows_per_req,
                "req": rows // self.rows_per_req, "rin": rows % self.rows_per_req,
                "draft": torch.full((R,), -1, **i64), "temp": torch.zeros(R, **f32),
                "seeds": torch.zeros(R, **i64), "pos": torch.zeros(R, **i64),
                "top_k": torch.zeros(R, **i64), "min_p": torch.zeros(R, **f32),
                "top_p": torch.ones(R, **f32),
                "q": None if q_width is None else torch.zeros((R, q_width), **f32),
            }
        return self._static[key]

    def _views(self, b: dict, q: int):
        R = q * self.rows_per_req
        inp = StepInputs(cu_num_rows=b["cu"][:q + 1], draft=b["draft"][:R],
                         req_of_row=b["req"][:R], row_in_req=b["rin"][:R],
                         temperature=b["temp"][:R], seeds=b["seeds"][:R], positions=b["pos"][:R],
                         top_k=b["top_k"][:R], min_p=b["min_p"][:R], top_p=b["top_p"][:R])
        return b["logits"][:R], inp, None if b["q"] is None else b["q"][:R]

    def _capture(self, q: int, fl: Flavour, dtype, device, q_width) -> None:
        prob = fl[4]
        plan = self.padded_plan(q, fl)
        b = self._buffers(dtype, device, q_width if prob else None)
        logits, inp, qs = self._views(b, q)
        if prob and qs is None:
            raise ValueError("probabilistic flavours need q_width")

        def run():
            return self.step.run(logits, inp, plan, qs)

        if device.type != "cuda":
            entry = _StandIn(run)
        else:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                run()  # compile + warm up (allocates the step's persistent scratch)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self._pool):
                out = run()
            entry = _Captured(graph, out)
        self._graphs[(q, fl, dtype, str(device))] = (entry, b)

    # --- serving ------------------------------------------------------------------
    def _reason(self, logits: torch.Tensor, plan: StepPlan, key) -> str | None:
        if not self._graphs:
            return "not_warmed_up"
        if plan.num_reqs > self.max_reqs:
            return "batch_above_captured"
        if plan.max_rows_per_req > self.rows_per_req:
            return "rows_per_request"
        canon = self.padded_plan(key[0], key[1])
        if key not in self._graphs or (plan.candidates, plan.escalation_slots > 0) != (
                canon.candidates, canon.escalation_slots > 0) or (
                plan.escalation_slots and plan.escalation_slots != plan.num_reqs) or (
                plan.escalation != canon.escalation):
            return "plan_not_captured"
        return None

    def _count(self, reason: str) -> None:
        if not self.uncaptured[reason]:
            self._log.warning("vllm-kimi-ext sharded verification: a step ran without a "
                              "captured graph (%s: %s); counted, logged once per reason",
                              reason, UNCAPTURED_REASONS[reason])
        self.uncaptured[reason] += 1

    def __call__(self, logits_shard: torch.Tensor, inp: StepInputs, plan: StepPlan,
                 q_full: torch.Tensor | None = None) -> StepOutput:
        q = next((c for c in self.capture_sizes if c >= plan.num_reqs), self.max_reqs)
        key = (q, flavour(plan), logits_shard.dtype, str(logits_shard.device))
        reason = self._reason(logits_shard, plan, key)
        if reason is not None:
            self._count(reason)
            return self.step.run(logits_shard, inp, plan, q_full)
        entry, b = self._graphs[key]
        s_logits, s_inp, s_q = self._views(b, q)
        dst = inp.req_of_row * self.rows_per_req + inp.row_in_req  # [rows]
        self._copy_in(s_logits, s_inp, s_q, dst, logits_shard, inp, q_full)
        entry.replay()
        self.replayed += 1
        out = entry.out
        n = plan.num_reqs
        return StepOutput(
            sampled=out.sampled[:n, :plan.max_rows_per_req].clone(),
            num_sampled=out.num_sampled[:n].clone(),
            accept_margin=out.accept_margin[dst], nucleus_margin=out.nucleus_margin[dst],
            uncertified=out.uncertified[dst], deferred=out.deferred[dst],
            stopped=out.stopped[:n])

    @staticmethod
    def _copy_in(s_logits, s_inp: StepInputs, s_q, dst, logits, inp: StepInputs, q) -> None:
        """Placeholders everywhere, then each real row at its padded position."""
        s_inp.draft.fill_(-1)
        s_inp.temperature.zero_()
        s_inp.top_k.zero_()
        s_inp.min_p.zero_()
        s_inp.top_p.fill_(1.0)
        s_logits.index_copy_(0, dst, logits)
        for name in ("draft", "temperature", "seeds", "positions", "top_k", "min_p", "top_p"):
            t = getattr(s_inp, name)
            t.index_copy_(0, dst, getattr(inp, name).to(t.dtype))
        if s_q is not None:
            s_q.index_copy_(0, dst, q.to(s_q.dtype))
