"""Recommender: which speculative-decoding configuration to run on a box.

Searches draft x k (1..7) x draft placement (tp1 / tp8) x draft vocabulary (full /
reduced) x verifier (stock gather / sharded) x all-reduce backend, plus no speculation on
every backend, keeps what fits in memory, and ranks by aggregate tokens/s at the given
batch. Among options within ``tolerance`` (default 2 %) of the fastest, the one needing the
fewest changes to stock vLLM 0.34 is recommended, then one whose draft length has measured
(not extrapolated) acceptance: a model whose calibration error is ~8 % cannot rank options
2 % apart. The result also carries the best *stock* configuration (what vLLM 0.34 does without
this project) and a plain-language explanation built from one-at-a-time comparisons.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from vllm_kimi_ext.costmodel.acceptance import Acceptance
from vllm_kimi_ext.costmodel.catalog import DraftProfile
from vllm_kimi_ext.costmodel.model import (
    PLACEMENTS,
    SHARDED_VERIFIER_BYTES_PER_ROW_PER_RANK,
    VERIFIERS,
    CostModel,
    Plan,
    StepEstimate,
)

MAX_K = 7
DEFAULT_TOLERANCE = 0.02

REQ_TP1 = ("draft at TP=1 (replicated on every rank): vLLM 0.34 builds EAGLE/MTP drafts on the "
           "target's TP group and ignores draft_tensor_parallel_size=1 [inferred from code]; "
           "needs this project's placement patch")
REQ_REDUCED = ("a 32K-vocabulary draft head with a d2t map (vllm-kimi-ext draft shrink-vocab); "
               "acceptance scaled by the assumed coverage")
REQ_SHARDED = "the vocabulary-sharded verifier (vllm_kimi_ext.verify), not in stock vLLM"


def requirements(cm: CostModel, plan: Plan) -> list[str]:
    """What a plan needs beyond stock vLLM 0.34 (empty = runs on stock vLLM)."""
    req = []
    spec = cm.hw.backends.get(plan.backend, {})
    if not spec.get("stock", False):
        req.append(f"all-reduce {plan.backend}: {spec.get('requires', 'not stock')}")
    if not plan.speculative:
        return req
    if not plan.draft.stock_supported:
        req.append(f"draft {plan.draft.name}: {plan.draft.stock_note}")
    if plan.placement == "tp1":
        req.append(REQ_TP1)
    if plan.vocab == "reduced":
        req.append(REQ_REDUCED)
    if plan.verifier == "sharded":
        req.append(REQ_SHARDED)
    return req


def settings(cm: CostModel, plan: Plan) -> list[str]:
    """Opt-in switches of stock vLLM a plan uses (they cost nothing to adopt)."""
    spec = cm.hw.backends.get(plan.backend, {})
    if spec.get("stock", False) and plan.backend != "nccl" and spec.get("requires"):
        return [f"all-reduce {plan.backend}: {spec['requires']}"]
    return []


@dataclasses.dataclass(frozen=True)
class Option:
    estimate: StepEstimate
    requires: tuple[str, ...]

    @property
    def plan(self) -> Plan:
        return self.estimate.plan

    @property
    def stock(self) -> bool:
        return not self.requires

    @property
    def tokens_per_s(self) -> float:
        return self.estimate.tokens_per_s


@dataclasses.dataclass(frozen=True)
class Recommendation:
    hardware: str
    batch: int
    context: int
    calibrated: bool
    best: Option
    fastest: Option
    best_stock: Option
    no_spec_stock: Option
    no_spec_best: Option
    options: tuple[Option, ...]  # every evaluated option that fits, fastest first
    explanation: tuple[str, ...]
    caveats: tuple[str, ...]

    @property
    def speedup_vs_no_spec(self) -> float:
        """Against no speculation on the same all-reduce backend."""
        base = next(o for o in self.options
                    if not o.plan.speculative and o.plan.backend == self.best.plan.backend)
        return self.best.tokens_per_s / base.tokens_per_s

    @property
    def speedup_vs_stock(self) -> float:
        return self.best.tokens_per_s / self.no_spec_stock.tokens_per_s

    def to_dict(self) -> dict[str, Any]:
        def opt(o: Option) -> dict[str, Any]:
            return {**o.estimate.to_dict(), "requires": list(o.requires), "stock": o.stock}

        return {
            "hardware": self.hardware,
            "batch": self.batch,
            "context": self.context,
            "calibrated": self.calibrated,
            "recommended": opt(self.best),
            "fastest": opt(self.fastest),
            "best_stock": opt(self.best_stock),
            "no_spec_stock": opt(self.no_spec_stock),
            "no_spec_best": opt(self.no_spec_best),
            "speedup_vs_no_spec_same_backend": self.speedup_vs_no_spec,
            "speedup_vs_stock_no_spec": self.speedup_vs_stock,
            "explanation": list(self.explanation),
            "caveats": list(self.caveats),
        }


def enumerate_options(
    cm: CostModel,
    drafts: list[tuple[DraftProfile, Acceptance]],
    batch: int = 1,
    context: int = 1024,
    backends: list[str] | None = None,
    k_max: int = MAX_K,
    placements: tuple[str, ...] = PLACEMENTS,
    verifiers: tuple[str, ...] = VERIFIERS,
) -> list[Option]:
    """Every configuration, fitting or not, unsorted."""
    backends = backends or cm.backends
    out = []
    for be in backends:
        plan = Plan(k=0, backend=be, batch=batch, context=context)
        out.append(Option(cm.estimate(plan), tuple(requirements(cm, plan))))
    for (draft, acc), be in itertools.product(drafts, backends):
        for k, pl, vo, ve in itertools.product(range(1, min(k_max, draft.max_k) + 1),
                                               placements, cm.vocab_options(draft), verifiers):
            plan = Plan(k=k, draft=draft, placement=pl, vocab=vo, verifier=ve, backend=be,
                        batch=batch, context=context)
            out.append(Option(cm.estimate(plan, acc), tuple(requirements(cm, plan))))
    return out


def extrapolated(option: Option, acceptances: dict[str, Acceptance]) -> bool:
    """Whether the option's draft length lies beyond the measured acceptance positions."""
    p = option.plan
    return p.speculative and p.k > acceptances[p.draft.name].measured_positions


def _pick(options: list[Option], tolerance: float,
          acceptances: dict[str, Acceptance]) -> Option:
    """Fastest, except that within ``tolerance`` of it the option needing the fewest changes
    to stock vLLM wins, then one whose draft length has measured acceptance."""
    fastest = max(options, key=lambda o: o.tokens_per_s)
    close = [o for o in options if o.tokens_per_s >= fastest.tokens_per_s * (1 - tolerance)]
    return min(close, key=lambda o: (len(o.requires), extrapolated(o, acceptances),
                                     -o.tokens_per_s))


def recommend(
    cm: CostModel,
    drafts: list[tuple[DraftProfile, Acceptance]],
    batch: int = 1,
    context: int = 1024,
    backends: list[str] | None = None,
    k_max: int = MAX_K,
    tolerance: float = DEFAULT_TOLERANCE,
    stock_only: bool = False,
) -> Recommendation:
    options = [o for o in enumerate_options(cm, drafts, batch, context, backends, k_max)
               if o.estimate.fits]
    if stock_only:
        options = [o for o in options if o.stock]
    if not options:
        raise ValueError("no configuration fits in memory; lower --context or --batch")
    options.sort(key=lambda o: -o.tokens_per_s)
    accs = {d.name: a for d, a in drafts}
    best = _pick(options, tolerance, accs)
    fastest = options[0]
    stock = [o for o in options if o.stock]
    best_stock = _pick(stock, tolerance, accs) if stock else best
    no_spec = [o for o in options if not o.plan.speculative]
    nccl = [o for o in no_spec if o.plan.backend == "nccl"] or no_spec
    rec = Recommendation(
        hardware=cm.hw.name, batch=batch, context=context, calibrated=cm.params.calibrated,
        best=best, fastest=fastest, best_stock=best_stock, no_spec_stock=nccl[0],
        no_spec_best=no_spec[0], options=tuple(options),
        explanation=(), caveats=(),
    )
    return dataclasses.replace(rec, explanation=tuple(explain(cm, rec, drafts)),
                               caveats=tuple(caveats(cm, rec, drafts)))


# ---------------------------------------------------------------------------------------------
# Explanation
# ---------------------------------------------------------------------------------------------


def describe(plan: Plan) -> str:
    if not plan.speculative:
        return f"no speculation, {plan.backend} all-reduce"
    return (f"{plan.draft.name}, k={plan.k}, draft {plan.placement} with {plan.vocab} vocabulary, "
            f"{'stock all-gather' if plan.verifier == 'gather' else 'sharded'} verifier, "
            f"{plan.backend} all-reduce")


def _find(options: tuple[Option, ...], **fields: Any) -> Option | None:
    hits = [o for o in options if all(getattr(o.plan, f) == v for f, v in fields.items())]
    return max(hits, key=lambda o: o.tokens_per_s) if hits else None


def _delta(a: Option, b: Option) -> str:
    return f"{b.tokens_per_s:.0f} tok/s ({b.tokens_per_s / a.tokens_per_s - 1:+.0%})"


def explain(cm: CostModel, rec: Recommendation,
            drafts: list[tuple[DraftProfile, Acceptance]]) -> list[str]:
    best, p = rec.best, rec.best.plan
    e = best.estimate
    out = [
        f"Recommended: {describe(p)} -> {e.tokens_per_s_per_request:.0f} tok/s per request"
        f"{'' if rec.batch == 1 else f' ({e.tokens_per_s:.0f} aggregate at batch {rec.batch})'}, "
        f"{rec.speedup_vs_stock:.2f}x stock vLLM without speculation "
        f"({rec.no_spec_stock.tokens_per_s:.0f} tok/s, NCCL).",
    ]
    if best is not rec.fastest:
        out.append(f"The fastest option ({describe(rec.fastest.plan)}, "
                   f"{rec.fastest.tokens_per_s:.0f} tok/s) is within "
                   f"{1 - best.tokens_per_s / rec.fastest.tokens_per_s:.1%}; the recommendation "
                   f"needs fewer changes to stock vLLM or stays within the measured "
                   f"acceptance positions.")
    if not p.speculative:
        spec = [o for o in rec.options if o.plan.speculative]
        if spec:
            top = max(spec, key=lambda o: o.tokens_per_s)
            out.append(f"No speculation: the best speculative option ({describe(top.plan)}) "
                       f"reaches {top.tokens_per_s:.0f} tok/s (tau {top.estimate.tau:.2f}), "
                       f"not enough to pay for the larger verification pass and the draft.")
        return out
    base = _find(rec.options, k=0, backend=p.backend)
    d = p.draft
    out.append(f"Per step: {e.step_s * 1e3:.1f} ms for {e.tau:.2f} tokens (tau at k={p.k}) vs "
               f"{base.estimate.step_s * 1e3:.1f} ms for 1 token without speculation; "
               f"{e.collectives_per_token:.0f} collectives and "
               f"{_fmt_bytes(e.comm_bytes_per_token)} of collective payload per output token "
               f"(vs {base.estimate.collectives_per_token:.0f} and "
               f"{_fmt_bytes(base.estimate.comm_bytes_per_token)}).")
    same = dict(draft=d, placement=p.placement, vocab=p.vocab, verifier=p.verifier,
                backend=p.backend)
    # k
    neighbours = []
    for k in (p.k - 1, p.k + 1):
        o = _find(rec.options, k=k, **same)
        if o is not None:
            neighbours.append(f"k={k}: {_delta(best, o)}, tau {o.estimate.tau:.2f}")
    if neighbours:
        out.append("Draft length: " + "; ".join(neighbours) + ". Each extra draft token adds "
                   "target work (more distinct experts per MoE layer) and a draft forward, "
                   "while its acceptance shrinks geometrically.")
    # placement
    other_pl = "tp1" if p.placement == "tp8" else "tp8"
    o = _find(rec.options, **{**same, "placement": other_pl}, k=p.k)
    alt = _find(rec.options, draft=d, placement=other_pl)
    if o is not None or alt is not None:
        b1 = cm.draft_forward_bytes(d, "tp1", p.vocab, rec.batch)
        b8 = cm.draft_forward_bytes(d, "tp8", p.vocab, rec.batch)
        n_coll = 2 * d.num_layers + 2
        coll_us = ((1 + 2 * d.num_layers) * cm.collective_us(
            "allreduce", rec.batch * cm.model.hidden_size * cm.model.dtype_bytes, p.backend)
            + cm.collective_us("allgather", rec.batch * cm.tp * 8, "nccl"))
        line = f"Placement: {other_pl} "
        line += (f"at the same k gives {_delta(best, o)}" if o is not None else
                 "does not fit at this k")
        if alt is not None and (o is None or alt.plan.k != p.k):
            line += f" (its best, k={alt.plan.k}: {_delta(best, alt)})"
        line += (f". Per draft forward each GPU streams {_fmt_bytes(b1)} at TP=1 with no "
                 f"collectives, or {_fmt_bytes(b8)} at TP=8 plus {n_coll} collectives "
                 f"(~{coll_us:.0f} us).")
        out.append(line)
    else:
        acc = dict((dr.name, a) for dr, a in drafts)[d.name]
        trial = cm.estimate(dataclasses.replace(p, placement=other_pl), acc)
        why = ("needs changes to stock vLLM (excluded)" if trial.fits
               else f"does not fit in memory ({trial.memory_gb_per_gpu:.0f} of "
                    f"{trial.memory_budget_gb:.0f} GB per GPU)")
        out.append(f"Placement: {other_pl} {why}.")
    # vocab
    if len(cm.vocab_options(d)) > 1:
        other_vo = "reduced" if p.vocab == "full" else "full"
        o = _find(rec.options, **{**same, "vocab": other_vo}, k=p.k)
        if o is not None:
            out.append(f"Vocabulary: {other_vo} gives {_delta(best, o)}; the 32K head reads "
                       f"~5x fewer lm_head bytes per forward but loses the tokens outside it "
                       f"(coverage {cm.model.reduced_vocab_coverage:.0%} assumed per position).")
    # verifier
    other_ve = "sharded" if p.verifier == "gather" else "gather"
    o = _find(rec.options, **{**same, "verifier": other_ve}, k=p.k)
    if o is not None:
        gain = (o.estimate.step_s - e.step_s) * 1e6
        out.append(f"Verifier: {other_ve} gives {_delta(best, o)} ({gain:+.0f} us per step); "
                   f"the stock all-gather moves {rec.batch * (p.k + 1)} x {cm.model.vocab_size} "
                   f"bf16 logits "
                   f"({_fmt_bytes(rec.batch * (p.k + 1) * cm.model.vocab_size * 2)}) per step, "
                   f"the sharded verifier {SHARDED_VERIFIER_BYTES_PER_ROW_PER_RANK} bytes per "
                   f"row per rank.")
    # backend
    others = [o for o in (_find(rec.options, **{**same, "backend": b}, k=p.k)
                          for b in cm.backends if b != p.backend) if o is not None]
    if others:
        n_bytes = rec.batch * (p.k + 1) * cm.model.hidden_size * cm.model.dtype_bytes
        lat = ", ".join(f"{b} {cm.collective_us('allreduce', n_bytes, b):.0f} us"
                        for b in [p.backend] + [o.plan.backend for o in others])
        out.append("All-reduce backend: " + "; ".join(
            f"{o.plan.backend} gives {_delta(best, o)}" for o in others)
            + f". In-situ latency per all-reduce of {_fmt_bytes(n_bytes)}: {lat}.")
    if rec.best_stock is not best:
        out.append(f"With stock vLLM 0.34 only: {describe(rec.best_stock.plan)} -> "
                   f"{rec.best_stock.tokens_per_s:.0f} tok/s.")
    if best.requires:
        out.append("Needs: " + "; ".join(best.requires) + ".")
    opt_in = settings(cm, p)
    if opt_in:
        out.append("Set: " + "; ".join(opt_in) + ".")
    return out



def caveats(cm: CostModel, rec: Recommendation,
            drafts: list[tuple[DraftProfile, Acceptance]]) -> list[str]:
    out = ["A model, not a measurement: confirm on the real box before relying on it."]
    if not cm.params.calibrated:
        out.append(f"{cm.hw.name} has no published figure to calibrate against: bandwidth "
                   f"fraction {cm.params.bandwidth_efficiency:.2f} and collective overhead "
                   f"{cm.params.collective_overhead_us:.0f} us are priors.")
    p = rec.best.plan
    if p.speculative:
        acc = dict((d.name, a) for d, a in drafts)[p.draft.name]
        if p.k > acc.measured_positions:
            out.append(f"Acceptance beyond position {acc.measured_positions} is extrapolated "
                       f"with a constant per-position rate ({acc.source}).")
        if cm.model.routing_skew == 1.0:
            out.append("Expert routing is taken as uniform and independent across the "
                       f"{rec.batch * (p.k + 1)} tokens of a step (the pessimistic case); "
                       "correlated routing makes longer drafts cheaper.")
        for a in p.draft.assumptions:
            out.append(f"{p.draft.name}: {a}")
    return out


def _fmt_bytes(n: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f} B"
