"""Plain-language explanation of a recommendation: one dimension changed at a time."""

from __future__ import annotations

import dataclasses

from vllm_kimi_ext.costmodel.acceptance import Acceptance
from vllm_kimi_ext.costmodel.catalog import DraftProfile
from vllm_kimi_ext.costmodel.draft_cost import collectives_per_forward
from vllm_kimi_ext.costmodel.evidence import evidence
from vllm_kimi_ext.costmodel.model import SHARDED_VERIFIER_BYTES_PER_ROW_PER_RANK, CostModel
from vllm_kimi_ext.costmodel.options import (
    Option,
    Recommendation,
    describe,
    fmt_bytes,
    requirements,
    settings,
)


def _find(options: tuple[Option, ...], **fields) -> Option | None:
    hits = [o for o in options if all(getattr(o.plan, f) == v for f, v in fields.items())]
    return max(hits, key=lambda o: o.tokens_per_s) if hits else None


def _delta(a: Option, b: Option) -> str:
    return f"{b.tokens_per_s:.0f} tok/s ({b.tokens_per_s / a.tokens_per_s - 1:+.0%})"


def _same(p) -> dict:
    return dict(draft=p.draft, placement=p.placement, vocab=p.vocab, verifier=p.verifier,
                backend=p.backend)


def _length(rec: Recommendation) -> list[str]:
    best, p = rec.best, rec.best.plan
    neighbours = []
    for k in (p.k - 1, p.k + 1):
        o = _find(rec.options, k=k, **_same(p))
        if o is not None:
            neighbours.append(f"k={k}: {_delta(best, o)}, tau {o.estimate.tau:.2f}")
    if not neighbours:
        return []
    return ["Draft length: " + "; ".join(neighbours) + ". Each extra draft token adds target "
            "work (more distinct experts per MoE layer) and a draft forward, while its "
            "acceptance shrinks geometrically."]


def _placement(cm: CostModel, rec: Recommendation, acc: Acceptance) -> list[str]:
    best, p = rec.best, rec.best.plan
    d = p.draft
    out = []
    for other in cm.placement_options(d):
        if other == p.placement:
            continue
        o = _find(rec.options, **{**_same(p), "placement": other}, k=p.k)
        b = cm.draft_forward_bytes(d, other, p.vocab, rec.batch)
        n_coll = collectives_per_forward(d, other)
        how = (f"each GPU streams {fmt_bytes(b)} per draft forward"
               + (f" and makes {n_coll} collectives" if n_coll else ", no collectives"))
        if o is not None:
            out.append(f"Placement {other}: {_delta(best, o)}; {how}.")
            continue
        trial = cm.estimate(dataclasses.replace(p, placement=other), acc)
        why = (f"does not fit in memory ({trial.memory_gb_per_gpu:.0f} of "
               f"{trial.memory_budget_gb:.0f} GB per GPU)" if not trial.fits else
               "needs: " + "; ".join(str(r) for r in requirements(
                   cm, trial.plan) if not r.buildable) + " (not buildable)")
        out.append(f"Placement {other}: {why}; {how}.")
    return out


def _vocab_verifier(cm: CostModel, rec: Recommendation) -> list[str]:
    best, p = rec.best, rec.best.plan
    out = []
    if len(cm.vocab_options(p.draft)) > 1:
        other = "reduced" if p.vocab == "full" else "full"
        o = _find(rec.options, **{**_same(p), "vocab": other}, k=p.k)
        if o is not None:
            out.append(f"Vocabulary: {other} gives {_delta(best, o)}; the 32K head reads ~5x "
                       f"fewer lm_head bytes per forward but loses the tokens outside it "
                       f"(coverage {cm.model.reduced_vocab_coverage:.0%} assumed per position).")
    other = "sharded" if p.verifier == "gather" else "gather"
    o = _find(rec.options, **{**_same(p), "verifier": other}, k=p.k)
    if o is not None:
        gain = (o.estimate.step_s - best.estimate.step_s) * 1e6
        rows = rec.batch * (p.k + 1)
        out.append(f"Verifier: {other} gives {_delta(best, o)} ({gain:+.0f} us per step); the "
                   f"stock all-gather moves {rows} x {cm.model.vocab_size} bf16 logits "
                   f"({fmt_bytes(rows * cm.model.vocab_size * 2)}) per step, the sharded "
                   f"verifier {SHARDED_VERIFIER_BYTES_PER_ROW_PER_RANK} bytes per row per rank.")
    return out


def _backend(cm: CostModel, rec: Recommendation) -> list[str]:
    best, p = rec.best, rec.best.plan
    others = [o for o in (_find(rec.options, **{**_same(p), "backend": b}, k=p.k)
                          for b in cm.backends if b != p.backend) if o is not None]
    unmeasured = [b for b, spec in cm.hw.backends.items() if b not in cm.latency.backends]
    out = []
    if others:
        n_bytes = rec.batch * (p.k + 1) * cm.model.hidden_size * cm.model.dtype_bytes
        lat = ", ".join(f"{b} {cm.collective_us('allreduce', n_bytes, b):.0f} us"
                        for b in [p.backend] + [o.plan.backend for o in others])
        out.append("All-reduce backend: " + "; ".join(
            f"{o.plan.backend} gives {_delta(best, o)}" for o in others)
            + f". In-situ latency per all-reduce of {fmt_bytes(n_bytes)}: {lat}.")
    if unmeasured:
        out.append("Not ranked (no public in-situ measurement on this class of box; the what-if "
                   "table costs FlashInfer's as the one-shot all-reduce measured in situ): "
                   + ", ".join(unmeasured) + "; measure with bench/allreduce_bench.py.")
    return out


def explain(cm: CostModel, rec: Recommendation,
            drafts: list[tuple[DraftProfile, Acceptance]]) -> list[str]:
    best, p = rec.best, rec.best.plan
    e = best.estimate
    out = [f"Recommended: {describe(p)} -> {e.tokens_per_s_per_request:.0f} tok/s per request"
           f"{'' if rec.batch == 1 else f' ({e.tokens_per_s:.0f} aggregate at batch {rec.batch})'}"
           f", {rec.speedup_vs_stock:.2f}x stock vLLM without speculation "
           f"({rec.no_spec_stock.tokens_per_s:.0f} tok/s, NCCL); evidence: "
           f"{evidence(p).short()}."]
    if best is not rec.fastest:
        if evidence(p).measured and not evidence(rec.fastest.plan).measured:
            why = ("the recommendation has run in public on this box class with stock vLLM, "
                   "the faster one only in the model, and its interval does not clear the "
                   "recommendation's (ranked by evidence)")
        else:
            why = ("the recommendation needs fewer changes to stock vLLM or stays within the "
                   "measured acceptance positions")
        out.append(f"The fastest buildable option ({describe(rec.fastest.plan)}, "
                   f"{rec.fastest.tokens_per_s:.0f} tok/s) is "
                   f"{rec.fastest.tokens_per_s / best.tokens_per_s - 1:.1%} faster by point "
                   f"estimate; {why}.")
    if not p.speculative:
        spec = [o for o in rec.options if o.plan.speculative]
        if spec:
            top = max(spec, key=lambda o: o.tokens_per_s)
            out.append(f"No speculation: the best speculative option ({describe(top.plan)}) "
                       f"reaches {top.tokens_per_s:.0f} tok/s (tau {top.estimate.tau:.2f}), "
                       f"not enough to pay for the larger verification pass and the draft.")
        return out
    base = _find(rec.options, k=0, backend=p.backend)
    out.append(f"Per step: {e.step_s * 1e3:.1f} ms for {e.tau:.2f} tokens (tau at k={p.k}) vs "
               f"{base.estimate.step_s * 1e3:.1f} ms for 1 token without speculation; "
               f"{e.collectives_per_token:.0f} collectives and "
               f"{fmt_bytes(e.comm_bytes_per_token)} of collective payload per output token "
               f"(vs {base.estimate.collectives_per_token:.0f} and "
               f"{fmt_bytes(base.estimate.comm_bytes_per_token)}).")
    acc = dict((dr.name, a) for dr, a in drafts)[p.draft.name]
    out += _length(rec) + _placement(cm, rec, acc) + _vocab_verifier(cm, rec) + _backend(cm, rec)
    if rec.best_stock is not best:
        out.append(f"With stock vLLM 0.34 only: {describe(rec.best_stock.plan)} -> "
                   f"{rec.best_stock.tokens_per_s:.0f} tok/s.")
    if best.requires:
        out.append("Needs: " + "; ".join(str(r) for r in best.requires) + ".")
    opt_in = settings(cm, p)
    if opt_in:
        out.append("Set: " + "; ".join(opt_in) + ".")
    return out


def caveats(cm: CostModel, rec: Recommendation,
            drafts: list[tuple[DraftProfile, Acceptance]]) -> list[str]:
    out = ["A model fitted to public measurements of other images and Kimi versions: confirm "
           "on the real box before relying on it."]
    if not cm.params.calibrated:
        out.append(f"{cm.hw.name} carries no fit: its parameters are priors.")
    p = rec.best.plan
    if p.speculative:
        acc = dict((d.name, a) for d, a in drafts)[p.draft.name]
        if p.k > acc.measured_positions:
            out.append(f"Acceptance beyond position {acc.measured_positions} is extrapolated "
                       f"with a constant per-position rate ({acc.source}).")
        for a in p.draft.assumptions:
            out.append(f"{p.draft.name}: {a}")
    return out
