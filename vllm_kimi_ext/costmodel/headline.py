"""The answer to "what should I run on 8x RTX PRO 6000": one function, every reader.

:func:`answer` is the only function that answers it, for any set of drafts; :func:`headline`
is its answer for the drafts trained for Kimi-K2.5 at batch 1, context 1024. Per draft it
ranks the configurations buildable from stock vLLM 0.34.0 plus this project at the draft's
**point acceptance** (:func:`~.acceptance.point_for`: the public field figure where one
exists, else the card shrunk by the mean field/card ratio). Each configuration carries its
**evidence level** (:mod:`.evidence`) and an **interval**: its tokens/s at the low and high
ends of the acceptance band (:func:`~.acceptance.band_for`), widened by the model's own
out-of-sample error (:func:`out_of_sample_error`, the mean error of ``plan --validate``'s
held-out runs with no fitted cell). The rule (:func:`choose`):

* the fastest measured configuration and the fastest configuration that is not measured are
  picked by point estimate (within 2 %: fewest changes to stock vLLM first);
* the unmeasured one is recommended only when its whole interval clears the measured one's
  (its low end above the measured one's high end); otherwise the measured one is recommended
  and the other, when its point estimate is higher by more than that 2 %, is printed as
  **worth measuring**, with the command that settles it on a box.

:func:`headline_markdown` renders it; README.md's section "What to run on 8x PCIe"
(:func:`readme_section`), ``docs/what-to-run.md``, ``docs/choosing-a-draft.md``,
``vllm-kimi-ext plan`` (its first line, :func:`answer_line`) and ``nox -s bench`` all print
it, and ``tests/unit/test_costmodel_one_answer.py`` compares each with this function.
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
from vllm_kimi_ext.costmodel.evidence import Evidence, evidence, run_text
from vllm_kimi_ext.costmodel.explain import caveats, explain
from vllm_kimi_ext.costmodel.model import CostModel, Plan
from vllm_kimi_ext.costmodel.options import Option, Recommendation
from vllm_kimi_ext.costmodel.recommend import DEFAULT_TOLERANCE, MAX_K, pick, recommend
from vllm_kimi_ext.patch_ids import ref

README_HEADING = "## What to run on 8× PCIe"
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
    error: float  # the model's out-of-sample error (fraction)

    @property
    def plan(self) -> Plan:
        return self.option.plan

    @property
    def draft(self) -> DraftProfile:
        return self.option.plan.draft

    @property
    def interval(self) -> tuple[float, float]:
        """tokens/s at the band's low end x (1 - error) .. its high end x (1 + error)."""
        return (self.tps["low"] * (1 - self.error), self.tps["high"] * (1 + self.error))

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
    error: float
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


@lru_cache(maxsize=8)
def out_of_sample_error(hardware: str = PCIE) -> float:
    """Mean |error| of ``plan --validate``'s held-out points from runs with no fitted cell
    (the model's own out-of-sample error on this box class)."""
    from vllm_kimi_ext.costmodel.calibration import HELD_OUT, mean_abs, validate

    return mean_abs(validate(CostModel.build(hardware)).held_out(HELD_OUT[1]))


def judge(cm: CostModel, option: Option, band: AcceptanceBand, point: Acceptance,
          error: float) -> Judged:
    p = option.plan
    tps, tau = {"point": option.tokens_per_s}, {"point": option.estimate.tau}
    for s, acc in band.scenarios().items():
        e = cm.estimate(p, acc)
        tps[s], tau[s] = e.tokens_per_s, e.tau
    return Judged(option, band, point, tps, tau, evidence(p), error)


def choose(judged: list[Judged], tolerance: float = DEFAULT_TOLERANCE
           ) -> tuple[Judged, Judged | None, Judged | None]:
    """(choice, worth measuring, measured alternative) by the rule of the module docstring."""
    accs = {j.draft.name: j.point for j in judged}

    def best(js: list[Judged]) -> Judged | None:
        if not js:
            return None
        chosen = pick([j.option for j in js], tolerance, accs)
        return next(j for j in js if j.option is chosen)

    measured = best([j for j in judged if j.evidence.measured])
    other = best([j for j in judged if not j.evidence.measured])
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
           stock_only: bool = False, error: float | None = None) -> Answer:
    """What to run among ``drafts``. ``acceptance`` (draft name -> a measured or given
    acceptance) replaces a draft's point estimate and its band. ``error`` defaults to the
    out-of-sample error of the calibrated PCIe profile (also for another hardware profile or
    other parameters: the only box class with held-out public runs). Raises ValueError when
    nothing fits or no draft has an acceptance figure."""
    everything = [load_draft(n) for n in list_profiles("drafts")]
    low_ratio, mean_ratio = field_to_card_ratio(everything), mean_field_to_card_ratio(everything)
    error = out_of_sample_error(PCIE) if error is None else error
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
        mine = [judge(cm, o, band, point, error) for o in _candidates(rec)]
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
                  error, with_choice(cm, rec, choice, pairs), cm)


def _candidates(rec: Recommendation) -> list[Option]:
    """The options worth judging: per evidence level, those within the pick tolerance of
    that level's fastest (judging every option in every scenario is wasted work)."""
    spec = [o for o in rec.options if o.plan.speculative]
    out = []
    for measured in (True, False):
        group = [o for o in spec if evidence(o.plan).measured == measured]
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


def rope_copy(d: DraftProfile) -> dict | None:
    """The draft's ``rope_copy`` entry (a YaRN draft whose trained RoPE attention factor
    vLLM 0.34.0 does not reproduce from its config), or None."""
    spec = d.raw.get("rope_copy")
    return spec if isinstance(spec, dict) else None


def local_dirs(d: DraftProfile) -> tuple[str, str]:
    """(downloaded checkpoint, config copy) directories the documented commands use."""
    base = d.checkpoint.rsplit("/", 1)[-1]
    return f"/models/{base}", f"/models/{base}-trained-rope"


def setup_commands(plan: Plan) -> list[str]:
    """Commands to run before :func:`serve_command` (a draft config copy with the RoPE
    attention factor the draft was trained with)."""
    if not plan.speculative or rope_copy(plan.draft) is None:
        return []
    src, out = local_dirs(plan.draft)
    return [f"huggingface-cli download {plan.draft.checkpoint} --local-dir {src}",
            f"vllm-kimi-ext draft rope-config --draft {src} --out {out}"]


#: ``vllm serve`` arguments of every command printed (the calibration runs' settings).
SERVE_ARGS = ("--trust-remote-code", "--tensor-parallel-size", "8", "--kv-cache-dtype", "fp8",
              "--attention-backend", TARGET_ATTENTION)


def speculative_config(plan: Plan) -> dict:
    """``--speculative-config`` of ``plan`` (the serve commands and the box-side run)."""
    d = plan.draft
    cfg = {"method": d.method,
           "model": local_dirs(d)[1] if rope_copy(d) is not None else d.checkpoint,
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


def serve_command(plan: Plan, requires=()) -> str:
    """A complete ``vllm serve`` line for ``plan``."""
    env = "".join(f"{k}={v} " for k, v in serve_env(plan, requires).items())
    a = SERVE_ARGS
    return (f"{env}vllm serve moonshotai/Kimi-K2.5 {a[0]} {' '.join(a[1:3])} \\\n"
            f"  {' '.join(a[3:])} \\\n"
            f"  --speculative-config '{json.dumps(speculative_config(plan))}'")


def commands(j: Judged) -> str:
    """The bash block that serves ``j`` (setup lines first)."""
    return "\n".join([*setup_commands(j.plan), serve_command(j.plan, j.option.requires)])


def public_short(plan: Plan) -> str:
    """A table cell: the evidence level of the exact configuration, with its sources."""
    return evidence(plan).short()


def public_status(plan: Plan) -> str:
    """The evidence behind this configuration with its sources; when it is modelled only,
    the nearest public run of the draft's kind."""
    ev = evidence(plan)
    out = ev.text()
    runs = plan.draft.raw.get("public_runs", []) if plan.speculative else []
    if not ev.runs and runs:
        out += f". Nearest public run: {run_text(runs[0])}"
    return out + "."


def short(plan: Plan) -> str:
    """``draft k=K placement/vocab, verifier, backend`` for one line."""
    if not plan.speculative:
        return f"no speculation ({plan.backend})"
    return (f"`{plan.draft.name}` k = {plan.k} ({plan.placement}/{plan.vocab}, "
            f"{plan.verifier}, {plan.backend})")


def _describe_choice(h: Answer) -> str:
    p = h.plan
    place = {"tp8": "sharded over the 8 GPUs like the target (stock)",
             "tp8-repemb": "sharded, with its own replicated embedding "
                           f"({ref('replicate-draft-embedding')})",
             "tp1": "whole on every GPU (draft TP=1)"}[p.placement]
    verifier = ("stock full-logits all-gather" if p.verifier == "gather"
                else "vocabulary-sharded (experimental)")
    return (f"- **Draft** `{h.draft.checkpoint}` (`{h.draft.name}`), **k = {p.k}** "
            f"(`num_speculative_tokens`), {place}, {p.vocab} vocabulary; **verifier**: "
            f"{verifier}; **all-reduce**: NCCL ({'stock' if p.backend == 'nccl' else p.backend}).")


def interval_text(j: Judged) -> str:
    lo, hi = j.interval
    return f"{lo:.0f}-{hi:.0f} tok/s"


def expected_line(h: Answer) -> str:
    c = h.choice
    return (f"- Expected **{c.tps['point']:.0f} tok/s** single stream (context {h.context}) at "
            f"its point acceptance (tau {c.tau['point']:.2f}: {_point_words(c)}); interval "
            f"**{interval_text(c)}** (acceptance band tau {c.tau['low']:.2f}-"
            f"{c.tau['high']:.2f}, widened by the model's out-of-sample error "
            f"±{h.error:.1%}: the mean error of `vllm-kimi-ext plan --validate` on runs with "
            f"no fitted cell), vs **{h.no_spec_tps:.0f} tok/s** for stock vLLM without "
            f"speculation: **{h.speedup():.2f}x**.")


def _point_words(j: Judged) -> str:
    src = j.point.source
    if src.startswith("field:"):
        return "its public field figure"
    if "ratio" in src:
        return "its card shrunk by the mean field/card ratio of Kimi drafts"
    return "its card figure"


def rope_note(j: Judged) -> str:
    """How the commands serve a draft whose trained RoPE factor 0.34.0 does not reproduce."""
    spec = rope_copy(j.draft) if j.plan.speculative else None
    if spec is None:
        return ""
    return (f" Served as trained: the commands write a copy of the draft whose config carries "
            f"RoPE attention factor {spec['attention_factor']:g} (`vllm-kimi-ext draft "
            "rope-config`; vLLM 0.34.0 would run the stock config at 1.0, and `vllm-kimi-ext "
            "doctor` reports it as W-ROPE-YARN-FACTOR); the acceptance difference between the "
            "two is unmeasured until a box runs both (choosing-a-draft.md, \"DFlash RoPE "
            "scaling\": `bench/e2e/runner.py recommendation` once as is and once with "
            f"`--draft-dir {j.draft.name}={local_dirs(j.draft)[0]}`).")


def worth_measuring_lines(h: Answer) -> list[str]:
    w = h.worth_measuring
    if w is None:
        return []
    return [f"- **Worth measuring**: {short(w.plan)}, {w.tps['point']:.0f} tok/s at its point "
            f"acceptance (interval {interval_text(w)}; {w.evidence.short()}): faster "
            f"by point estimate, but its interval does not clear the recommendation's "
            f"({interval_text(h.choice)}), so it stays a forecast until a box measures it. "
            "Settle both on your box, back to back with the same prompts: "
            f"`{e2e_command(h)}`.{rope_note(w)} Its commands:", "",
            "  ```bash", *(f"  {ln}" for ln in commands(w).splitlines()), "  ```"]


def e2e_command(h: Answer) -> str:
    """The box-side run of the choice and the configuration to measure beside it."""
    return ("python bench/e2e/runner.py recommendation --python /path/to/venv "
            "--out bench/out/e2e/what-to-run")


def headline_markdown(h: Answer | None = None) -> str:
    """The answer as markdown bullets plus the commands that serve it (README, docs,
    bench)."""
    h = h or headline()
    c = h.choice
    needs = [str(r) for r in c.option.requires]
    lines = [
        _describe_choice(h),
        expected_line(h),
        "- Evidence: " + public_status(c.plan),
        "- Ranked by evidence: a configuration that is only modelled is recommended over a "
        "measured one only when its whole interval clears the measured one's."
        + (f" It does here: the measured alternative is {short(h.alternative.plan)} "
           f"({interval_text(h.alternative)})." if h.alternative is not None else ""),
        *worth_measuring_lines(h),
        "- Needs: " + ("nothing beyond stock vLLM 0.34.0." if not needs else "; ".join(needs)
                       + ".") + (f" Loading: {h.draft.stock_note}." if h.draft.stock_note
                                 and draft_attention_backend(h.draft) else "") + rope_note(c),
        "",
        "```bash",
        commands(c),
        "```",
    ]
    return "\n".join(lines)


def answer_dict(h: Answer) -> dict:
    """The answer for ``plan --json``: choice and worth measuring, each with its evidence,
    point estimate and interval."""
    def one(j: Judged | None) -> dict | None:
        if j is None:
            return None
        p = j.plan
        return {"draft": j.draft.name, "checkpoint": j.draft.checkpoint, "k": p.k,
                "placement": p.placement, "vocab": p.vocab, "verifier": p.verifier,
                "backend": p.backend, "evidence": j.evidence.level,
                "evidence_runs": [r.get("source") for r in j.evidence.runs],
                "tokens_per_s": dict(j.tps), "tau": dict(j.tau),
                "interval_tokens_per_s": list(j.interval), "point_acceptance": j.point.source,
                "serve_command": serve_command(p, j.option.requires)}
    return {"choice": one(h.choice), "worth_measuring": one(h.worth_measuring),
            "measured_alternative": one(h.alternative), "out_of_sample_error": h.error,
            "no_speculation_tokens_per_s": h.no_spec_tps}


def answer_line(h: Answer) -> str:
    """One line: the choice, its number, interval and evidence (``plan``'s first line)."""
    c = h.choice
    return (f"Answer: {short(c.plan)} -> {c.tps['point']:.0f} tok/s "
            f"(interval {interval_text(c)}), {c.evidence.short()}"
            + (f"; worth measuring: {short(h.worth_measuring.plan)} "
               f"{h.worth_measuring.tps['point']:.0f} tok/s "
               f"({interval_text(h.worth_measuring)})" if h.worth_measuring else ""))


def readme_section(h: Answer | None = None) -> str:
    """README.md's "What to run on 8x PCIe" section, generated."""
    body = headline_markdown(h)
    return "\n".join([
        README_HEADING,
        "",
        "> **A forecast ranked by evidence, not a measurement of your box.** Generated by "
        "`vllm_kimi_ext.costmodel.headline` (test-enforced): the decode cost model fitted to "
        "public Kimi-K2.x runs on 8x RTX PRO 6000 (held-out validation and every source in "
        "[docs/cost-model.md](docs/cost-model.md)), ranking only what stock vLLM 0.34.0 plus "
        "this project can build. Measure your box with "
        "`python bench/e2e/runner.py recommendation`, then "
        "`vllm-kimi-ext plan --draft NAME --acceptance-from results.json`.",
        "",
        body,
        "",
        "Every draft, its evidence, the sensitivity of this answer and the what-if table "
        "(settings you can apply, and upper bounds): [docs/what-to-run.md](docs/what-to-run.md).",
        "",
        "",
    ])


def current_readme_section(readme: str) -> str | None:
    """The section as it stands in ``readme`` (None when absent)."""
    if README_HEADING not in readme:
        return None
    rest = readme.split(README_HEADING, 1)[1]
    nxt = rest.find("\n## ")
    return README_HEADING + (rest if nxt < 0 else rest[: nxt + 1])


def updated_readme(readme: str, h: Answer | None = None) -> str:
    cur = current_readme_section(readme)
    if cur is None:
        raise ValueError(f"README.md has no {README_HEADING!r} section")
    return readme.replace(cur, readme_section(h), 1)
