"""Recommender: which speculative-decoding configuration to run on a box.

Searches draft x k (1..7) x draft placement (tp1 / tp8 / tp8-repemb) x draft vocabulary
(full / reduced) x verifier (stock gather / sharded) x all-reduce backend, plus no
speculation on every backend, keeps what fits in memory and **what can be built from stock
vLLM 0.34.0 plus this project** (anything else is costed only for the what-if table), and
ranks by aggregate tokens/s at the given batch. Among options within ``tolerance``
(default 2 %) of the fastest, the one needing the fewest changes to stock vLLM wins, then
one whose draft length has measured (not extrapolated) acceptance.

:func:`recommend_across_band` runs the search for each acceptance scenario of a draft
(low / card / high, :mod:`.acceptance`) and picks the option with the smallest worst-case
shortfall against each scenario's own best: the robust choice.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from vllm_kimi_ext.costmodel.acceptance import Acceptance, AcceptanceBand
from vllm_kimi_ext.costmodel.catalog import DraftProfile
from vllm_kimi_ext.costmodel.draft_cost import REPLICABLE_EMBEDDING
from vllm_kimi_ext.costmodel.model import VERIFIERS, CostModel, Plan, StepEstimate

MAX_K = 7
DEFAULT_TOLERANCE = 0.02


@dataclasses.dataclass(frozen=True)
class Requirement:
    """Something a plan needs beyond stock vLLM 0.34.0."""

    text: str
    buildable: bool  # True: this project provides it; False: neither vLLM 0.34 nor we do
    short: str = ""  # a few words for tables

    def __str__(self) -> str:
        return self.text


REQ_TP1_EAGLE = Requirement(
    "draft at TP=1 (replicated on every rank): this project's patch 0006 (stock vLLM 0.34 "
    "builds EAGLE/MTP drafts on the target's TP group and ignores draft_tensor_parallel_size=1)",
    True, "patch 0006 (draft TP=1)")
REQ_TP1_MODEL = Requirement("draft model at TP=1: this project's patch 0009", True,
                            "patch 0009 (draft TP=1)")
REQ_TP1_BLOCK = Requirement(
    "a block drafter (DFlash/DSpark) at TP=1: no vLLM 0.34 option and no patch of this project",
    False, "block drafter at TP=1 (not buildable)")
REQ_REPEMB = Requirement("replicated draft embedding: this project's patch 0007 "
                         "(replicate_draft_embedding)", True, "patch 0007")
REQ_REPEMB_OTHER = Requirement("a replicated embedding for this draft kind: patch 0007 covers "
                               "EAGLE/EAGLE-3/MTP drafts only", False,
                               "replicated embedding (not buildable)")
REQ_REDUCED = Requirement("a 32K-vocabulary draft head with a d2t map: this project's "
                          "vllm-kimi-ext draft shrink-vocab (acceptance scaled by the assumed "
                          "coverage)", True, "shrink-vocab head")
REQ_REDUCED_OTHER = Requirement("a reduced-vocabulary head for this draft kind: shrink-vocab "
                                "writes EAGLE-3 heads only", False,
                                "reduced head (not buildable)")
REQ_SHARDED = Requirement("the vocabulary-sharded verifier (VLLM_KIMI_EXT_SHARDED_VERIFY=1, "
                          "experimental; requests with top-p fall back to the stock gather)",
                          True, "sharded verifier (experimental)")


def requirements(cm: CostModel, plan: Plan) -> list[Requirement]:
    """What a plan needs beyond stock vLLM 0.34 (empty = runs on stock vLLM)."""
    req = []
    spec = cm.hw.backends.get(plan.backend, {})
    if not spec.get("stock", False):
        req.append(Requirement(f"all-reduce {plan.backend}: {spec.get('requires', 'not stock')}",
                               bool(spec.get("buildable", False)), f"all-reduce {plan.backend}"))
    if not plan.speculative:
        return req
    d = plan.draft
    if d.project_requires:
        req.append(Requirement(f"draft {d.name}: {d.project_requires}", True,
                               d.raw.get("project_requires_short", f"{d.method} (project)")))
    elif not d.stock_supported:
        req.append(Requirement(f"draft {d.name}: {d.stock_note}", False,
                               f"draft {d.name} (not buildable)"))
    if plan.placement == "tp1":
        req.append(REQ_TP1_MODEL if d.kind == "draft_model" else
                   REQ_TP1_BLOCK if d.proposal == "one_pass" else REQ_TP1_EAGLE)
    elif plan.placement == "tp8-repemb":
        req.append(REQ_REPEMB if d.kind in REPLICABLE_EMBEDDING else REQ_REPEMB_OTHER)
    if plan.vocab == "reduced":
        req.append(REQ_REDUCED if d.kind in ("eagle3", "eagle3_mla") else REQ_REDUCED_OTHER)
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
    requires: tuple[Requirement, ...]

    @property
    def plan(self) -> Plan:
        return self.estimate.plan

    @property
    def stock(self) -> bool:
        return not self.requires

    @property
    def buildable(self) -> bool:
        return all(r.buildable for r in self.requires)

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
    options: tuple[Option, ...]  # every buildable option that fits, fastest first
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
            return {**o.estimate.to_dict(), "requires": [str(r) for r in o.requires],
                    "stock": o.stock, "buildable": o.buildable}

        return {
            "hardware": self.hardware, "batch": self.batch, "context": self.context,
            "calibrated": self.calibrated, "recommended": opt(self.best),
            "fastest": opt(self.fastest), "best_stock": opt(self.best_stock),
            "no_spec_stock": opt(self.no_spec_stock), "no_spec_best": opt(self.no_spec_best),
            "speedup_vs_no_spec_same_backend": self.speedup_vs_no_spec,
            "speedup_vs_stock_no_spec": self.speedup_vs_stock,
            "explanation": list(self.explanation), "caveats": list(self.caveats),
        }


def enumerate_options(
    cm: CostModel,
    drafts: list[tuple[DraftProfile, Acceptance]],
    batch: int = 1,
    context: int = 1024,
    backends: list[str] | None = None,
    k_max: int = MAX_K,
    placements: tuple[str, ...] | None = None,
    verifiers: tuple[str, ...] = VERIFIERS,
) -> list[Option]:
    """Every configuration, fitting or not, buildable or not, unsorted."""
    backends = backends or cm.backends
    out = []
    for be in backends:
        plan = Plan(k=0, backend=be, batch=batch, context=context)
        out.append(Option(cm.estimate(plan), tuple(requirements(cm, plan))))
    for (draft, acc), be in itertools.product(drafts, backends):
        pls = [p for p in cm.placement_options(draft) if placements is None or p in placements]
        for k, pl, vo, ve in itertools.product(range(1, min(k_max, draft.max_k) + 1), pls,
                                               cm.vocab_options(draft), verifiers):
            plan = Plan(k=k, draft=draft, placement=pl, vocab=vo, verifier=ve, backend=be,
                        batch=batch, context=context)
            out.append(Option(cm.estimate(plan, acc), tuple(requirements(cm, plan))))
    return out


def extrapolated(option: Option, acceptances: dict[str, Acceptance]) -> bool:
    """Whether the option's draft length lies beyond the measured acceptance positions."""
    p = option.plan
    return p.speculative and p.k > acceptances[p.draft.name].measured_positions


def pick(options: list[Option], tolerance: float, acceptances: dict[str, Acceptance]) -> Option:
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
    from vllm_kimi_ext.costmodel.explain import caveats, explain

    every = [o for o in enumerate_options(cm, drafts, batch, context, backends, k_max)
             if o.estimate.fits]
    options = [o for o in every if (o.stock if stock_only else o.buildable)]
    if not options:
        raise ValueError("no configuration fits in memory; lower --context or --batch")
    options.sort(key=lambda o: -o.tokens_per_s)
    accs = {d.name: a for d, a in drafts}
    best = pick(options, tolerance, accs)
    stock = [o for o in options if o.stock]
    no_spec = [o for o in options if not o.plan.speculative]
    nccl = [o for o in no_spec if o.plan.backend == "nccl"] or no_spec
    rec = Recommendation(
        hardware=cm.hw.name, batch=batch, context=context, calibrated=cm.params.calibrated,
        best=best, fastest=options[0],
        best_stock=pick(stock, tolerance, accs) if stock else best,
        no_spec_stock=nccl[0], no_spec_best=no_spec[0], options=tuple(options),
        explanation=(), caveats=(),
    )
    return dataclasses.replace(rec, explanation=tuple(explain(cm, rec, drafts)),
                               caveats=tuple(caveats(cm, rec, drafts)))


# ---------------------------------------------------------------------------------------------
# Across the acceptance band
# ---------------------------------------------------------------------------------------------


def same_config(a: Plan, b: Plan) -> bool:
    return (a.k, a.placement, a.vocab, a.verifier, a.backend) == \
        (b.k, b.placement, b.vocab, b.verifier, b.backend) and \
        (a.draft.name if a.draft else None) == (b.draft.name if b.draft else None)


@dataclasses.dataclass(frozen=True)
class BandRecommendation:
    """One configuration judged in every acceptance scenario."""

    draft: DraftProfile
    band: AcceptanceBand
    per_scenario: dict[str, Recommendation]  # each scenario's own recommendation
    robust: Option  # the chosen configuration, estimated in the card scenario
    robust_tps: dict[str, float]  # its tokens/s in each scenario
    robust_tau: dict[str, float]

    @property
    def worst_shortfall(self) -> float:
        """Largest fraction by which the robust choice trails a scenario's own best."""
        return max(1 - self.robust_tps[s] / r.best.tokens_per_s
                   for s, r in self.per_scenario.items())

    def holds_across_band(self, tolerance: float = DEFAULT_TOLERANCE) -> bool:
        return self.worst_shortfall <= tolerance


def recommend_across_band(cm: CostModel, draft: DraftProfile, band: AcceptanceBand,
                          batch: int = 1, context: int = 1024, **kw: Any) -> BandRecommendation:
    per = {s: recommend(cm, [(draft, acc)], batch=batch, context=context, **kw)
           for s, acc in band.scenarios().items()}
    by_s = {s: {_key(o.plan): o for o in r.options} for s, r in per.items()}
    common = set.intersection(*(set(v) for v in by_s.values()))

    def worst(key) -> float:
        return max(1 - by_s[s][key].tokens_per_s / per[s].best.tokens_per_s for s in per)

    floor = min(worst(key) for key in common)
    tolerance = kw.get("tolerance", DEFAULT_TOLERANCE)
    close = [key for key in common if worst(key) <= floor + tolerance]
    chosen = min(close, key=lambda key: (len(by_s["card"][key].requires),
                                         -by_s["low"][key].tokens_per_s))
    return BandRecommendation(
        draft=draft, band=band, per_scenario=per, robust=by_s["card"][chosen],
        robust_tps={s: by_s[s][chosen].tokens_per_s for s in per},
        robust_tau={s: by_s[s][chosen].estimate.tau for s in per})


def _key(p: Plan) -> tuple:
    return (p.draft.name if p.draft else None, p.k, p.placement, p.vocab, p.verifier, p.backend)


def describe(plan: Plan) -> str:
    if not plan.speculative:
        return f"no speculation, {plan.backend} all-reduce"
    return (f"{plan.draft.name}, k={plan.k}, draft {plan.placement} with {plan.vocab} vocabulary, "
            f"{'stock all-gather' if plan.verifier == 'gather' else 'sharded'} verifier, "
            f"{plan.backend} all-reduce")


def fmt_bytes(n: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f} B"
