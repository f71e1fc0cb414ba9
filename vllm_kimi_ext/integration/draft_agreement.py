"""Opt-in debug check: every tensor-parallel rank proposed the same draft tokens.

A draft run un-sharded (``draft_tensor_parallel_size: 1``) computes its tokens
independently on every rank; they agree by construction (same weights, same
inputs, deterministic kernels), and verification relies on it. vLLM (the
``eagle-draft-tp1`` git patch) then broadcasts rank 0's draft tokens, so ranks
always verify the same tokens. This check shows whether they would have differed:
it all-gathers each rank's own draft token ids over the target's tensor-parallel
group just before that broadcast and raises on any difference. It costs one small
all-gather per step, so it is off unless ``VLLM_KIMI_EXT_CHECK_DRAFT_AGREEMENT=1``
(the patch: ``vllm_kimi_ext/runtime/draft_model_speculator.py``).
"""

from __future__ import annotations

from typing import Any


class DraftDisagreement(RuntimeError):
    """Tensor-parallel ranks proposed different draft tokens."""


def check_draft_agreement(draft_tokens, group=None) -> None:
    """All-gather ``draft_tokens`` over ``group`` (default: the TP group) and
    raise :class:`DraftDisagreement` naming the first differing rank, request
    row and draft position when any rank's tokens differ from rank 0's."""
    import torch
    from vllm.distributed import get_tp_group

    group = group or get_tp_group()
    if group.world_size == 1:
        return
    local = draft_tokens.to(torch.int64).contiguous()
    gathered = group.all_gather(local.unsqueeze(0), dim=0)  # [world, *shape]
    reference = gathered[0]
    for rank in range(1, group.world_size):
        diff = (gathered[rank] != reference).nonzero()
        if diff.numel():
            where = tuple(int(i) for i in diff[0])
            raise DraftDisagreement(
                f"draft tokens differ between TP rank 0 and rank {rank} at "
                f"(request row, draft position) {where}: "
                f"{int(reference[where])} vs {int(gathered[rank][where])} "
                f"({diff.shape[0]} of {reference.numel()} positions differ). "
                "An un-sharded draft must compute identical tokens on every rank; "
                "check for non-deterministic kernels or rank-dependent inputs.")


def check_after_propose(speculator: Any, draft_tokens) -> None:
    """:func:`check_draft_agreement` when ``speculator`` runs its draft un-sharded
    (only then does each rank compute its draft tokens on its own). Called with the
    tokens each rank drafted, before vLLM broadcasts rank 0's."""
    if getattr(speculator, "draft_runs_unsharded", False):
        check_draft_agreement(draft_tokens)
