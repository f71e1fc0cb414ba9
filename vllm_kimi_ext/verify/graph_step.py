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
   hold an unsent token before the cut; :func:`.step_torch.merge_round1_torch`): its nucleus,
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

Two implementations of every stage share one contract: torch (:mod:`.step_torch`, any
device; the CPU tier runs it) and Triton (:mod:`._graph_kernels`,
:mod:`._escalate_kernels`; split-row: many programs per row at small batches). A step
picks one for all its stages with :meth:`.ranks.ShardedRank.uses_triton`.
"""

from __future__ import annotations

import torch

from . import step_torch as st
from .kernels import shard_local_stats
from .ranks import AllGather, ShardedRank
from .step_plan import StepInputs, StepOutput, StepPlan
from .step_torch import constant

NEG_INF = float("-inf")


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

    def run(self, logits_shard: torch.Tensor, inp: StepInputs, plan: StepPlan,
            q_full: torch.Tensor | None = None) -> StepOutput:
        V, off = self.vocab_size, self.col_offset
        if tuple(logits_shard.shape) != (plan.num_rows, self.shard_width):
            raise ValueError(f"expected logits shard [{plan.num_rows}, {self.shard_width}], "
                             f"got {tuple(logits_shard.shape)}")
        if (q_full is not None) != plan.probabilistic:
            raise ValueError("q_full must be given exactly when the plan is probabilistic")
        tri = self.uses_triton(logits_shard)
        if plan.stats_only:
            return self._stats_only(logits_shard, inp, plan, tri)
        if tri:
            from . import _graph_kernels as gk

            payload = gk.round1_payload(logits_shard, inp, plan, off, V, q_full)
        else:
            payload = st.round1_payload_torch(logits_shard, inp, plan, off, V, q_full)
        g = self._gather(payload, plan.num_rows, plan.round1_width)
        rv = self.rank_valid(g.device)
        if tri:
            merged = gk.merge_round1(g, inp, plan, V, rv, q_full)
        else:
            merged = st.merge_round1_torch(g, inp, plan, V, rv, q_full)
        if plan.escalation_slots:
            deferred = self._escalate(logits_shard, inp, plan, merged, q_full, tri)
        else:
            deferred = constant(plan.num_rows, 0, merged.uncertified.dtype, g.device)
        decide = gk.decide_merged if tri else st.decide_merged_torch
        sampled, num_sampled, drow, margin, stopped = decide(merged, deferred, inp, plan, V)
        if plan.residual_round:
            rows = drow.clamp(max=plan.num_rows - 1)
            res = st.residual_payload_torch(logits_shard, inp, merged, rows, q_full, off, V)
            gr = self._gather(res, plan.num_reqs, 2)
            sampled = st.apply_residual(gr, inp, rows, num_sampled, stopped, sampled, V)
        return StepOutput(sampled=sampled, num_sampled=num_sampled, accept_margin=margin,
                          nucleus_margin=merged.nucleus_margin, uncertified=merged.uncertified,
                          deferred=deferred, stopped=stopped)

    def _gather(self, t: torch.Tensor, rows: int, width: int) -> torch.Tensor:
        g = self.all_gather(t)
        if tuple(g.shape[:3]) != (self.tp_size, rows, width):
            raise RuntimeError(f"all_gather returned {tuple(g.shape)}")
        return g

    def _escalate(self, logits_shard, inp, plan, merged, q_full, tri) -> torch.Tensor:
        """Round 2: whole rows for the picked uncertified rows; updates ``merged`` in place
        and returns the deferred rows (uncertified, no slot). One-hot drafts on the Triton
        path: the split bf16 escalation with this step's persistent scratch."""
        if tri and q_full is None:
            from . import _graph_kernels as gk

            idx, real8, deferred = gk.pick_slots(merged.uncertified, inp.row_in_req,
                                                 plan.escalation_slots)
            g = self.all_gather(logits_shard.index_select(0, idx))  # [TP, E, S]
            return gk.escalate_one_hot(g, idx, real8, inp, merged, self.vocab_size, deferred,
                                       self._escalation_scratch)
        return st.escalate_torch(logits_shard, inp, plan, merged, self.all_gather,
                                 self.vocab_size, q_full, "triton" if tri else "torch")

    def _stats_only(self, logits_shard, inp, plan, tri) -> StepOutput:
        """Greedy / temperature rows without a cut, one-hot drafts: one all-gather of
        ``(gval, gidx[, lse, s_x])`` per row and one decision launch."""
        V, off, R = self.vocab_size, self.col_offset, plan.num_rows
        stats = shard_local_stats(logits_shard, inp.temperature, None, inp.draft, inp.seeds,
                                  inp.positions, off, V, exclude_draft=True,
                                  backend=self.backend, width=plan.round1_width)
        g = self._gather(stats, R, plan.round1_width)
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
            merged = st.merge_stats_torch(g, plan)
            sampled, num_sampled, drow, margin, stopped = st.decide_merged_torch(
                merged, no, inp, plan, V)
        return StepOutput(sampled=sampled, num_sampled=num_sampled, accept_margin=margin,
                          nucleus_margin=nan64, uncertified=no, deferred=no, stopped=stopped)


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
