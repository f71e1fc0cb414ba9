"""Batch layout shared by the reference and the vocabulary-sharded verifier.

Layout (the same flattened layout vLLM's rejection sampler uses): request ``i``
owns logits rows ``cu_num_rows[i] .. cu_num_rows[i+1]-1``: one row per draft
token (the target's distribution at that draft position) followed by one bonus
row. ``draft_token_ids[j]`` is the draft token verified against row ``j``; the
entry of a bonus row is ignored, and ``-1`` marks a placeholder draft that must
be rejected (as in vLLM).

Output: ``sampled [num_reqs, max_k + 1]`` (accepted draft tokens, then the
recovered or bonus token, padded with ``-1``) and ``num_sampled [num_reqs]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class VerifyBatch:
    """Per-request verification inputs (everything except the logits)."""

    #: int64 ``[num_reqs + 1]``: row offsets (each request has ``k_i + 1 >= 1`` rows).
    cu_num_rows: torch.Tensor
    #: int64 ``[num_rows]``: draft token verified at each row (bonus rows: ignored).
    draft_token_ids: torch.Tensor
    #: float32 ``[num_reqs]``: 0 means greedy.
    temperature: torch.Tensor
    #: int64 ``[num_reqs]``: per-request seed of the counter-based noise.
    seeds: torch.Tensor
    #: int64 ``[num_reqs]`` or None; ``<= 0`` or ``>= vocab`` means off.
    top_k: torch.Tensor | None = None
    #: float32 ``[num_reqs]`` or None; 0 means off.
    min_p: torch.Tensor | None = None
    #: int64 ``[num_rows]`` or None: the sequence position of each row (noise key).
    #: Defaults to the row index inside its request.
    positions: torch.Tensor | None = None
    #: float32 ``[num_reqs]`` or None; 1 means off (vLLM requires ``0 < top_p <= 1``).
    top_p: torch.Tensor | None = None
    _layout: RowLayout | None = field(default=None, init=False, repr=False, compare=False)

    @staticmethod
    def from_draft_tokens(
        draft_tokens: Sequence[Sequence[int]] | torch.Tensor,
        temperature: Sequence[float] | torch.Tensor,
        seeds: Sequence[int] | torch.Tensor,
        top_k: Sequence[int] | torch.Tensor | None = None,
        min_p: Sequence[float] | torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        device: torch.device | str | None = None,
        top_p: Sequence[float] | torch.Tensor | None = None,
    ) -> VerifyBatch:
        """Build a batch from per-request draft token lists (``k_i`` may differ)."""
        if isinstance(draft_tokens, torch.Tensor):
            lists = [list(map(int, r)) for r in draft_tokens.tolist()]
        else:
            lists = [list(map(int, r)) for r in draft_tokens]
        lens = [len(r) + 1 for r in lists]
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        flat: list[int] = []
        for r in lists:
            flat.extend(r)
            flat.append(-1)
        dev = torch.device(device) if device is not None else torch.device("cpu")

        def _t(x, dtype):
            if x is None:
                return None
            if isinstance(x, torch.Tensor):
                return x.to(device=dev, dtype=dtype)
            return torch.tensor(list(x), dtype=dtype, device=dev)

        return VerifyBatch(
            cu_num_rows=torch.tensor(cu, dtype=torch.int64, device=dev),
            draft_token_ids=torch.tensor(flat, dtype=torch.int64, device=dev),
            temperature=_t(temperature, torch.float32),
            seeds=_t(seeds, torch.int64),
            top_k=_t(top_k, torch.int64),
            min_p=_t(min_p, torch.float32),
            positions=_t(positions, torch.int64),
            top_p=_t(top_p, torch.float32),
        )

    def replace(self, **changes) -> VerifyBatch:
        """A copy with some fields replaced (the cached layout is rebuilt lazily)."""
        return dataclasses.replace(self, **changes)

    @property
    def num_reqs(self) -> int:
        return int(self.cu_num_rows.numel()) - 1

    @property
    def num_rows(self) -> int:
        return int(self.draft_token_ids.numel())

    def layout(self) -> RowLayout:
        if self._layout is None:
            self._layout = RowLayout.build(self)
        return self._layout


@dataclass
class RowLayout:
    """Row-level views of a :class:`VerifyBatch` (computed once, host-side ints)."""

    num_reqs: int
    num_rows: int
    max_rows_per_req: int
    #: int64 [num_reqs + 1]
    cu_num_rows: torch.Tensor
    #: int64 [num_rows]
    req_of_row: torch.Tensor
    row_in_req: torch.Tensor
    is_bonus: torch.Tensor
    #: Per-row copies of per-request parameters.
    temperature: torch.Tensor
    seeds: torch.Tensor
    positions: torch.Tensor
    #: Draft token per row, forced to -1 on bonus rows.
    draft: torch.Tensor
    #: int64 [num_reqs, max_rows_per_req] row index (clamped) and validity mask.
    pad_index: torch.Tensor
    pad_valid: torch.Tensor
    #: Per-request top-k (0 = off), min-p (0 = off) and top-p (1 = off), already normalised.
    top_k: torch.Tensor
    min_p: torch.Tensor
    top_p: torch.Tensor

    @staticmethod
    def build(batch: VerifyBatch) -> RowLayout:
        cu = batch.cu_num_rows.to(torch.int64)
        dev = batch.draft_token_ids.device
        num_reqs = int(cu.numel()) - 1
        lens = cu[1:] - cu[:-1]
        if num_reqs > 0 and int(lens.min()) < 1:
            raise ValueError("every request needs at least its bonus row")
        num_rows = int(cu[-1]) if num_reqs > 0 else 0
        if num_rows != batch.draft_token_ids.numel():
            raise ValueError("cu_num_rows[-1] must equal len(draft_token_ids)")
        req_of_row = torch.repeat_interleave(torch.arange(num_reqs, device=dev), lens)
        row_in_req = torch.arange(num_rows, device=dev) - cu[:-1][req_of_row]
        is_bonus = row_in_req == (lens[req_of_row] - 1)
        draft = torch.where(is_bonus, torch.full_like(batch.draft_token_ids, -1),
                            batch.draft_token_ids.to(torch.int64))
        max_len = int(lens.max()) if num_reqs > 0 else 1
        steps = torch.arange(max_len, device=dev)
        pad_valid = steps[None, :] < lens[:, None]
        pad_index = torch.clamp(cu[:-1, None] + steps[None, :], max=max(num_rows - 1, 0))
        temperature = batch.temperature.to(device=dev, dtype=torch.float32)
        if batch.top_k is not None:
            top_k = batch.top_k.to(device=dev, dtype=torch.int64).clamp(min=0)
        else:
            top_k = torch.zeros(num_reqs, dtype=torch.int64, device=dev)
        if batch.min_p is not None:
            min_p = batch.min_p.to(device=dev, dtype=torch.float32)
        else:
            min_p = torch.zeros(num_reqs, dtype=torch.float32, device=dev)
        if batch.top_p is not None:
            top_p = batch.top_p.to(device=dev, dtype=torch.float32)
            if num_reqs and not bool(((top_p > 0) & (top_p <= 1)).all()):
                raise ValueError("VerifyBatch.top_p: every value must be in (0, 1]")
        else:
            top_p = torch.ones(num_reqs, dtype=torch.float32, device=dev)
        positions = (
            batch.positions.to(device=dev, dtype=torch.int64)
            if batch.positions is not None
            else row_in_req
        )
        return RowLayout(
            num_reqs=num_reqs,
            num_rows=num_rows,
            max_rows_per_req=max_len,
            cu_num_rows=cu.contiguous(),
            req_of_row=req_of_row,
            row_in_req=row_in_req,
            is_bonus=is_bonus,
            temperature=temperature[req_of_row],
            seeds=batch.seeds.to(device=dev, dtype=torch.int64)[req_of_row],
            positions=positions,
            draft=draft.contiguous(),
            pad_index=pad_index,
            pad_valid=pad_valid,
            top_k=top_k,
            min_p=min_p,
            top_p=top_p,
        )

    def effective_top_k(self, vocab_size: int) -> torch.Tensor:
        """Per-request top-k with "off" (<= 0 or >= vocab) mapped to 0; greedy rows off."""
        k = torch.where(self.top_k >= vocab_size, torch.zeros_like(self.top_k), self.top_k)
        greedy = self.temperature_per_req() == 0
        return torch.where(greedy, torch.zeros_like(k), k)

    def effective_min_p(self) -> torch.Tensor:
        greedy = self.temperature_per_req() == 0
        return torch.where(greedy, torch.zeros_like(self.min_p), self.min_p)

    def effective_top_p(self) -> torch.Tensor:
        """Per-request top-p with greedy requests off (1.0)."""
        greedy = self.temperature_per_req() == 0
        return torch.where(greedy, torch.ones_like(self.top_p), self.top_p)

    def temperature_per_req(self) -> torch.Tensor:
        out = torch.zeros(self.num_reqs, dtype=torch.float32, device=self.temperature.device)
        out[self.req_of_row] = self.temperature
        return out


@dataclass
class VerifyOutput:
    """Verification result, in vLLM's ``(sampled, num_sampled)`` convention."""

    #: int64 ``[num_reqs, max_k + 1]``, padded with -1.
    sampled: torch.Tensor
    #: int32 ``[num_reqs]``: accepted drafts + 1 (the recovered or bonus token).
    num_sampled: torch.Tensor
    #: float32 ``[num_rows]``: ``log(p(x)/q(x)) - log(u)`` of the accept test of each
    #: sampling row (accept iff > 0); NaN for greedy rows. Diagnostic only: used to
    #: certify that a disagreement between two implementations sits within float
    #: rounding of the acceptance threshold.
    accept_margin: torch.Tensor | None = None
    #: float64 ``[num_rows]``: distance of the top-p target from the cumulative mass
    #: on either side of the nucleus cut (NaN for rows without top-p). Diagnostic
    #: only: a nucleus that differs between two implementations must sit within
    #: float rounding of it.
    nucleus_margin: torch.Tensor | None = None

    def tokens(self) -> list[list[int]]:
        return [
            row[:n] for row, n in zip(self.sampled.tolist(), self.num_sampled.tolist())
        ]


def first_rejection(layout: RowLayout, accept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per request: number of accepted drafts and the decision row.

    ``accept [num_rows]`` must be False on bonus rows. The decision row is the
    first rejected row (bonus row if every draft passed).
    """
    acc = accept[layout.pad_index] & layout.pad_valid
    num_accepted = torch.cumprod(acc.to(torch.int64), dim=1).sum(dim=1)
    start = layout.pad_index[:, 0] if layout.num_rows > 0 else num_accepted
    decision_row = start + num_accepted
    return num_accepted, decision_row


def assemble_output(
    layout: RowLayout,
    num_accepted: torch.Tensor,
    decision_row: torch.Tensor,
    decision_token: torch.Tensor,
    accept_margin: torch.Tensor | None = None,
    nucleus_margin: torch.Tensor | None = None,
) -> VerifyOutput:
    """Write accepted drafts and the decision token into vLLM's padded output."""
    steps = torch.arange(layout.max_rows_per_req, device=num_accepted.device)
    drafts = layout.draft[layout.pad_index]
    sampled = torch.where(steps[None, :] < num_accepted[:, None], drafts,
                          torch.full_like(drafts, -1))
    sampled.scatter_(1, num_accepted[:, None], decision_token[:, None].to(torch.int64))
    return VerifyOutput(
        sampled=sampled,
        num_sampled=(num_accepted + 1).to(torch.int32),
        accept_margin=accept_margin,
        nucleus_margin=nucleus_margin,
    )
