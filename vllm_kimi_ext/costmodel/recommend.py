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
from vllm_kimi_ext.costmodel.explain import caveats, explain
from vllm_kimi_ext.costmodel.model import VERIFIERS, CostModel, Plan
from vllm_kimi_ext.costmodel.options import (  # noqa: F401 (re-exported for callers)
    Option,
    Recommendation,
    Requirement,
    describe,
    fmt_bytes,
    requirements,
    settings,
)

MAX_K = 7
DEFAULT_TOLERANCE = 0.02


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
