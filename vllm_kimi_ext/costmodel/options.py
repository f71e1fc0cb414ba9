"""What a configuration needs beyond stock vLLM 0.34.0, and the option/recommendation records.

Every :class:`Requirement` says whether this project provides it (``buildable``) or nobody
does; an :class:`Option` is buildable when all its requirements are.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm_kimi_ext.costmodel.draft_cost import REPLICABLE_EMBEDDING
from vllm_kimi_ext.costmodel.model import CostModel, Plan, StepEstimate
from vllm_kimi_ext.patch_ids import DRAFT_MODEL_TP1, DRAFT_TP1, ref


@dataclasses.dataclass(frozen=True)
class Requirement:
    """Something a plan needs beyond stock vLLM 0.34.0."""

    text: str
    buildable: bool  # True: this project provides it; False: neither vLLM 0.34 nor we do
    short: str = ""  # a few words for tables

    def __str__(self) -> str:
        return self.text


_TP1_EAGLE = ref(*DRAFT_TP1)
REQ_TP1_EAGLE = Requirement(
    f"draft at TP=1 (replicated on every rank): this project's {_TP1_EAGLE} (stock vLLM 0.34 "
    "builds EAGLE/MTP drafts on the target's TP group and ignores draft_tensor_parallel_size=1)",
    True, f"{_TP1_EAGLE} (draft TP=1)")
_TP1_MODEL = ref(*DRAFT_MODEL_TP1)
REQ_TP1_MODEL = Requirement(f"draft model at TP=1: this project's {_TP1_MODEL}", True,
                            f"{_TP1_MODEL} (draft TP=1)")
REQ_TP1_BLOCK = Requirement(
    "a block drafter (DFlash/DSpark) at TP=1: no vLLM 0.34 option and no patch of this project",
    False, "block drafter at TP=1 (not buildable)")
_REPEMB = ref("replicate-draft-embedding")
REQ_REPEMB = Requirement(f"replicated draft embedding: this project's {_REPEMB} "
                         "(VLLM_KIMI_EXT_REPLICATE_DRAFT_EMBEDDING=1)", True, _REPEMB)
REQ_REPEMB_OTHER = Requirement(f"a replicated embedding for this draft kind: {_REPEMB} covers "
                               "EAGLE/EAGLE-3/MTP drafts only", False,
                               "replicated embedding (not buildable)")
REQ_REDUCED = Requirement("a 32K-vocabulary draft head with a d2t map: this project's "
                          "vllm-kimi-ext draft shrink-vocab (acceptance scaled by the assumed "
                          "coverage)", True, "shrink-vocab head")
REQ_REDUCED_OTHER = Requirement("a reduced-vocabulary head for this draft kind: shrink-vocab "
                                "writes EAGLE-3 heads only", False,
                                "reduced head (not buildable)")
REQ_SHARDED = Requirement("the vocabulary-sharded verifier (VLLM_KIMI_EXT_SHARDED_VERIFY=1), "
                          "measured faster than stock under Kimi's sampling at this batch",
                          True, "sharded verifier")


def _sharded_requirement(cm: CostModel, plan: Plan) -> Requirement:
    """REQ_SHARDED where the measured verify steps price it below stock (verify_cost.py),
    else a requirement nobody meets: the recommender never offers a slower verifier."""
    from vllm_kimi_ext.costmodel.verify_cost import sharded_recommendable

    ok, why = sharded_recommendable(cm, plan.batch, plan.k)
    if ok:
        return REQ_SHARDED
    return Requirement(f"the vocabulary-sharded verifier (VLLM_KIMI_EXT_SHARDED_VERIFY=1): {why}",
                       False, "sharded verifier (not measured faster)")


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
        req.append(_sharded_requirement(cm, plan))
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
