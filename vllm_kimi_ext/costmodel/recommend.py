"""Recommender: which speculative-decoding configuration to run on a box.

Searches draft x k (1..7) x draft placement (tp1 / tp8 / tp8-repemb) x draft vocabulary
(full / reduced) x verifier (stock gather / sharded) x all-reduce backend, plus no
speculation on every backend, keeps what fits in memory and **what can be built from stock
vLLM 0.34.0 plus this project** (anything else is costed only for the what-if table), and
ranks by aggregate tokens/s at the given batch. Among options within ``tolerance``
(default 2 %) of the fastest, the one needing the fewest changes to stock vLLM wins, then
one whose draft length has measured (not extrapolated) acceptance.

Which configuration to *run* also weighs what has run in public: :func:`~.headline.answer`
applies that rule over these options.
"""

from __future__ import annotations

import dataclasses
import itertools

from vllm_kimi_ext.costmodel.acceptance import Acceptance
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


def no_option_reason(fitting: list[Option], stock_only: bool) -> str:
    """Why no option is left: nothing fits, or what the fitting ones need that cannot be
    built (the first such requirement)."""
    if not fitting:
        return "no configuration fits in memory; lower --context or --batch"
    where = "stock vLLM 0.34.0" if stock_only else "stock vLLM 0.34.0 plus this project"
    for o in fitting:
        for r in o.requires:
            if stock_only or not r.buildable:
                return f"no configuration that fits can be built from {where}: it needs {r}"
    return f"no configuration that fits can be built from {where}"


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
        raise ValueError(no_option_reason(every, stock_only))
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
