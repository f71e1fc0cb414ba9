"""The graph step's histogram escalation (``StepPlan.escalation == "hist"``,
``verify/step_hist.py``) on the Triton backend, run by Triton's CPU interpreter: the
Triton merge (int8 flags), shard statistics and decision around the histogram rounds.
With 2 candidates per rank every cut escalates; each case must equal the full-logits
reference on every rank (``check_graph_step`` asserts it).

    TRITON_INTERPRET=1 python -m testkit.verify_hist_check

Prints a JSON summary: per case the escalated rows cut by the histograms, the deferred
rows and whether an edge row took the whole-row slot.
"""

from __future__ import annotations

import json

import torch

from testkit.verify_cases import PIN_V, deep_cut, ties_past_the_cut
from testkit.verify_graph_sim import check_graph_step
from vllm_kimi_ext.verify import VerifyBatch


def edge_case():
    """Two requests whose cut sits on a token edge (two tokens tied at 0, the rest at -40,
    top_p 0.5): the histograms leave them to the whole-row slots."""
    z = torch.full((PIN_V,), -40.0)
    z[[3, 150]] = 0.0
    b = VerifyBatch.from_draft_tokens(torch.full((2, 2), 7), [1.0, 1.0], [1, 2],
                                      top_p=[0.5, 0.5])
    return b, z.expand(b.num_rows, PIN_V).contiguous().to(torch.bfloat16)


def main() -> None:
    cases = {"ties_past_cut": (ties_past_the_cut(16, past=4), 0),
             "ties_past_cut_draft": (ties_past_the_cut(16, past=4, draft_past=True), 0),
             "deep_cut_7": (deep_cut(7), 0), "edge": (edge_case(), 2)}
    out = []
    for name, ((b, z), slots) in cases.items():
        o, _, plan, stopped = check_graph_step(z, b, PIN_V, 2, candidates=1 if slots else 2,
                                               backend="triton", escalation="hist",
                                               row_fallback_slots=slots)
        out.append({"kind": name, "escalation": plan.escalation,
                    "uncertified": int(o.uncertified.sum()), "deferred": int(o.deferred.sum()),
                    "slots": plan.escalation_slots, "whole_row_slots": slots,
                    "first_rows_deferred": [int(o.deferred[int(c)])
                                            for c in b.cu_num_rows[:-1]]})
    print(json.dumps({"cases": out}))


if __name__ == "__main__":
    main()
