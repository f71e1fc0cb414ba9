"""The graph step's split bf16 escalation (``verify/escalate/rows.py``, kernels in
``verify/_kernels/escalate_split.py``) run by Triton's CPU interpreter: with 2 candidates
per rank most nucleus cuts are left uncertified, so the histogram walk, the tied tokens
kept in id order and the chunk merge decide them; each case must equal the full-logits
reference on every rank (``check_graph_step`` asserts it) and leave every rank's scratch zeroed.

    TRITON_INTERPRET=1 python -m testkit.verify_escalation_check [KIND ...]

Prints a JSON summary. Chunks of 16 columns and walk steps of 32 keys make a
211-token row span many chunks and walk steps, as Kimi's 163840 do at full size.
"""

from __future__ import annotations

import json
import sys

import torch

from testkit.verify_cases import (
    deep_cut,
    random_top_p_batch,
    shaped_logits,
    tied_batch,
    tied_rows,
    ties_past_the_cut,
)
from testkit.verify_graph_sim import check_graph_step, dirty_scratch, recording_step
from vllm_kimi_ext.verify import decide as decide_round
from vllm_kimi_ext.verify._kernels import escalate_split as ek
from vllm_kimi_ext.verify.graph_step import GraphVerifyStep
from vllm_kimi_ext.verify.reference import sampling_keep_mask
from vllm_kimi_ext.verify.rowmath import gumbel_at
from vllm_kimi_ext.verify.step_io import StepInputs

V = 211
CASES = (("ties", "top_p", 7), ("flat", "top_p_min_p", 8), ("ties", "top_p_min_p", 9))
#: The escalation's pins: 4 tied tokens past the cut in the re-read chunk (more in later
#: chunks), the draft elsewhere or among them; cuts 5-10 nats below the row maximum.
PIN_CASES = (("ties_past_cut", "top_p", 4), ("ties_past_cut_draft", "top_p", 4),
             *(("deep_cut", "top_p", d) for d in (5, 7, 10)))


def _expected(z: torch.Tensor, inp: StepInputs, r: int) -> dict:
    """The escalated row ``r``'s statistics from its full row."""
    s = z[r].float() / inp.temperature[r]
    keep, margin = sampling_keep_mask(s[None], inp.top_k[r:r + 1], inp.min_p[r:r + 1],
                                      inp.top_p[r:r + 1])
    keep = keep[0]
    ids = torch.arange(V)
    x = int(inp.draft[r])
    score = torch.where(keep & (ids != x), s + gumbel_at(inp.seeds[r:r + 1],
                                                          inp.positions[r:r + 1], ids[None])[0],
                        torch.tensor(float("-inf")))
    best = score.max()
    return {"gidx": int(ids[score == best].min()) if best > float("-inf") else -1,
            "lse": float(torch.logsumexp(s[keep].double(), 0)),
            "sx": float(s[x]) if 0 <= x < V and bool(keep[x]) else float("-inf"),
            "margin": float(margin[0])}


def _check_rows(z, inp, seen: list) -> int:
    """Compare every rank's merged statistics of its escalated rows; returns how many."""
    n = 0
    for gidx, lse, sx, margin, unc, deferred in seen:
        for r in ((unc != 0) & (deferred == 0)).nonzero().squeeze(1).tolist():
            e = _expected(z, inp, r)
            got = {"gidx": int(gidx[r]), "lse": float(lse[r]), "sx": float(sx[r]),
                   "margin": float(margin[r])}
            assert got["gidx"] == e["gidx"], (r, got, e)
            assert abs(got["lse"] - e["lse"]) <= 1e-5 * max(1.0, abs(e["lse"])), (r, got, e)
            assert got["sx"] == e["sx"] or abs(got["sx"] - e["sx"]) <= 1e-6, (r, got, e)
            assert abs(got["margin"] - e["margin"]) <= 1e-9, (r, got, e)
            n += 1
    return n


def _tie_case(chunk: int, short: int) -> tuple:
    """Rows whose kept set is the first ``need`` of 120 tokens tied at the maximum, with
    the ``need``-th the last tied token of chunk ``4`` (``short = 0``: that chunk's ties
    are kept whole) or ``short`` tied tokens before it (the cut inside the chunk), each
    request's seed chosen so that this token is the Gumbel-max of the kept set, and the
    draft the first tied token past the cut (not kept).
    A kept set one tied token short, a chunk boundary off by one, or the draft's rank
    among the ties taken within its chunk only, each change ``gidx`` or ``s_x``."""
    tied, need, _, _ = tied_rows(chunk, short)
    return tied_batch(chunk, short, int(tied[need]), lambda a, w: a == need - 1, 0)


def main(argv: list[str] | None = None) -> int:
    """``argv``: the case kinds to run (default: all), e.g. ``ties_past_cut deep_cut``, or
    single cases: ``deep_cut_7`` (a depth), ``ties_top_p_min_p`` (a kind and its mix)."""
    only = set(sys.argv[1:] if argv is None else argv)
    ek.CHUNK, ek.WALK = 16, 32
    out = []
    seen: list = []
    decide = decide_round.decide_merged_triton

    def spy(merged, deferred, inp, plan, vocab_size):
        seen.append((merged.gidx.clone(), merged.lse.clone(), merged.sx.clone(),
                     merged.nucleus_margin.clone(), merged.uncertified.clone(),
                     deferred.clone()))
        return decide(merged, deferred, inp, plan, vocab_size)

    decide_round.decide_merged_triton = spy
    for kind, mix, seed in CASES + (("tie_at_chunk_end", "top_p", 0),
                                    ("tie_inside_chunk", "top_p", 1)) + PIN_CASES:
        label = f"{kind}_{seed}" if kind == "deep_cut" else f"{kind}_{mix}"
        if only and kind not in only and label not in only:
            continue
        seen.clear()
        if kind.startswith("tie_"):
            b, z = _tie_case(ek.CHUNK, seed)
        elif kind.startswith("ties_past_cut"):
            b, z = ties_past_the_cut(ek.CHUNK, past=seed, draft_past=kind.endswith("draft"))
        elif kind == "deep_cut":
            b, z = deep_cut(seed)
        else:
            g = torch.Generator().manual_seed(seed)
            b = random_top_p_batch(g, 3, V, mix)
            z = shaped_logits(g, b, V, kind).to(torch.bfloat16)
        steps: list[GraphVerifyStep] = []
        Step = recording_step(steps)

        o, _, plan, _ = check_graph_step(z, b, V, 2, candidates=2, backend="triton",
                                         step_cls=Step, escalation="rows")
        rows = _check_rows(z, StepInputs.from_layout(b.layout(), V), seen)
        dirty = dirty_scratch(steps, "cpu")
        out.append({"kind": kind, "case": label, "mix": mix, "escalated": int(o.uncertified.sum())
                    - int(o.deferred.sum()), "deferred": int(o.deferred.sum()),
                    "scratch_steps": sum(1 for s in steps if s._escalation_scratch),
                    "rows_compared": rows,
                    "dirty": dirty})
    print(json.dumps({"cases": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
