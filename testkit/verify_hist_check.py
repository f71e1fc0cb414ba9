"""The graph step's histogram escalation (``testkit/verify_hist_step.py``, not shipped) on
the Triton backend, run by Triton's CPU interpreter: the Triton merge (int8 flags), shard
statistics and decision around the histogram rounds. With 2 candidates per rank every cut
escalates; each case must equal the full-logits reference on every rank
(``check_graph_step`` asserts it).

    TRITON_INTERPRET=1 python -m testkit.verify_hist_check [CASE ...]

(``CASE``: a case name below or ``kernels``; default: all.)

On the Triton backend the histogram rounds' shard passes are
``testkit/verify_hist_kernels.py``; their torch twins are compared on their own rows too.
Prints a JSON summary: per case the escalated rows, the deferred rows and the first rows'
deferral; the kernels' agreement.
"""

from __future__ import annotations

import json
import sys

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


def kernel_twins() -> dict:
    """The two shard passes of ``testkit/verify_hist_kernels.py`` against their torch twins
    on bf16 rows with ties, padding, a min-p cut, T 1.0 / 0.6 and 2,300 columns (two
    chunks): equal counts, masses within 1e-12 relative."""
    from testkit import verify_hist_kernels as hk
    from testkit.verify_hist_step import boundary_torch, coarse_torch
    from vllm_kimi_ext.verify.rowmath import min_p_threshold, scale_logits

    g = torch.Generator().manual_seed(9)
    z = ((torch.randn(4, 2300, generator=g) * 2).round(decimals=1)).to(torch.bfloat16)
    z[1, 100:140] = -0.0
    t = torch.tensor([1.0, 0.6, 1.0, 0.6])
    n_valid = 2250
    m = scale_logits(z[:, :n_valid], t).max(dim=1).values
    cutv = min_p_threshold(m, torch.tensor([0.0, 0.0, 0.05, 0.3]))
    c_tri, c_ref = hk.coarse_hist(z, t, m, cutv, n_valid, 256), coarse_torch(z, t, m, cutv,
                                                                              n_valid)
    bin_id = c_ref.argmax(dim=1)
    b_tri = hk.boundary_counts(z, t, cutv, bin_id, n_valid, 256)
    b_ref = boundary_torch(z, t, cutv, bin_id, n_valid)
    return {"coarse_close": bool(torch.allclose(c_tri, c_ref, rtol=1e-12, atol=0.0)),
            "boundary_equal": bool(torch.equal(b_tri, b_ref)),
            "boundary_tokens": int(b_ref.sum())}


#: name -> (builder of (batch, logits), whole-row slots)
CASES = {"ties_past_cut": (lambda: ties_past_the_cut(16, past=4), 0),
         "ties_past_cut_draft": (lambda: ties_past_the_cut(16, past=4, draft_past=True), 0),
         "deep_cut_7": (lambda: deep_cut(7), 0), "edge": (edge_case, 2),
         # the min-p cut exactly on 150 tied tokens: kept (a `>` pre-cut drops them)
         "min_p_on_cut": (lambda: deep_cut(1.0, min_p_on_cut=True), 0)}


def main(argv: list[str] | None = None) -> int:
    only = list(sys.argv[1:] if argv is None else argv)
    unknown = sorted(set(only) - set(CASES) - {"kernels"})
    if unknown:
        print(f"unknown case(s) {unknown}; expected some of {sorted(CASES)} or kernels",
              file=sys.stderr)
        return 2
    out = []
    for name, (build, slots) in CASES.items():
        if only and name not in only:
            continue
        b, z = build()
        o, _, plan, stopped = check_graph_step(z, b, PIN_V, 2, candidates=1 if slots else 2,
                                               backend="triton", escalation="hist",
                                               row_fallback_slots=slots)
        out.append({"kind": name, "escalation": plan.escalation,
                    "uncertified": int(o.uncertified.sum()), "deferred": int(o.deferred.sum()),
                    "slots": plan.escalation_slots, "whole_row_slots": slots,
                    "first_rows_deferred": [int(o.deferred[int(c)])
                                            for c in b.cu_num_rows[:-1]]})
    summary: dict = {"cases": out}
    if not only or "kernels" in only:
        summary["kernels"] = kernel_twins()
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
