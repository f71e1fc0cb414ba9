"""Round 1's merge kernel with the ranks' runs merged by binary search against the same kernel
sorting every key (``merge_round1_triton(..., runs=True / False)``), on payloads the torch
round 1 builds from bf16 rows.

    TRITON_INTERPRET=1 python -m testkit.verify_merge_runs_check [--quick] [--device cuda]

Cases: tie-heavy rows (many equal values across ranks: the merge must keep run order for
equal keys), a short last shard (padding ``-inf`` tails), flat rows, every cut mode (top-p,
min-p, top-p with min-p, top-k), two ranks short of ``W`` valid ids (runs ending in sentinel
keys, equal across runs: their places must not collide), rank counts 2, 3 and 8 and widths
4, 5 and 16, and one payload with a run out of order (the kernel must notice and sort); on a
GPU also Kimi's shapes (V = 163840, TP = 8, 128 and 512 candidates per rank). Prints one JSON
line: ``{"cases": [...], "mismatches": [...]}``; exit 1 on any mismatch. Output fields
compared bit for bit: Gumbel-max value and token, kept-set log-sum-exp, ``s_x``, uncertified
flag, nucleus margin, row maximum (and the uncertified flags against the torch merge). A
mismatch names its fields and each one's largest absolute difference (``max_abs_diff``).
:data:`SUM_FIELDS` are sums over the ordered candidates: on a GPU they may round differently
(seen on one H100: ``lse`` / ``nucleus_margin`` in 3 of 29 cases, every other field equal);
``decision_mismatches`` leaves them out.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from vllm_kimi_ext.verify import VerifyBatch
from vllm_kimi_ext.verify.merge import merge_round1_torch, merge_round1_triton
from vllm_kimi_ext.verify.protocol import plan_from_params
from vllm_kimi_ext.verify.stats import round1_payload_torch
from vllm_kimi_ext.verify.step_io import StepInputs

FIELDS = ("gval", "gidx", "lse", "sx", "uncertified", "nucleus_margin", "row_max")
#: The fields summed over the ordered candidates (the rest pick, flag or copy).
SUM_FIELDS = ("lse", "nucleus_margin")
#: The key of (1e30, id 0), which no payload holds: a place never written reads back as a
#: candidate above every other one.
POISON = 8163322751130533887
MODES = {"top_p": {"top_p": 0.9}, "min_p": {"min_p": 0.05},
         "top_p_min_p": {"top_p": 0.8, "min_p": 0.02}, "top_k": {"top_k": 3}}


def _rows(kind: str, n: int, V: int, g: torch.Generator) -> torch.Tensor:
    if kind == "ties":  # few distinct values: ties inside and across every rank
        z = torch.randint(-6, 3, (n, V), generator=g) * 0.5
    else:  # flat: the nucleus is wide, most cuts uncertified
        z = torch.randn(n, V, generator=g) * 0.05
    return z.to(torch.bfloat16)


def _payload(z, b, plan, V, tp, device):
    S = -(-V // tp)
    inp = StepInputs.from_layout(b.layout(), V)
    parts = []
    for r in range(tp):
        shard = z[:, r * S:(r + 1) * S]
        if shard.shape[1] < S:
            shard = torch.cat([shard, shard.new_full((shard.shape[0], S - shard.shape[1]),
                                                     float("-inf"))], dim=1)
        parts.append(round1_payload_torch(shard, inp, plan, r * S, V, None))
    valid = torch.tensor([max(0, min(S, V - r * S)) for r in range(tp)], device=device)
    return torch.stack(parts).to(device), inp, valid


def _compare(a, b) -> dict[str, float]:
    """The fields of ``a`` and ``b`` that differ, each with its largest absolute difference
    (``inf`` where one side is infinite or NaN and the other is not)."""
    bad = {}
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        if x is None or y is None:
            continue
        x, y = x.cpu(), y.cpu()
        if x.dtype != y.dtype:
            x, y = x.double(), y.double()
        same = (x == y) | (torch.isnan(x.double()) & torch.isnan(y.double()))
        if not bool(same.all()):
            d = (x.double() - y.double()).abs()[~same]
            bad[f] = float(d.nan_to_num(nan=float("inf"), posinf=float("inf")).max())
    return bad


#: ``(rows, ranks, W, vocabulary)``; the first one also gets a run out of order.
SPECS = [("ties", 2, 4, 101), ("ties", 3, 5, 200), ("ties", 8, 16, 1000),
         ("flat", 8, 4, 963), ("flat", 3, 16, 500),
         ("ties", 8, 3, 20)]  # ranks 6 and 7 hold 2 and 0 ids: runs ending in sentinels
#: On a GPU also Kimi's shapes: round 1's width (128) and the folded escalation's second
#: merge (128 + 384 per rank).
KIMI_SPECS = [("flat", 8, 128, 163840), ("ties", 8, 512, 163840)]
#: ``--quick`` (the CPU tier): the specs and cut modes that caught the planted bugs.
QUICK = ((0, 5), ("top_p", "min_p"))


def run(device: str, quick: bool = False) -> dict:
    cases, mismatches = [], []
    specs = SPECS + (KIMI_SPECS if device != "cpu" else [])
    for i, (kind, tp, W, V) in enumerate(specs):
        if quick and i not in QUICK[0]:
            continue
        g = torch.Generator().manual_seed(i)
        for mode, params in MODES.items():
            if quick and mode not in QUICK[1]:
                continue
            n = 6
            temps = [1.0, 0.6, 1.0, 0.0, 1.0, 2.0]
            b = VerifyBatch.from_draft_tokens(torch.randint(0, V, (n, 1), generator=g), temps,
                                              torch.arange(n) + 7 * i,
                                              **{k: [v] * n for k, v in params.items()})
            plan = plan_from_params([dict(params, temperature=t) for t in temps], tp_size=tp,
                                    vocab_size=V, num_rows=b.num_rows, max_rows_per_req=2,
                                    candidates=W)
            z = _rows(kind, b.num_rows, V, g)
            gp, inp, valid = _payload(z, b, plan, V, tp, device)
            inp = StepInputs(**{k: getattr(inp, k).to(device) for k in inp.__dataclass_fields__})
            # the scratch poisoned: a place no key was written to shows
            runs = merge_round1_triton(gp, inp, plan, V, valid, None, runs=True, fill=POISON)
            sort = merge_round1_triton(gp, inp, plan, V, valid, None, runs=False)
            ref = merge_round1_torch(gp, inp, plan, V, valid, None)
            name = f"{kind}/tp{tp}/W{W}/{mode}"
            cases.append({"case": name, "uncertified": int(sort.uncertified.sum())})
            bad = _compare(runs, sort)
            # the torch body rounds differently (sums in another order): its decisions agree
            if not torch.equal(runs.uncertified.bool().cpu(), ref.uncertified.cpu()):
                bad["uncertified (torch)"] = 1.0
            if bad:
                mismatches.append({"case": name, "fields": list(bad), "max_abs_diff": bad})
        if i == 0:  # one run out of order: the kernel sorts (the same output as the sort)
            gp2 = gp.clone()
            c = 5
            gp2[0, :, [c, c + 1]] = gp2[0, :, [c + 1, c]]
            gp2[0, :, [c + W, c + W + 1]] = gp2[0, :, [c + W + 1, c + W]]
            a = merge_round1_triton(gp2, inp, plan, V, valid, None, runs=True)
            s = merge_round1_triton(gp2, inp, plan, V, valid, None, runs=False)
            cases.append({"case": "out-of-order run", "uncertified": int(s.uncertified.sum())})
            bad = _compare(a, s)
            if bad:
                mismatches.append({"case": "out-of-order run", "fields": list(bad),
                                   "max_abs_diff": bad})
    decision = [m for m in mismatches if set(m["fields"]) - set(SUM_FIELDS)]
    return {"cases": cases, "mismatches": mismatches, "decision_mismatches": decision}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true", help="the CPU tier's cases")
    args = ap.parse_args(argv)
    out = run(args.device, args.quick)
    print(json.dumps(out))
    if out["mismatches"]:
        print(f"mismatches: {json.dumps(out['mismatches'])}", file=sys.stderr)
    return 1 if out["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
