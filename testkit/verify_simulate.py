"""In-process simulation of a tensor-parallel group (one thread per rank).

:class:`ThreadedGroup` gives each simulated rank an ``all_gather`` with real
collective semantics (every rank blocks until all have contributed, then all
receive the same ``[TP, ...]`` stack), so the sharded verifier runs unchanged
and any rank-divergent control flow deadlocks (reported as an error after a
timeout) instead of silently passing. It also records every collective, for
comparison with the step's :class:`~vllm_kimi_ext.verify.protocol.StepPlan`.

:func:`plan_for_layout` is the test kit's plan builder: it reads a
:class:`~vllm_kimi_ext.verify.batch.RowLayout`'s tensors on the host (the product plans
from the requests' parameters with
:func:`~vllm_kimi_ext.verify.protocol.plan_from_params`, which never reads a device
value); :func:`simulate_sharded_verify` runs the product's
:class:`~vllm_kimi_ext.verify.graph_step.GraphVerifyStep` on every simulated rank.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from vllm_kimi_ext.verify.batch import RowLayout, VerifyBatch, VerifyOutput
from vllm_kimi_ext.verify.graph_step import GraphVerifyStep
from vllm_kimi_ext.verify.protocol import StepPlan, plan_step
from vllm_kimi_ext.verify.ranks import AllGather
from vllm_kimi_ext.verify.step_io import StepInputs, StepOutput


class ThreadedGroup:
    def __init__(self, world_size: int, timeout_s: float = 120.0):
        self.world_size = world_size
        self._barrier = threading.Barrier(world_size, timeout=timeout_s)
        self._slots: list[torch.Tensor | None] = [None] * world_size
        #: Per rank: list of (shape, bytes sent) per collective.
        self.calls: list[list[tuple[tuple[int, ...], int]]] = [[] for _ in range(world_size)]
        #: Per rank: what each all-gather returned (for replaying one rank alone).
        self.received: list[list[torch.Tensor]] = [[] for _ in range(world_size)]

    def all_gather_fn(self, rank: int) -> AllGather:
        def all_gather(t: torch.Tensor) -> torch.Tensor:
            self.calls[rank].append((tuple(t.shape), t.numel() * t.element_size()))
            self._slots[rank] = t
            self._barrier.wait()
            try:
                out = torch.stack([s.clone() for s in self._slots])  # type: ignore[union-attr]
            finally:
                self._barrier.wait()
            self.received[rank].append(out)
            return out

        return all_gather

    def abort(self) -> None:
        self._barrier.abort()


def run_ranks(world_size: int, fn: Callable[[int, AllGather], Any],
              timeout_s: float = 120.0) -> tuple[list[Any], ThreadedGroup]:
    """Run ``fn(rank, all_gather)`` on ``world_size`` threads; return results by rank."""
    group = ThreadedGroup(world_size, timeout_s)
    results: list[Any] = [None] * world_size
    errors: list[BaseException | None] = [None] * world_size

    def body(rank: int) -> None:
        try:
            results[rank] = fn(rank, group.all_gather_fn(rank))
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors[rank] = e
            group.abort()

    if world_size == 1:
        body(0)
    else:
        threads = [threading.Thread(target=body, args=(r,), daemon=True)
                   for r in range(world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    real = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
    if real:
        raise real[0]
    if any(e is not None for e in errors):
        raise next(e for e in errors if e is not None)
    return results, group


def shard_columns(full: torch.Tensor, tp_size: int, vocab_size: int,
                  shard_width: int | None = None, pad_value: float = 0.0) -> list[torch.Tensor]:
    """Split ``[rows, V]`` into ``tp_size`` shards of width ``S`` (padding filled with
    ``pad_value``: it must never matter)."""
    S = shard_width or -(-vocab_size // tp_size)
    rows = full.shape[0]
    padded = torch.full((rows, S * tp_size), pad_value, dtype=full.dtype, device=full.device)
    padded[:, :vocab_size] = full[:, :vocab_size]
    return [padded[:, r * S:(r + 1) * S].contiguous() for r in range(tp_size)]


def plan_for_layout(L: RowLayout, *, tp_size: int, shard_width: int, vocab_size: int,
                    probabilistic: bool = False, candidates: int | None = None,
                    escalation_slots: int | None = None, logits_bytes: int = 2,
                    escalation: str | None = None,
                    row_fallback_slots: int | None = None,
                    folded_candidates: int | None = None) -> StepPlan:
    """:func:`~vllm_kimi_ext.verify.protocol.plan_step` from a layout's tensors (host
    reads: tests and benchmarks only). ``escalation="hist"``: the test kit's histogram
    escalation (:func:`testkit.verify_hist_step.hist_plan`) with ``row_fallback_slots``;
    ``escalation="folded"``: the package's folded escalation (``row_fallback_slots``,
    ``folded_candidates``)."""
    r = L.req_of_row
    k = L.effective_top_k(vocab_size)[r]
    mp = L.effective_min_p()[r]
    tp = L.effective_top_p()[r]
    sampling = L.temperature > 0
    cut = sampling & ((k > 0) | (mp > 0) | (tp < 1))
    if escalation not in (None, "rows", "hist", "folded"):
        raise ValueError(f"escalation must be 'rows', 'hist' or 'folded', got {escalation!r}")
    fold = ({} if escalation != "folded" else
            dict(escalation="folded", row_fallback_slots=row_fallback_slots,
                 folded_candidates=folded_candidates))
    plan = plan_step(
        tp_size=tp_size, shard_width=shard_width, num_rows=L.num_rows, num_reqs=L.num_reqs,
        max_rows_per_req=L.max_rows_per_req,
        all_greedy=bool((L.temperature_per_req() == 0).all()),
        any_cut=bool(cut.any()), max_top_k=int(k.max()) if L.num_rows else 0,
        may_escalate=bool((cut & (k == 0) & ((tp < 1) | (mp > 0))).any()),
        probabilistic=probabilistic, any_uncut_sampling=bool((sampling & ~cut).any()),
        candidates=candidates, escalation_slots=escalation_slots, logits_bytes=logits_bytes,
        **fold)
    if escalation == "hist":
        from testkit.verify_hist_step import hist_plan

        return hist_plan(plan, row_fallback_slots)
    return plan


def simulate_graph_step(logits: torch.Tensor, batch: VerifyBatch, tp_size: int,
                        vocab_size: int, draft_probs: torch.Tensor | None = None, *,
                        shard_width: int | None = None, pad_value: float = 0.0,
                        backend: str = "torch", step_cls: type = GraphVerifyStep,
                        **plan_kw) -> tuple[list[StepOutput], ThreadedGroup, StepPlan]:
    """Every rank's :class:`StepOutput` (rank order), the group and the plan
    (``plan_kw``: ``candidates``, ``escalation_slots``)."""
    shards = shard_columns(logits, tp_size, vocab_size, shard_width, pad_value)
    L = batch.layout()
    inp = StepInputs.from_layout(L, vocab_size)
    plans = {}

    if plan_kw.get("escalation") == "hist" and step_cls is GraphVerifyStep:
        from testkit.verify_hist_step import HistVerifyStep

        step_cls = HistVerifyStep

    def fn(rank, ag) -> StepOutput:
        step = step_cls(vocab_size, tp_size, rank, ag, shard_width=shard_width, backend=backend)
        plan = plan_for_layout(L, tp_size=tp_size, shard_width=step.shard_width,
                               vocab_size=vocab_size, probabilistic=draft_probs is not None,
                               logits_bytes=logits.element_size(), **plan_kw)
        plans[rank] = plan
        return step.run(shards[rank], inp, plan, draft_probs)

    outs, group = run_ranks(tp_size, fn)
    return outs, group, plans[0]


def as_verify_output(o: StepOutput) -> VerifyOutput:
    return VerifyOutput(sampled=o.sampled, num_sampled=o.num_sampled,
                        accept_margin=o.accept_margin, nucleus_margin=o.nucleus_margin)


def simulate_sharded_verify(
    logits: torch.Tensor,
    batch: VerifyBatch,
    tp_size: int,
    vocab_size: int,
    draft_probs: torch.Tensor | None = None,
    *,
    shard_width: int | None = None,
    pad_value: float = 0.0,
    backend: str = "torch",
    **plan_kw: Any,
) -> tuple[VerifyOutput, ThreadedGroup, list[VerifyOutput]]:
    """The product's step on all ranks in-process, as the reference's output type.

    Returns rank 0's output, the group (collective log) and every rank's output (which
    must all be identical). One escalation slot per row unless ``plan_kw`` says
    otherwise, so no row is deferred and the output is comparable with the reference
    token for token."""
    plan_kw.setdefault("escalation_slots", batch.num_rows)
    outs, group, _ = simulate_graph_step(logits, batch, tp_size, vocab_size, draft_probs,
                                         shard_width=shard_width, pad_value=pad_value,
                                         backend=backend, **plan_kw)
    conv = [as_verify_output(o) for o in outs]
    return conv[0], group, conv
