"""Round 2, the escalation: the rows round 1 could not certify are cut exactly.

One module per escalation kind (:data:`.protocol.ESCALATIONS`, chosen by
:attr:`.protocol.StepPlan.escalation`), each with a ``resolve`` of one signature that holds
its torch body and its Triton launcher side by side: :mod:`.rows` (whole shard rows) and
:mod:`.folded` (further candidates and round 1's merge again, a whole row for the first
slots only). :data:`VARIANTS` is the one registry: another kind is a module beside these,
one entry here and its name in the contract's ``ESCALATIONS``. Every variant gets round 1's
gathered payload ``g`` (the folded kind merges it again through ``rank.merge``). A step can
be handed another mapping (:attr:`.graph_step.GraphVerifyStep.escalations`; the test kit's
histogram escalation, which the package does not ship, plugs in that way).
"""

from __future__ import annotations

import torch

from ..protocol import StepPlan
from ..ranks import ShardedRank
from ..step_io import Merged, StepInputs, constant
from . import folded, rows

#: The escalation kinds by :attr:`.protocol.StepPlan.escalation`.
VARIANTS = {"rows": rows, "folded": folded}


def resolve(rank: ShardedRank, logits_shard: torch.Tensor, inp: StepInputs, plan: StepPlan,
            merged: Merged, q_full: torch.Tensor | None, *, g: torch.Tensor, scratch: dict,
            triton: bool, variants=VARIANTS) -> torch.Tensor:
    """Round 2 of ``plan`` (nothing without escalation slots) on this ``rank`` (its shard
    geometry and ``all_gather``): updates ``merged`` in place and returns the deferred rows
    (uncertified, no slot). ``g``: round 1's gathered payload ``[TP, rows, width]``.
    ``variants``: the escalation kinds by name."""
    if not plan.escalation_slots:
        return constant(plan.num_rows, 0, merged.uncertified.dtype, merged.gval.device)
    variant = variants.get(plan.escalation)
    if variant is None:
        raise ValueError(f"StepPlan.escalation {plan.escalation!r}: this step knows "
                         f"{sorted(variants)}")
    return variant.resolve(rank, logits_shard, inp, plan, merged, q_full, g=g,
                           scratch=scratch, triton=triton)
