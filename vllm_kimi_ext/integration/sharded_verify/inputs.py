"""The sharded step's inputs from vLLM's batch: the drafts in the step's row layout, the
per-row sampling parameters (:class:`~vllm_kimi_ext.verify.step_io.StepInputs`) and, with
probabilistic drafts, the draft distribution ``q``. Device ops only (no host read)."""

from __future__ import annotations

from typing import Any

import torch

from vllm_kimi_ext.verify.step_io import StepInputs


def bonus_layout_drafts(draft_sampled: torch.Tensor, cu_num_logits: torch.Tensor) -> torch.Tensor:
    """vLLM's ``draft_sampled[j]`` is the input token at logits row ``j``; the
    draft verified at row ``j`` is the input token of row ``j + 1`` of the same
    request, and each request's last row is its bonus row (draft -1)."""
    n = draft_sampled.shape[0]
    nxt = torch.empty_like(draft_sampled)
    nxt[:-1] = draft_sampled[1:]
    nxt[-1:] = -1
    last = (cu_num_logits[1:] - 1).long()
    nxt[last] = -1
    return nxt[:n].long()


def draft_probs_full(values: torch.Tensor, expanded_idx_mapping: torch.Tensor,
                     expanded_local_pos: torch.Tensor, temperature_rows: torch.Tensor,
                     vocab_size: int) -> torch.Tensor:
    """The draft distribution ``q`` per logits row over the whole vocabulary, as vLLM's
    rejection sampler defines it: ``softmax(draft_logits[req, step, :V] / T)`` with the
    pre-temperature cache row of the request state and draft step of each row
    (``rejection_sample`` divides the cached logits by the request temperature and
    normalises over ``min(V, V')`` columns; no top-k/top-p/min-p on ``q``). Every rank
    holds the replicated cache, so this needs no collective. Bonus rows (no draft) get the
    last step's row (never used); greedy rows use T = 1 (their ``q`` is never used
    either)."""
    steps = values.shape[1]
    step = expanded_local_pos.long().clamp(max=steps - 1)
    z = values[expanded_idx_mapping.long(), step, :vocab_size].float()
    t = torch.where(temperature_rows > 0, temperature_rows, torch.ones_like(temperature_rows))
    return torch.softmax(z / t[:, None], dim=-1)


def step_inputs(input_batch: Any, states: Any, draft_sampled: torch.Tensor,
                positions: torch.Tensor, vocab_size: int) -> StepInputs:
    """:class:`StepInputs` from vLLM's ``InputBatch`` and ``SamplingStates`` (the tensors
    vLLM's own rejection sampler reads) and the gathered drafts / positions."""
    idx = input_batch.idx_mapping
    return StepInputs.from_requests(
        input_batch.cu_num_logits, bonus_layout_drafts(draft_sampled, input_batch.cu_num_logits),
        states.temperature.gpu[idx], states.seeds.gpu[idx], positions, states.top_k.gpu[idx],
        states.min_p.gpu[idx], states.top_p.gpu[idx], vocab_size)


def draft_q(cache: Any, input_batch: Any, states: Any, vocab_size: int) -> torch.Tensor | None:
    """``q`` of vLLM's cached draft logits (``draft_sample_method="probabilistic"``), or
    None for one-hot drafts."""
    if cache is None:
        return None
    rows = input_batch.expanded_idx_mapping
    return draft_probs_full(cache.values, rows, input_batch.expanded_local_pos,
                            states.temperature.gpu[rows].float(), vocab_size)
