"""The verify step's device tensors: its per-row inputs (:class:`StepInputs`, fixed shapes,
built with device ops only), round 1's merged statistics that the later rounds read and
update (:class:`Merged`), its outputs (:class:`StepOutput`) and the read-only constants a
captured step shares (:func:`constant`). The host-side plan they
travel with is :class:`~.protocol.StepPlan`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .batch import RowLayout


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
    #: float32: the row's maximum of ``z / T`` (rows with a cut; read by the split
    #: escalation and the histogram escalation).
    row_max: torch.Tensor | None = None


_CONSTANTS: dict = {}


def constant(n: int, value, dtype: torch.dtype, device) -> torch.Tensor:
    """A cached read-only ``[n]`` tensor filled with ``value``, made on first use (the
    eager warm-up, before any capture): a captured step reads it with no fill launch."""
    key = (n, value if value == value else "nan", dtype, str(device))
    if key not in _CONSTANTS:
        _CONSTANTS[key] = torch.full((n,), value, dtype=dtype, device=device)
    return _CONSTANTS[key]
