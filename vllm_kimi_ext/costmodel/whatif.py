"""What-if: the gain each lever not built yet would bring, across batch and acceptance.

For every batch (1, 16, 64) and acceptance scenario (low / card / high) the baseline is the
recommender's best buildable configuration (:func:`~.recommend.recommend`). A lever
changes one thing and the draft length is re-optimised (k = 1..7) with every other choice
of the baseline kept; the gain is its best tokens/s over the baseline's. Each lever states
the assumption it rests on and what building it would take. Levers this project already
ships are listed too, measured the same way, so the ranking compares like with like.

Tree verification is costed as a *widened chain*: at depth ``i`` the draft's top ``w_i``
candidates are verified, only the top-1 path continues. With the chain's conditional
acceptance ``a_i``, sibling candidates are taken as accepted independently at the same
rate (an upper bound: a draft's second choice is accepted less often than its first), so
depth ``i`` is accepted with ``c_i = 1 - (1 - a_i)^w_i`` and
``tau = 1 + sum_i (prod_{j<i} a_j) c_i``; the pass verifies ``1 + sum_i w_i`` tokens per
sequence, touching more experts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from vllm_kimi_ext.costmodel.acceptance import Acceptance, AcceptanceBand
from vllm_kimi_ext.costmodel.catalog import DraftProfile
from vllm_kimi_ext.costmodel.latency import load_latency_table
from vllm_kimi_ext.costmodel.model import CostModel, Plan, Variant
from vllm_kimi_ext.costmodel.recommend import MAX_K, recommend
from vllm_kimi_ext.patch_ids import DRAFT_MODEL_TP1, ref

BATCHES = (1, 16, 64)


def tree_tau(acc: Acceptance, widths: list[int]) -> float:
    """Acceptance length of a widened chain with ``widths[i]`` candidates at depth i+1."""
    tau, reach = 1.0, 1.0
    for i, w in enumerate(widths, start=1):
        a = acc.conditional_at(i)
        tau += reach * (1.0 - (1.0 - a) ** w)
        reach *= a
    return tau


def adaptive_verify_tokens(acc: Acceptance, k: int) -> float:
    """Tokens verified per sequence by an oracle that stops at the first rejection: the
    bonus position plus every draft position reached (``1 + sum_{i<k} r_i``, r_0 = 1)."""
    return 1.0 + 1.0 + sum(acc.per_position(k - 1))


@dataclasses.dataclass(frozen=True)
class Lever:
    key: str
    name: str
    assumption: str
    takes: str  # what building it would take / where it comes from
    built: bool = False


#: Evaluates a lever: (model, baseline plan, acceptance) -> best tokens/s over k, or None.
Evaluate = Callable[[CostModel, Plan, Acceptance], "float | None"]


def _best_k(cm: CostModel, base: Plan, acc: Acceptance,
            variant_for: Callable[[int], Variant | None] = lambda k: None,
            **changes) -> float | None:
    best = None
    draft = base.draft
    for k in range(1, min(MAX_K, draft.max_k) + 1):
        plan = dataclasses.replace(base, k=k, **changes)
        e = cm.estimate(plan, acc, variant_for(k))
        if e.fits and (best is None or e.tokens_per_s > best):
            best = e.tokens_per_s
    return best


def _with_backend(cm, base, acc):
    if "custom_oneshot" not in cm.latency.backends:
        return None
    return _best_k(cm, base, acc, backend="custom_oneshot")


def _nccl_tuned(cm, base, acc):
    tuned = cm.with_params(dataclasses.replace(cm.params, collective_overhead_us=0.0))
    return _best_k(tuned, base, acc)


def _tree(widths_for: Callable[[int], list[int]]) -> Evaluate:
    def ev(cm, base, acc):
        def variant(k):
            w = widths_for(k)
            return Variant(verify_tokens_per_seq=1 + sum(w), tau=tree_tau(acc, w))
        return _best_k(cm, base, acc, variant)
    return ev


def _adaptive(cm, base, acc):
    return _best_k(cm, base, acc, lambda k: Variant(
        verify_tokens_per_seq=adaptive_verify_tokens(acc, k)))


def _overlap(cm, base, acc):
    return _best_k(cm, base, acc, lambda k: Variant(hide_draft_behind_comm=True))


def _better_draft(delta: float) -> Evaluate:
    def ev(cm, base, acc):
        k = int((base.draft.acceptance or {}).get("k_ref", 3))
        better = Acceptance.from_tau(min(acc.tau(k) + delta, k + 0.999), k,
                                     f"tau({k}) {acc.tau(k):.2f} + {delta:g}")
        return _best_k(cm, base, better)
    return ev


def _oneshot_on(table: str) -> Evaluate:
    """The one-shot kernel's gain on another measured box, applied to this baseline."""
    def ev(cm, base, acc):
        other = cm.with_latency(load_latency_table(table))
        with_it = _best_k(other, base, acc, backend="custom_oneshot")
        without = _best_k(other, base, acc, backend="nccl")
        here = _best_k(cm, base, acc)
        if None in (with_it, without, here):
            return None
        return here * with_it / without
    return ev


def _set(**changes) -> Evaluate:
    def ev(cm, base, acc):
        opts = cm.placement_options(base.draft)
        if changes.get("placement") and changes["placement"] not in opts:
            return None
        if changes.get("vocab") and changes["vocab"] not in cm.vocab_options(base.draft):
            return None
        return _best_k(cm, base, acc, **changes)
    return ev


LEVERS: list[tuple[Lever, Evaluate]] = [
    (Lever("oneshot", "One-shot PCIe all-reduce (custom kernel, NCCL above its crossover)",
           "the latency table's measured one-stage kernel on this box",
           "an all-reduce from another library or a vLLM fork (luke's SGLang kernel, b12x, a "
           "forced vLLM C++ custom all-reduce); vLLM 0.34 refuses its own above 2 PCIe GPUs"),
     _with_backend),
    (Lever("oneshot-switch", "One-shot PCIe all-reduce on a single-CPU PCIe-switch box",
           "gain of luke's measured kernel over NCCL on that box (its own latency table)",
           "a PCIe-switch box and the same out-of-tree kernel as above"),
     _oneshot_on("rtx-pro-6000-pcie-switch-x8")),
    (Lever("nccl-tuning", "NCCL per-call cost down to its idle microbenchmark",
           "the fitted in-situ overhead per collective (rank skew, launch) removed",
           "NCCL tuning (protocol, channels, graph registration) or tighter rank "
           "synchronisation; unmeasured on this box"), _nccl_tuned),
    (Lever("tree-2", "Tree verification: top-2 candidates at every depth (2k nodes)",
           "widened chain; siblings accepted independently at the top-1 rate (upper bound)",
           "tree attention in the verifier and a tree drafter; vLLM 0.34 has none"),
     _tree(lambda k: [2] * k)),
    (Lever("tree-4x1", "Tree verification: top-4 candidates at depth 1 (k+3 nodes)",
           "widened chain; siblings accepted independently at the top-1 rate (upper bound)",
           "tree attention in the verifier; vLLM 0.34 has none"),
     _tree(lambda k: [4] + [1] * (k - 1))),
    (Lever("adaptive", "Adaptive verification (vLLM 0.34, oracle bound)",
           "verifies exactly up to the first rejection, losing no acceptance (an oracle)",
           "stock vLLM 0.34 option; needs full CUDA graphs and refuses local-argmax drafting; "
           "its real trimming depends on the draft's confidence, unmeasured on Kimi"),
     _adaptive),
    (Lever("overlap", "Drafting overlapped with the target pass's all-reduce waits",
           "all draft compute hidden inside the target's collective time (upper bound)",
           "a second stream and a pipelined draft; not in vLLM 0.34"), _overlap),
    (Lever("draft+0.5", "A better draft: acceptance length + 0.5",
           "same draft cost, acceptance length at the card's k raised by 0.5 (constant rate)",
           "draft training (vllm-kimi-ext train, SpecForge, speculators)"), _better_draft(0.5)),
    (Lever("draft+1.0", "A better draft: acceptance length + 1.0",
           "same draft cost, acceptance length at the card's k raised by 1.0 (constant rate)",
           "draft training (vllm-kimi-ext train, SpecForge, speculators)"), _better_draft(1.0)),
    (Lever("sharded", "Vocabulary-sharded verifier (built, experimental)",
           "every request without top-p (top-p falls back to the stock gather)",
           "this project: VLLM_KIMI_EXT_SHARDED_VERIFY=1", built=True),
     _set(verifier="sharded")),
    (Lever("repemb", f"Replicated draft embedding (built, {ref('replicate-draft-embedding')})",
           "one draft collective fewer per draft token; 2 GB more per GPU",
           "this project: replicate_draft_embedding", built=True), _set(placement="tp8-repemb")),
    (Lever("tp1", f"Draft at TP=1 (built, {ref(*DRAFT_MODEL_TP1)})",
           "no draft collectives; every GPU streams the whole draft",
           "this project: draft_tensor_parallel_size 1", built=True), _set(placement="tp1")),
]


@dataclasses.dataclass(frozen=True)
class LeverRow:
    lever: Lever
    gains: dict[int, dict[str, float | None]]  # batch -> scenario -> relative gain

    def gain(self, batch: int = 1, scenario: str = "card") -> float | None:
        return self.gains[batch][scenario]


def baseline(cm: CostModel, draft: DraftProfile, acc: Acceptance, batch: int, context: int
             ) -> tuple[Plan, float]:
    """The recommender's best buildable plan (a speculative one to vary) and its tokens/s."""
    rec = recommend(cm, [(draft, acc)], batch=batch, context=context)
    spec = [o for o in rec.options if o.plan.speculative and o.plan.draft.name == draft.name]
    plan = rec.best.plan if rec.best.plan.speculative else max(
        spec, key=lambda o: o.tokens_per_s).plan
    return plan, rec.best.tokens_per_s


def lever_table(cm: CostModel, draft: DraftProfile, band: AcceptanceBand,
                batches: tuple[int, ...] = BATCHES, context: int = 1024) -> list[LeverRow]:
    """Every lever's gain per batch and acceptance scenario, ranked by the card gain at the
    first batch (levers not built first)."""
    bases = {(b, s): baseline(cm, draft, acc, b, context)
             for b in batches for s, acc in band.scenarios().items()}
    rows = []
    for lever, ev in LEVERS:
        gains: dict[int, dict[str, float | None]] = {}
        for b in batches:
            gains[b] = {}
            for s, acc in band.scenarios().items():
                plan, tps = bases[(b, s)]
                got = ev(cm, plan, acc)
                gains[b][s] = None if got is None else got / tps - 1.0
        rows.append(LeverRow(lever, gains))
    rows.sort(key=lambda r: (r.lever.built, -(r.gain(batches[0]) or -1.0)))
    return rows
