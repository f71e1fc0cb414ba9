"""The answer to "what should I run on 8x RTX PRO 6000": one function, every reader.

:func:`answer` is the only function that answers it, for any set of drafts; :func:`headline`
is its answer for the drafts trained for Kimi-K2.5 at batch 1, context 1024. Per draft it
ranks the configurations buildable from stock vLLM 0.34.0 plus this project at the draft's
**point acceptance** (:func:`~.acceptance.point_for`: the public field figure where one
exists, else the card shrunk by the mean field/card ratio). Each configuration carries its
**evidence level** (:mod:`.evidence`), its **interval** (:mod:`.interval`: calibrated on the
model's out-of-sample errors, around the point estimate, with its stated coverage) and,
separately, its **acceptance band's spread** (tokens/s at the low and high ends of
:func:`~.acceptance.band_for`). The rule (:func:`choose`):

* the fastest configuration that ranks as measured (a public run on stock vLLM or upstream
  main, :attr:`~.evidence.Evidence.ranks_as_measured`) and the fastest one that does not are
  picked by point estimate (within 2 %: fewest changes to stock vLLM first);
* the other one is recommended only when its whole interval clears the measured one's (its
  low end above the measured one's high end); otherwise the measured one is recommended
  and the other, when its point estimate is higher by more than that 2 %, is printed as
  **worth measuring**, with the command that settles it on a box.

Everything that prints the answer (``plan``, ``plan --json``, README.md's section,
``docs/what-to-run.md``, ``docs/choosing-a-draft.md``, ``nox -s bench``) renders it through
:mod:`.answer_text`; ``tests/unit/test_costmodel_one_answer.py`` compares each with this
function. The serve commands are built here (:func:`serve_command`), so the box-side run
(``bench/e2e/runner.py recommendation``) serves exactly what the answer prints.
"""

from __future__ import annotations

import dataclasses
import json
from functools import lru_cache

from vllm_kimi_ext import envs
from vllm_kimi_ext.costmodel.acceptance import (
    Acceptance,
    AcceptanceBand,
    band_for,
    field_to_card_ratio,
    mean_field_to_card_ratio,
    point_for,
)
from vllm_kimi_ext.costmodel.catalog import (
    DEFAULT_HARDWARE,
    DraftProfile,
    list_profiles,
    load_draft,
)
from vllm_kimi_ext.costmodel.evidence import Evidence, evidence
from vllm_kimi_ext.costmodel.explain import caveats, explain
from vllm_kimi_ext.costmodel.interval import Calibrated, calibrated
from vllm_kimi_ext.costmodel.model import CostModel, Plan
from vllm_kimi_ext.costmodel.options import Option, Recommendation
from vllm_kimi_ext.costmodel.recommend import DEFAULT_TOLERANCE, MAX_K, pick, recommend

BATCH = 1
CONTEXT = 1024
TARGET = "Kimi-K2.5"
PCIE = DEFAULT_HARDWARE


@dataclasses.dataclass(frozen=True)
class Judged:
    """One configuration with its point estimate, band, evidence and interval."""

    option: Option  # estimated at the point acceptance
    band: AcceptanceBand
    point: Acceptance
    tps: dict[str, float]  # "point", "low", "card", "high"
    tau: dict[str, float]
    evidence: Evidence
    calib: Calibrated  # the model's calibrated out-of-sample interval

    @property
    def plan(self) -> Plan:
        return self.option.plan

    @property
    def draft(self) -> DraftProfile:
        return self.option.plan.draft

    @property
    def interval(self) -> tuple[float, float]:
        """The calibrated interval of tokens/s around the point estimate (:mod:`.interval`)."""
        return self.calib.around(self.tps["point"])

    @property
    def band_tps(self) -> tuple[float, float]:
        """tokens/s at the acceptance band's low and high ends (the model's point estimates;
        the acceptance spread, reported beside the interval, not folded into it)."""
        return (min(self.tps["low"], self.tps["high"]), max(self.tps["low"], self.tps["high"]))

    def clears(self, other: Judged) -> bool:
        """Whether this configuration's whole interval lies above ``other``'s."""
        return self.interval[0] > other.interval[1]


@dataclasses.dataclass(frozen=True)
class Answer:
    hardware: str
    batch: int
    context: int
    choice: Judged
    worth_measuring: Judged | None  # faster by point estimate, not cleared: measure it
    alternative: Judged | None  # the measured configuration a cleared choice beat
    per_draft: tuple[tuple[str, Judged, Judged | None], ...]  # (draft, its choice, its w.m.)
    no_spec_tps: float  # stock vLLM without speculation (NCCL), same batch and context
    calib: Calibrated
    rec: Recommendation = dataclasses.field(repr=False, compare=False, default=None)
    cm: CostModel = dataclasses.field(repr=False, compare=False, default=None)

    @property
    def plan(self) -> Plan:
        return self.choice.plan

    @property
    def draft(self) -> DraftProfile:
        return self.choice.draft

    def speedup(self, which: str = "point") -> float:
        return self.choice.tps[which] / self.no_spec_tps

    @property
    def no_spec_interval(self) -> tuple[float, float]:
        """The calibrated interval of stock vLLM without speculation."""
        return self.calib.around(self.no_spec_tps)

    @property
    def measure_next(self) -> Judged | None:
        """The configuration to run beside the choice on a real box: the one worth
        measuring, else the measured alternative a cleared choice beat."""
        return self.worth_measuring or self.alternative



def card_drafts() -> list[DraftProfile]:
    """Drafts trained for Kimi-K2.5 that publish a card acceptance figure (the headline
    competes among these; a draft trained for another Kimi version carries that version's
    card, which a shifted target does not reach)."""
    return [d for d in (load_draft(n) for n in list_profiles("drafts"))
            if d.acceptance and d.acceptance.get("values")
            and d.raw.get("trained_for", TARGET) == TARGET]


def judge(cm: CostModel, option: Option, band: AcceptanceBand, point: Acceptance,
          calib: Calibrated) -> Judged:
    p = option.plan
    tps, tau = {"point": option.tokens_per_s}, {"point": option.estimate.tau}
    for s, acc in band.scenarios().items():
        e = cm.estimate(p, acc)
        tps[s], tau[s] = e.tokens_per_s, e.tau
    return Judged(option, band, point, tps, tau, evidence(p), calib)


def choose(judged: list[Judged], tolerance: float = DEFAULT_TOLERANCE
           ) -> tuple[Judged, Judged | None, Judged | None]:
    """(choice, worth measuring, measured alternative) by the rule of the module docstring."""
    accs = {j.draft.name: j.point for j in judged}

    def best(js: list[Judged]) -> Judged | None:
        if not js:
            return None
        chosen = pick([j.option for j in js], tolerance, accs)
        return next(j for j in js if j.option is chosen)

    measured = best([j for j in judged if j.evidence.ranks_as_measured])
    other = best([j for j in judged if not j.evidence.ranks_as_measured])
    if measured is None:
        return other, None, None
    if other is None or other.tps["point"] <= measured.tps["point"] * (1 + tolerance):
        return measured, None, None  # not faster by more than the pick tolerance
    if other.clears(measured):
        return other, None, measured
    return measured, other, None


def answer(cm: CostModel, drafts: list[DraftProfile], batch: int = BATCH,
           context: int = CONTEXT, *, acceptance: dict[str, Acceptance] | None = None,
           dataset: str | None = None, backends: list[str] | None = None, k_max: int = MAX_K,
           stock_only: bool = False, calib: Calibrated | None = None) -> Answer:
    """What to run among ``drafts``. ``acceptance`` (draft name -> a measured or given
    acceptance) replaces a draft's point estimate and its band. ``calib`` defaults to the
    interval calibrated on the PCIe profile's held-out runs (also for another hardware
    profile or other parameters: the only box class with held-out public runs). Raises
    ValueError when nothing fits or no draft has an acceptance figure."""
    everything = [load_draft(n) for n in list_profiles("drafts")]
    low_ratio, mean_ratio = field_to_card_ratio(everything), mean_field_to_card_ratio(everything)
    calib = calibrated(PCIE) if calib is None else calib
    per_draft, judged, pairs = [], [], []
    for d in drafts:
        given = (acceptance or {}).get(d.name)
        if given is not None:
            point, band = given, AcceptanceBand(given, given, given)
        else:
            point, band = point_for(d, dataset, mean_ratio), band_for(d, dataset, low_ratio)
        if point is None or band is None:
            continue
        pairs.append((d, point))
        rec = recommend(cm, [(d, point)], batch=batch, context=context, backends=backends,
                        k_max=k_max, stock_only=stock_only)
        mine = [judge(cm, o, band, point, calib) for o in _candidates(rec)]
        c, w, _ = choose(mine)
        per_draft.append((d.name, c, w))
        judged += mine
    if not judged:
        raise ValueError("no selected draft has an acceptance figure; pass --tau, "
                         "--acceptance or --acceptance-from")
    choice, worth, alt = choose(judged)
    rec = recommend(cm, pairs, batch=batch, context=context, backends=backends, k_max=k_max,
                    stock_only=stock_only)
    no_spec = cm.no_spec(batch=batch, context=context, backend="nccl").tokens_per_s
    return Answer(cm.hw.name, batch, context, choice, worth, alt, tuple(per_draft), no_spec,
                  calib, with_choice(cm, rec, choice, pairs), cm)


def _candidates(rec: Recommendation) -> list[Option]:
    """The options worth judging: per evidence level, those within the pick tolerance of
    that level's fastest (judging every option in every scenario is wasted work)."""
    spec = [o for o in rec.options if o.plan.speculative]
    out = []
    for measured in (True, False):
        group = [o for o in spec if evidence(o.plan).ranks_as_measured == measured]
        if group:
            top = max(o.tokens_per_s for o in group)
            out += [o for o in group if o.tokens_per_s >= top * (1 - DEFAULT_TOLERANCE)]
    return out


def with_choice(cm: CostModel, rec: Recommendation, choice: Judged,
                drafts: list[tuple[DraftProfile, Acceptance]]) -> Recommendation:
    """``rec`` with ``choice`` as its recommendation (and as its stock pick when it runs on
    stock vLLM), explained one dimension at a time."""
    best = next(o for o in rec.options if o.plan == choice.plan)
    rec = dataclasses.replace(rec, best=best,
                              best_stock=best if best.stock else rec.best_stock)
    return dataclasses.replace(rec, explanation=tuple(explain(cm, rec, drafts)),
                               caveats=tuple(caveats(cm, rec, drafts)))


@lru_cache(maxsize=4)
def _headline_cached(hardware: str, batch: int, context: int) -> Answer:
    return answer(CostModel.build(hardware), card_drafts(), batch, context)


def headline(cm: CostModel | None = None, batch: int = BATCH, context: int = CONTEXT) -> Answer:
    """The recommended configuration for the drafts trained for Kimi-K2.5 (see the module
    docstring)."""
    if cm is None:
        return _headline_cached(PCIE, batch, context)
    return answer(cm, card_drafts(), batch, context)


def recommendation(h: Answer | None = None) -> Recommendation:
    """The answer's choice as a :class:`~.options.Recommendation` (every option of the
    drafts at their point acceptance, the choice as ``best``, explained one dimension at a
    time). The bench report prints this, so it can never recommend anything but the
    answer."""
    return (h or headline()).rec


#: The target's attention backend in every public calibration run of this class of box
#: (the model's context cost is fitted to it).
TARGET_ATTENTION = "TRITON_MLA"


def draft_attention_backend(d: DraftProfile) -> str | None:
    """The attention backend the draft needs pinned (``--speculative-config``'s
    ``attention_backend``, a field of vLLM 0.34.0's ``SpeculativeConfig`` that overrides the
    draft's ``attention_config.backend`` only), or None to let vLLM choose."""
    spec = d.raw.get("draft_attention_backend")
    return spec.get("value") if isinstance(spec, dict) else None


def rope_factor(d: DraftProfile) -> dict | None:
    """The draft's ``rope_factor`` entry (a YaRN draft whose RoPE attention factor is not
    established: vLLM 0.34.0 reads one value from its config, other stacks another), or
    None."""
    spec = d.raw.get("rope_factor")
    return spec if isinstance(spec, dict) else None


def factor_text(x: float) -> str:
    """A RoPE attention factor as the docs print it (1.0, 1.4159)."""
    return f"{x:.1f}" if x == round(x, 1) else f"{x:g}"


def local_dirs(d: DraftProfile, factor: float) -> tuple[str, str]:
    """(downloaded checkpoint, config copy with RoPE attention factor ``factor``)
    directories the documented commands use."""
    base = d.checkpoint.rsplit("/", 1)[-1]
    return f"/models/{base}", f"/models/{base}-rope-{factor_text(factor)}"


def rope_ab_commands(plan: Plan, requires=()) -> list[str]:
    """The other arm of a draft whose RoPE factor is unknown: a config copy at the factor
    vLLM 0.34.0 does not read from the config, and its serve command (empty when the
    draft's factor is established)."""
    spec = rope_factor(plan.draft) if plan.speculative else None
    if spec is None:
        return []
    f = spec["other_factor"]
    src, out = local_dirs(plan.draft, f)
    return [f"huggingface-cli download {plan.draft.checkpoint} --local-dir {src}",
            f"vllm-kimi-ext draft rope-config --draft {src} --out {out} "
            f"--attention-factor {factor_text(f)}",
            serve_command(plan, requires, model=out)]


#: ``vllm serve`` arguments of every command printed (the calibration runs' settings).
SERVE_ARGS = ("--trust-remote-code", "--tensor-parallel-size", "8", "--kv-cache-dtype", "fp8",
              "--attention-backend", TARGET_ATTENTION)


def speculative_config(plan: Plan, model: str | None = None) -> dict:
    """``--speculative-config`` of ``plan`` (the serve commands and the box-side run);
    ``model`` replaces the draft's checkpoint (a local copy)."""
    d = plan.draft
    cfg = {"method": d.method, "model": model or d.checkpoint,
           "num_speculative_tokens": plan.k}
    if draft_attention_backend(d):
        cfg["attention_backend"] = draft_attention_backend(d)
    if plan.placement == "tp1":
        cfg["draft_tensor_parallel_size"] = 1
    return cfg


def serve_env(plan: Plan, requires=()) -> dict[str, str]:
    """Environment variables the serve command sets: ``VLLM_KIMI_EXT=1`` when ``requires``
    (the plan's :class:`~.recommend.Requirement` list) needs anything from this project."""
    env = {envs.ENABLE.name: "1"} if requires else {}
    if plan.placement == "tp8-repemb":
        env[envs.REPLICATE_DRAFT_EMBEDDING.name] = "1"
    if plan.verifier == "sharded":
        env[envs.SHARDED_VERIFY.name] = "1"
    return env


def serve_command(plan: Plan, requires=(), model: str | None = None) -> str:
    """A complete ``vllm serve`` line for ``plan`` (``model``: see
    :func:`speculative_config`)."""
    env = "".join(f"{k}={v} " for k, v in serve_env(plan, requires).items())
    a = SERVE_ARGS
    return (f"{env}vllm serve moonshotai/Kimi-K2.5 {a[0]} {' '.join(a[1:3])} \\\n"
            f"  {' '.join(a[3:])} \\\n"
            f"  --speculative-config '{json.dumps(speculative_config(plan, model))}'")


def commands(j: Judged) -> str:
    """The bash block that serves ``j``; for a draft whose RoPE factor is unknown, both
    arms of the A/B that settles it."""
    serve = serve_command(j.plan, j.option.requires)
    other = rope_ab_commands(j.plan, j.option.requires)
    if not other:
        return serve
    spec = rope_factor(j.draft)
    return "\n".join([
        f"# RoPE attention factor {factor_text(spec['config_factor'])}: what vLLM 0.34.0 reads "
        "from "
        "the published config",
        serve,
        f"# RoPE attention factor {factor_text(spec['other_factor'])} (plain YaRN): a local "
        "copy of the "
        "config; serve it instead, same prompts",
        *other])


