"""The folded escalation's Triton kernels (``verify/_kernels/escalate_folded.py``, launched
from ``verify/escalate/folded.py``) run by Triton's CPU interpreter:

1. ``send``: the send buffer (``_fold_send_kernel``, 16-column splits): each key slot's
   further candidates equal their torch body
   (:func:`~vllm_kimi_ext.verify.escalate.folded.further_candidates_torch`) on bf16 rows with
   many tied values and a padded tail, each whole-row slot's bytes are its shard row, an
   empty slot's bytes are never written (the buffer's sentinel stays), and the per-slot
   counters are zero again after the launch; with the last program's top-k over every
   split and with its rank bisection (``select``);
2. ``step``: the graph step on the Triton backend with ``escalation="folded"`` over the
   escalation's pins and tie-heavy rows (2 candidates per rank, so every cut escalates),
   each further-candidate width and whole-row slot count: equal to the full-logits reference
   on every rank (``check_graph_step`` asserts it), and the torch backend's tokens equal.

    TRITON_INTERPRET=1 python -m testkit.verify_folded_check [send]

With arguments: (1) for one seed (``send``: the CPU tier runs it) and the step cases of the
kinds named. Prints a JSON summary (the last line).
"""

from __future__ import annotations

import itertools
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
from vllm_kimi_ext.verify._kernels import escalate_folded as kf
from vllm_kimi_ext.verify.escalate.folded import SENT32, further_candidates_torch, send_folded
from vllm_kimi_ext.verify.protocol import folded_round_bytes

#: A byte no real send writes over a whole empty slot (an empty slot must stay all of it).
UNWRITTEN = 0xA5


def check_send(seed: int) -> dict:
    """Triton send buffer == torch bodies; an empty slot's bytes stay as they were; the
    counters are zeroed again."""
    g = torch.Generator().manual_seed(seed)
    E, S, n_valid = 5, 67, 61
    z = (torch.randint(-6, 6, (7, S), generator=g).float() / 4).to(torch.bfloat16)
    idx = torch.tensor([5, 0, 3, 6, 2])
    out = []
    widths = ((2, 4, 1, (1, 1, 0, 1, 1)), (3, 9, 0, (1, 0, 1, 1, 0)),
              (8, 40, 2, (0, 1, 1, 0, 1)), (30, 40, 1, (1, 1, 1, 0, 1)))
    for select, (W, W2, F, real) in itertools.product((False, True), widths):
        real8 = torch.tensor(real, dtype=torch.int8)
        nbytes = folded_round_bytes(E, W2, F, S, 2)
        store: dict = {}  # the step's folded scratch: the send kernel's counters
        buf = send_folded(store, z, idx, real8, W, W2, F, n_valid, nbytes, fill=UNWRITTEN,
                          select=select)[0]
        kb = (E - F) * W2 * 4
        keys = buf[:kb].view(torch.int32).view(E - F, W2)
        rows = buf[kb:kb + F * S * 2].view(torch.bfloat16).view(F, S)
        want = further_candidates_torch(z, idx[F:], W, W2, n_valid)
        for s in range(E):
            got = rows[s] if s < F else keys[s - F]
            if not real[s]:
                assert bool((got.view(torch.uint8) == UNWRITTEN).all()), (W, W2, F, s,
                                                                         "empty slot written")
            elif s < F:
                assert torch.equal(got, z[idx[s]]), (W, W2, F, s, "whole row differs")
            else:
                assert torch.equal(got, want[s - F]), (W, W2, F, s, got, want[s - F])
        assert int(store[str(z.device)].abs().sum()) == 0, "counters left set"
        out.append({"W": W, "W2": W2, "F": F, "select": select,
                    "sentinels": int((want == SENT32).sum())})
    return {"kind": "send", "seed": seed, "widths": out}


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
    kf.CHUNK = 16
    # the interpreter is slow: give the simulated ranks' all-gather barrier time
    verify_simulate.ThreadedGroup.__init__.__defaults__ = (1800.0,)
    verify_simulate.run_ranks.__defaults__ = (1800.0,)
    argv = sys.argv[1:] if argv is None else argv
    out = [check_send(0)] if argv else [check_send(0), check_send(1)]
    for kind, W2, F, tp in CASES:
        if argv and kind not in argv:
            continue
        out.append(check_step(kind, W2, F, tp))
    print(json.dumps({"cases": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
