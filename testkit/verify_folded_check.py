"""The folded escalation's Triton kernels (``verify/_folded_kernels.py``) run by Triton's CPU
interpreter:

1. ``further``: the candidate selection of picked rows (``_fold_cand_kernel`` +
   ``_fold_top_kernel``, 16-column splits) equals its torch body
   (:func:`~vllm_kimi_ext.verify.escalate_folded.further_candidates_torch`) on bf16 rows with
   many tied values and a padded tail, and writes nothing for an empty slot;
2. ``step``: the graph step on the Triton backend with ``escalation="folded"`` over the
   escalation's pins and tie-heavy rows (2 candidates per rank, so every cut escalates),
   each further-candidate width and whole-row slot count: equal to the full-logits reference
   on every rank (``check_graph_step`` asserts it), and the torch backend's tokens equal.

    TRITON_INTERPRET=1 python -m testkit.verify_folded_check

Prints a JSON summary (the last line).
"""

from __future__ import annotations

import json
import sys

import torch

from testkit import verify_simulate
from testkit.verify_cases import (
    PIN_V,
    deep_cut,
    random_top_p_batch,
    shaped_logits,
    ties_past_the_cut,
)
from testkit.verify_graph_sim import check_graph_step
from vllm_kimi_ext.verify import _folded_kernels as fk
from vllm_kimi_ext.verify.escalate_folded import SENT32, further_candidates_torch


def check_further(seed: int) -> dict:
    """Triton selection == torch body; an empty slot's output stays as it was."""
    g = torch.Generator().manual_seed(seed)
    E, S, n_valid = 4, 67, 61
    z = (torch.randint(-6, 6, (7, S), generator=g).float() / 4).to(torch.bfloat16)
    idx = torch.tensor([5, 0, 3, 6])
    real = torch.tensor([1, 1, 0, 1], dtype=torch.int8)
    out = []
    for W, W2 in ((2, 4), (3, 9), (8, 40), (30, 40)):
        got = torch.full((E * W2,), 12345, dtype=torch.int32)
        fk.further_candidates(z, idx, real, W, W2, n_valid, got)
        got = got.view(E, W2)
        want = further_candidates_torch(z, idx, W, W2, n_valid)
        for s in range(E):
            if real[s]:
                assert torch.equal(got[s], want[s]), (W, W2, s, got[s], want[s])
            else:
                assert bool((got[s] == 12345).all()), (W, W2, s, "empty slot written")
        out.append({"W": W, "W2": W2, "sentinels": int((want == SENT32).sum())})
    return {"kind": "further", "seed": seed, "widths": out}


def check_step(kind: str, W2: int, F: int, tp: int, seed: int = 0) -> dict:
    if kind.startswith("ties_past_cut"):
        b, z = ties_past_the_cut(16, past=4, draft_past=kind.endswith("draft"))
        V = PIN_V
    elif kind == "deep_cut":
        b, z = deep_cut(7)
        V = PIN_V
    else:
        g = torch.Generator().manual_seed(seed)
        V = 211
        b = random_top_p_batch(g, 3, V, "top_p_min_p")
        z = shaped_logits(g, b, V, "ties").to(torch.bfloat16)
    kw = dict(candidates=2, escalation="folded", folded_candidates=W2, row_fallback_slots=F,
              allow_first_row_deferral=True)
    o, _, plan, stopped = check_graph_step(z, b, V, tp, backend="triton", **kw)
    ot, _, _, _ = check_graph_step(z, b, V, tp, backend="torch", **kw)
    assert torch.equal(o.sampled, ot.sampled) and torch.equal(o.num_sampled, ot.num_sampled)
    assert torch.equal(o.deferred.bool(), ot.deferred.bool()), (o.deferred, ot.deferred)
    return {"kind": kind, "W2": W2, "F": F, "tp": tp, "escalation": plan.escalation,
            "uncertified": int(o.uncertified.sum()), "deferred": int(o.deferred.sum()),
            "stopped": len(stopped)}


CASES = (("ties_past_cut", 64, 0, 2), ("ties_past_cut_draft", 64, 1, 2), ("deep_cut", 64, 1, 4),
         ("ties_past_cut", 3, 1, 2), ("ties", 2, 1, 2), ("ties", 64, 0, 4))


def main(argv: list[str] | None = None) -> int:
    fk.CHUNK = 16
    # the interpreter is slow: give the simulated ranks' all-gather barrier time
    verify_simulate.ThreadedGroup.__init__.__defaults__ = (1800.0,)
    verify_simulate.run_ranks.__defaults__ = (1800.0,)
    out = [check_further(0), check_further(1)]
    for kind, W2, F, tp in CASES:
        out.append(check_step(kind, W2, F, tp))
    print(json.dumps({"cases": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
