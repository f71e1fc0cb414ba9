"""What-if: the gain of each setting a user can apply today, across batch and acceptance.

For every batch (1, 16, 64) and acceptance scenario (low / card / high) the baseline is the
recommender's best buildable configuration (:func:`~.recommend.recommend`). A lever
changes one thing and the draft length is re-optimised (k = 1..7) with every other choice
of the baseline kept; the gain is its best tokens/s over the baseline's.

Every lever is of one :data:`KINDS`: a **setting** (an environment variable or a
``--speculative-config`` field of stock vLLM 0.34.0 or NCCL), a **package** to install,
something **this project** ships, or an **upper bound, no setting** (a mechanism's ceiling
that nothing available today reaches). Each says exactly what to set or install
(:attr:`Lever.action`) and the public measurements it is costed from
(:attr:`Lever.rests_on`); the numbers themselves live, with their sources, in the
``settings`` block of the shipped PCIe latency table.

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
import functools
import math
from collections.abc import Callable

from vllm_kimi_ext import facts
from vllm_kimi_ext.costmodel.acceptance import Acceptance, AcceptanceBand
from vllm_kimi_ext.costmodel.catalog import DraftProfile, ProfileError, load_raw
from vllm_kimi_ext.costmodel.latency import curve_from_points
from vllm_kimi_ext.costmodel.model import CostModel, Plan, Variant
from vllm_kimi_ext.costmodel.options import requirements
from vllm_kimi_ext.costmodel.recommend import MAX_K, recommend

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


#: What a row asks of the user. Every row is one of these; "upper bound, no setting" rows
#: are kept to show how much a mechanism could be worth, and say so.
KINDS = ("setting", "package", "this project", "upper bound, no setting")
UPPER_BOUND = KINDS[-1]


@dataclasses.dataclass(frozen=True)
class Lever:
    key: str
    name: str
    kind: str  # one of KINDS
    action: str  # exactly what to set or install ("" for an upper bound)
    rests_on: str  # the measured numbers it is costed from, with their public source
    assumption: str  # how the model turns them into a step time
    built: bool = False  # shipped by this project

    @property
    def takes(self) -> str:
        return self.action or "no setting exists"


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


# ---------------------------------------------------------------------------------------------
# Public measurements of the settings (``settings`` of the shipped PCIe latency table)
# ---------------------------------------------------------------------------------------------

SETTINGS_TABLE = "rtx-pro-6000-pcie-x8"
FLASHINFER = "flashinfer_pcie_ipc"


@functools.lru_cache(maxsize=1)
def settings_data() -> dict:
    """The ``settings`` block of the shipped PCIe latency table (numbers with sources)."""
    raw = load_raw("latency", SETTINGS_TABLE)
    block = raw.get("settings")
    if not isinstance(block, dict):
        raise ProfileError(f"latency table {SETTINGS_TABLE!r}: field 'settings' is missing")
    return block


def cite(source_id: str) -> str:
    """``repo ref`` of a source of the settings block."""
    src = settings_data()["sources"][source_id]
    return f"{src['repo']} {src['ref']}"


def flashinfer_table(cm: CostModel):
    """``cm``'s latency table with FlashInfer's PCIe-IPC all-reduce costed as the one-shot
    IPC all-reduce measured in situ on the calibration host (the table's ``custom_oneshot``
    curve, NCCL wherever that is faster). Its public microbenchmark is not used for the
    latencies: it was taken against an NCCL that needed ~205 us at 12 KiB
    (``microbenchmark_nccl_us``), several times this host's in-situ NCCL, so its absolute
    numbers do not transfer (:func:`microbenchmark_baseline_ratio`)."""
    spec = settings_data()["flashinfer_pcie_ipc"]
    curve = cm.latency.curves[ONESHOT]["allreduce"]
    return cm.latency.with_curve(FLASHINFER, "allreduce", curve,
                                 description=spec["setting"], auto_crossover=True)


def microbenchmark_baseline_ratio(cm: CostModel) -> float:
    """The microbenchmark's NCCL latency over this table's NCCL at the same size."""
    nbytes, us, _ = settings_data()["flashinfer_pcie_ipc"]["microbenchmark_nccl_us"][0]
    return us / cm.latency.latency_us("allreduce", nbytes, "nccl")


def _flashinfer(cm, base, acc):
    if ONESHOT not in cm.latency.backends:
        return None  # no in-situ one-shot measurement in this table
    return _best_k(cm.with_latency(flashinfer_table(cm)), base, acc, backend=FLASHINFER)


#: The all-reduce rows checked against the public speculative A/B (one-shot all-reduces).
ONESHOT = "custom_oneshot"
ONESHOT_ROWS = ("flashinfer-pcie-ipc", "b12x")


@dataclasses.dataclass(frozen=True)
class SpeculativeCheck:
    """A one-shot all-reduce's end-to-end gain over NCCL at batch 1, without speculation
    and with ``k`` draft tokens: the model's beside the public A/B's."""

    k: int
    model_without: float
    model_with: float
    public_without: float
    public_with: float
    public_text: str

    @property
    def public_ratio(self) -> float:
        return self.public_with / self.public_without

    def holds(self, slack: float = 0.01) -> bool:
        """The model's gain shrinks under speculation at least as much as the public A/B's
        (``slack``: an absolute allowance)."""
        return self.model_with <= self.model_without * self.public_ratio + slack

    def text(self) -> str:
        return (f"the model gives a one-shot all-reduce {self.model_without:+.1%} over NCCL "
                f"without speculation and {self.model_with:+.1%} with k = {self.k} (batch 1); "
                f"{self.public_text}: {self.public_without:+.1%} and {self.public_with:+.1%}")


def speculative_check(cm: CostModel, draft: DraftProfile, acc: Acceptance, k: int = 3
                      ) -> SpeculativeCheck | None:
    """The one-shot all-reduce rows against the public speculative A/B (None when the table
    has no one-shot curve)."""
    if ONESHOT not in cm.latency.backends:
        return None
    ab = settings_data()["speculative_ab"]

    def gain(plan: Plan) -> float:
        e0 = cm.estimate(plan, acc if plan.speculative else None).tokens_per_s
        e1 = cm.estimate(dataclasses.replace(plan, backend=ONESHOT),
                         acc if plan.speculative else None).tokens_per_s
        return e1 / e0 - 1

    plain = Plan(k=0, batch=1, context=1024, backend="nccl")
    spec = Plan(k=k, draft=draft, batch=1, context=1024, backend="nccl")
    return SpeculativeCheck(k, gain(plain), gain(spec), ab["gain_without_speculation"],
                            ab["gain_with_speculation"],
                            f"{cite(ab['source'])} measured {ab['what']} ({ab['speculation']}, "
                            f"TP {ab['tp']}, batch {ab['batch']})")


def nccl_simple_table(cm: CostModel):
    """``cm``'s latency table as on a box whose NCCL picks the Simple protocol for small
    messages: the NCCL all-reduce curve times the published Simple/LL latency ratio at each
    size up to the largest measured one (ratio 1 above it: unmeasured)."""
    pts = sorted(settings_data()["nccl_proto_ll"]["simple_then_ll_us"])

    def ratio(x: float) -> float:  # linear in log(bytes); the first ratio below; 1 above
        if x > pts[-1][0]:
            return 1.0
        if x <= pts[0][0]:
            return pts[0][1] / pts[0][2]
        i = next(j for j in range(1, len(pts)) if x <= pts[j][0])
        (x0, a0, b0), (x1, a1, b1) = pts[i - 1], pts[i]
        t = math.log(x / x0) / math.log(x1 / x0)
        return a0 / b0 + t * (a1 / b1 - a0 / b0)

    nccl = cm.latency.curves["nccl"]["allreduce"]
    sizes = sorted(set(nccl.sizes) | {float(x) for x, _, _ in pts})
    lifted = [[x, nccl(x) * ratio(x)] for x in sizes]
    return cm.latency.with_curve("nccl", "allreduce",
                                 curve_from_points(lifted, "NCCL with the Simple protocol"))


def _nccl_ll(cm, base, acc):
    """Gain of NCCL_PROTO=LL on a box where NCCL picks Simple: today's curve (LL-level, the
    calibration host's NCCL) against the Simple one."""
    with_ll = _best_k(cm, base, acc)
    without = _best_k(cm.with_latency(nccl_simple_table(cm)), base, acc)
    if None in (with_ll, without):
        return None
    return with_ll * with_ll / without  # the baseline scaled by the LL/Simple ratio


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
    """vLLM 0.34.0 reads ``enable_adaptive_verification`` for every speculative method (the
    base ``DraftModelSpeculator`` and the runner's ``AdaptiveVerificationManager``; the field
    is not in ``_METHOD_SPECIFIC_OPTIONS``), although its docstring says DSpark only."""
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


def _set(**changes) -> Evaluate:
    def ev(cm, base, acc):
        opts = cm.placement_options(base.draft)
        if changes.get("placement") and changes["placement"] not in opts:
            return None
        if changes.get("vocab") and changes["vocab"] not in cm.vocab_options(base.draft):
            return None
        if not all(r.buildable for r in requirements(cm, dataclasses.replace(base, **changes))):
            return None  # e.g. a block drafter at TP=1: nobody builds it
        return _best_k(cm, base, acc, **changes)
    return ev


def _setting_levers() -> list[tuple[Lever, Evaluate]]:
    """The settings and packages, costed from the public numbers of :func:`settings_data`."""
    s = settings_data()
    fi, ll, bx = s["flashinfer_pcie_ipc"], s["nccl_proto_ll"], s["b12x_oneshot"]
    fi_nccl, ab = fi["microbenchmark_nccl_us"][0], s["speculative_ab"]
    fi_pts = ", ".join(f"{x / 1024:g} KiB {us:g} us" for x, us, _ in fi["allreduce"])
    tpot = fi["end_to_end"]["tpot_change"]
    ll_pts = ", ".join(f"{x // 1024} KB {a:g} -> {b:g} us" for x, a, b in ll["simple_then_ll_us"])
    host = ll["calibration_host"]
    b12 = bx["allreduce_1x7168_16gpu_us"]
    return [
        (Lever("flashinfer-pcie-ipc", "FlashInfer PCIe-IPC all-reduce", "setting",
               f"{fi['setting']} (vLLM 0.34.0, TP 2/4/8)",
               f"8x SM120 microbenchmark {fi_pts} against an NCCL at {fi_nccl[1]:g} us at "
               f"{fi_nccl[0] / 1024:g} KiB ({cite('flashinfer-pr-4393')}), so its absolute "
               f"latencies are not used; SGLang with it: time per output token "
               f"{tpot[0]:+.0%} to {tpot[1]:+.0%} ({cite('sglang-pr-34528')}); check: "
               f"{cite(ab['source'])}, one-shot vs NCCL {ab['gain_without_speculation']:+.1%} "
               f"without and {ab['gain_with_speculation']:+.1%} with speculation",
               "the one-shot IPC all-reduce measured in situ on the calibration host (latency "
               "table, custom_oneshot) on the speculative step's message sizes ((k+1) x "
               "batch x hidden bf16), NCCL where faster; checked against the public "
               "speculative A/B (what-to-run.md, under this table)"), _flashinfer),
        (Lever("nccl-ll", "NCCL low-latency protocol (box whose NCCL picks Simple)", "setting",
               f"{ll['setting']} (never LL128 on PCIe: {cite('nccl-issue-281')})",
               f"8-GPU all-reduce with Simple -> LL: {ll_pts} ({cite(ll['source'])}); on the "
               f"calibration host (NCCL PR #2127) Kimi MTP at concurrency 32 gave "
               f"{host['default_tps']:g} tok/s by default and {host['ll_tps']:g} with LL "
               f"({cite(host['source'])})",
               "gain on a box whose NCCL picks Simple (stock NCCL 2.28 on AMD Turin, no "
               "topology XML): its NCCL curve is today's times the Simple/LL ratio up to "
               "256 KB; 0 % where NCCL already picks LL, as on the calibration host"), _nccl_ll),
        (Lever("b12x", "One-shot PCIe all-reduce (b12x package)", "package",
               f"{bx['install']}",
               f"[1, {facts.target_dims().hidden_size}] bf16 all-reduce on 16 GPUs "
               f"{b12['b12x']:g} us against NCCL "
               f"{b12['nccl']:g} us ({cite(b12['source'])}); costed with the one-stage "
               "kernel measured on the calibration host (latency table, custom_oneshot)",
               "the latency table's measured one-stage kernel, NCCL above its crossover; "
               "needs a vLLM fork or SGLang: no vLLM 0.34.0 setting"), _with_backend),
        (Lever("adaptive", "Adaptive verification (oracle bound)", "setting",
               '"enable_adaptive_verification": true in --speculative-config, with full CUDA '
               "graphs (cudagraph_mode FULL, FULL_DECODE_ONLY or FULL_AND_PIECEWISE; vLLM "
               "0.34.0 refuses it otherwise, and with LoRA)",
               "no measurement on Kimi: the oracle that verifies exactly up to the first "
               "rejection (upper bound of the setting)",
               "verify tokens per sequence = 1 + the positions reached; every method: vLLM "
               "0.34.0's base speculator reads the flag and the DSpark, DFlash2, suffix and "
               "autoregressive speculators act on it, although the field's docstring says "
               "DSpark only; an attention backend that cannot replay varied query lengths "
               "in its decode graphs is refused at start"), _adaptive),
    ]


def _bound_and_project_levers() -> list[tuple[Lever, Evaluate]]:
    """The upper bounds (no setting reaches them) and what this project ships."""
    return [
        (Lever("nccl-tuning", "NCCL per-call cost down to its idle microbenchmark",
               UPPER_BOUND, "",
               "the fitted in-situ overhead per collective (calibration.fitted of the hardware "
               "profile)",
               "that overhead set to zero; no known setting removes it"), _nccl_tuned),
        (Lever("overlap", "Drafting overlapped with the target pass's all-reduce waits",
               UPPER_BOUND, "",
               "nothing measured: all draft compute hidden inside the target's collective "
               "time", "a second stream and a pipelined draft; not in vLLM 0.34.0"), _overlap),
        (Lever("tree-2", "Tree verification: top-2 candidates at every depth (2k nodes)",
               UPPER_BOUND, "",
               "nothing measured: siblings accepted independently at the top-1 rate",
               "widened chain; vLLM 0.34.0 has no tree attention in the verifier"),
         _tree(lambda k: [2] * k)),
        (Lever("tree-4x1", "Tree verification: top-4 candidates at depth 1 (k+3 nodes)",
               UPPER_BOUND, "",
               "nothing measured: siblings accepted independently at the top-1 rate",
               "widened chain; vLLM 0.34.0 has no tree attention in the verifier"),
         _tree(lambda k: [4] + [1] * (k - 1))),
        (Lever("draft+0.5", "A better draft: acceptance length + 0.5", UPPER_BOUND, "",
               "no draft measured at that acceptance; training one is the route "
               "(docs/training-a-draft.md)",
               "same draft cost, acceptance length at the card's k raised by 0.5 (constant "
               "rate)"), _better_draft(0.5)),
        (Lever("draft+1.0", "A better draft: acceptance length + 1.0", UPPER_BOUND, "",
               "no draft measured at that acceptance; training one is the route "
               "(docs/training-a-draft.md)",
               "same draft cost, acceptance length at the card's k raised by 1.0 (constant "
               "rate)"), _better_draft(1.0)),
        (Lever("sharded", "Vocabulary-sharded verifier (experimental)", "this project",
               "VLLM_KIMI_EXT=1 VLLM_KIMI_EXT_SHARDED_VERIFY=1",
               f"the gather it removes: (k+1) x {facts.target_dims().vocab_size} bf16 logits "
               "per sequence per step",
               "its verify step priced from the measured H200 report (docs/cost-model.md, "
               "verify block); not priced where not measured",
               built=True), _set(verifier="sharded")),
        (Lever("repemb", "Replicated draft embedding", "this project",
               "VLLM_KIMI_EXT_REPLICATE_DRAFT_EMBEDDING=1 (this project's runtime patch)",
               "one draft collective fewer per draft token; 2 GB more per GPU",
               "EAGLE/EAGLE-3/MTP drafts only", built=True), _set(placement="tp8-repemb")),
        (Lever("tp1", "Draft at TP=1", "this project",
               '"draft_tensor_parallel_size": 1 in --speculative-config (this project\'s '
               'patches)', "no draft collectives; every GPU streams the whole draft",
               "EAGLE/EAGLE-3/MTP and draft models", built=True), _set(placement="tp1")),
    ]


LEVERS: list[tuple[Lever, Evaluate]] = _setting_levers() + _bound_and_project_levers()


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
    rows.sort(key=lambda r: (r.lever.built, r.lever.kind == UPPER_BOUND,
                             -(r.gain(batches[0]) or -1.0)))
    return rows
