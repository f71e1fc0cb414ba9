"""The answer to "what should I run on 8x RTX PRO 6000": one function, every reader.

:func:`headline` is the only function that answers it. It evaluates every draft that
publishes an acceptance figure across its acceptance band (:func:`~.acceptance.band_for`)
and keeps, per draft, the configuration with the smallest worst-case shortfall over the
low / card / high scenarios
(:func:`~.recommend.recommend_across_band`); the headline draft is the one whose choice is
fastest in the **low** scenario, because public runs of Kimi drafts accept less than their
cards. Only configurations buildable from stock vLLM 0.34.0 plus this project compete, and
only drafts trained for Kimi-K2.5 (:func:`card_drafts`).

:func:`headline_markdown` renders it (with a complete serve command and whether that exact
configuration has run anywhere public, :func:`public_status`); README.md's section "What to
run on 8x PCIe" (:func:`readme_section`), ``docs/what-to-run.md`` and ``nox -s bench`` and its
report (:func:`recommendation`: the same choice with its one-dimension-at-a-time
explanation) all print it, and tests compare each with this function.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

from vllm_kimi_ext.costmodel.acceptance import band_for, field_to_card_ratio
from vllm_kimi_ext.costmodel.catalog import DraftProfile, list_profiles, load_draft
from vllm_kimi_ext.costmodel.explain import caveats, explain
from vllm_kimi_ext.costmodel.model import CostModel, Plan
from vllm_kimi_ext.costmodel.options import Recommendation
from vllm_kimi_ext.costmodel.recommend import (
    DEFAULT_TOLERANCE,
    BandRecommendation,
    recommend_across_band,
)
from vllm_kimi_ext.patch_ids import ref

README_HEADING = "## What to run on 8× PCIe"
BATCH = 1
CONTEXT = 1024
SCENARIO_WORDS = {"low": "low", "card": "card", "high": "high"}


@dataclasses.dataclass(frozen=True)
class Headline:
    hardware: str
    batch: int
    context: int
    choice: BandRecommendation  # the headline draft's robust configuration
    candidates: tuple[BandRecommendation, ...]  # every draft with a card figure, best first
    no_spec_tps: float  # stock vLLM without speculation (NCCL), same batch and context
    field_ratio: float | None
    cm: CostModel = dataclasses.field(repr=False, compare=False, default=None)

    @property
    def plan(self) -> Plan:
        return self.choice.robust.plan

    @property
    def draft(self) -> DraftProfile:
        return self.choice.draft

    def speedup(self, scenario: str) -> float:
        return self.choice.robust_tps[scenario] / self.no_spec_tps


TARGET = "Kimi-K2.5"


def card_drafts() -> list[DraftProfile]:
    """Drafts trained for Kimi-K2.5 that publish a card acceptance figure (the headline
    competes among these; a draft trained for another Kimi version carries that version's
    card, which a shifted target does not reach)."""
    return [d for d in (load_draft(n) for n in list_profiles("drafts"))
            if d.acceptance and d.acceptance.get("values")
            and d.raw.get("trained_for", TARGET) == TARGET]


@lru_cache(maxsize=4)
def _headline_cached(hardware: str, batch: int, context: int) -> Headline:
    return _compute(CostModel.build(hardware), batch, context)


def headline(cm: CostModel | None = None, batch: int = BATCH, context: int = CONTEXT) -> Headline:
    """The recommended configuration with its acceptance band (see the module docstring)."""
    if cm is None:
        return _headline_cached("rtx-pro-6000-pcie-x8", batch, context)
    return _compute(cm, batch, context)


def _compute(cm: CostModel, batch: int, context: int) -> Headline:
    everything = [load_draft(n) for n in list_profiles("drafts")]
    ratio = field_to_card_ratio(everything)
    cands = []
    for d in card_drafts():
        band = band_for(d, ratio=ratio)
        cands.append(recommend_across_band(cm, d, band, batch=batch, context=context))
    cands.sort(key=lambda c: -c.robust_tps["low"])
    top = cands[0].robust_tps["low"]
    close = [c for c in cands if c.robust_tps["low"] >= top * (1 - DEFAULT_TOLERANCE)]
    choice = min(close, key=lambda c: (len(c.robust.requires), -c.robust_tps["card"]))
    no_spec = cm.no_spec(batch=batch, context=context, backend="nccl").tokens_per_s
    return Headline(cm.hw.name, batch, context, choice, tuple(cands), no_spec, ratio, cm)


def recommendation(h: Headline | None = None) -> Recommendation:
    """The headline's choice as a :class:`~.options.Recommendation` at the draft's card
    acceptance: every option of that draft for the tables, the choice as ``best``, and the
    explanation of that choice (one dimension changed at a time). The bench report prints
    this, so it can never recommend anything but the headline."""
    h = h or headline()
    rec = h.choice.per_scenario["card"]
    rec = dataclasses.replace(rec, best=h.choice.robust)
    drafts = [(h.draft, h.choice.band.card)]
    return dataclasses.replace(rec, explanation=tuple(explain(h.cm, rec, drafts)),
                               caveats=tuple(caveats(h.cm, rec, drafts)))


#: The target's attention backend in every public calibration run of this class of box
#: (the model's context cost is fitted to it).
TARGET_ATTENTION = "TRITON_MLA"


def draft_attention_backend(d: DraftProfile) -> str | None:
    """The attention backend the draft needs pinned (``--speculative-config``'s
    ``attention_backend``, a field of vLLM 0.34.0's ``SpeculativeConfig`` that overrides the
    draft's ``attention_config.backend`` only), or None to let vLLM choose."""
    spec = d.raw.get("draft_attention_backend")
    return spec.get("value") if isinstance(spec, dict) else None


def serve_command(plan: Plan, requires=()) -> str:
    """A complete ``vllm serve`` line for ``plan``; ``requires`` (its
    :class:`~.recommend.Requirement` list) adds ``VLLM_KIMI_EXT=1`` when the plan needs
    anything from this project."""
    d = plan.draft
    cfg = [f'"method": "{d.method}"', f'"model": "{d.checkpoint}"',
           f'"num_speculative_tokens": {plan.k}']
    if draft_attention_backend(d):
        cfg.append(f'"attention_backend": "{draft_attention_backend(d)}"')
    if plan.placement == "tp1":
        cfg.append('"draft_tensor_parallel_size": 1')
    env = ""
    if plan.placement == "tp8-repemb":
        env += "VLLM_KIMI_EXT_REPLICATE_DRAFT_EMBEDDING=1 "
    if plan.verifier == "sharded":
        env += "VLLM_KIMI_EXT_SHARDED_VERIFY=1 "
    if requires:
        env = "VLLM_KIMI_EXT=1 " + env
    return (f"{env}vllm serve moonshotai/Kimi-K2.5 --trust-remote-code "
            "--tensor-parallel-size 8 \\\n"
            f"  --kv-cache-dtype fp8 --attention-backend {TARGET_ATTENTION} \\\n"
            f"  --speculative-config '{{{', '.join(cfg)}}}'")


def _src(src: dict) -> str:
    return f"{src.get('repo', '?')} {src.get('file', '?')} @ {str(src.get('commit', '?'))[:10]}"


def public_short(plan: Plan) -> str:
    """A table cell: whether the exact configuration ran in public (with the file)."""
    text = public_status(plan)
    if text.startswith("**only in the model**"):
        return "only in the model"
    return "ran in public (" + text.rsplit("(", 1)[1]


def public_status(plan: Plan) -> str:
    """Whether this exact configuration (draft checkpoint, Kimi-K2.5 target, stock vLLM,
    draft length) has run anywhere public, with the source; else that it exists only in
    the model, and the nearest public run."""
    d = plan.draft
    runs = d.raw.get("public_runs", [])
    exact = [r for r in runs if r.get("checkpoint") == d.checkpoint
             and r.get("target") == TARGET and r.get("stock_vllm") and r.get("k") == plan.k]
    if exact:
        r = exact[0]
        return (f"this exact configuration has run in public: {r['result']} "
                f"({_src(r['source'])}).")
    out = (f"**only in the model**: no public run of `{d.checkpoint}` at k = {plan.k} on stock "
           f"vLLM with a {TARGET} (MLA) target is known.")
    if runs:
        r = runs[0]
        out += (f" Nearest public run: `{r['checkpoint']}` k = {r['k']} on {r['target']}, "
                f"{r['engine']} ({r['settings']}): {r['result']} ({_src(r['source'])}).")
    return out


def _describe_choice(h: Headline) -> str:
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


def headline_markdown(h: Headline | None = None) -> str:
    """The headline as markdown bullets plus the serve command (README, docs, bench)."""
    h = h or headline()
    c = h.choice
    t, tau = c.robust_tps, c.robust_tau
    needs = [str(r) for r in c.robust.requires]
    lines = [
        _describe_choice(h),
        f"- Expected **{t['card']:.0f} tok/s** single stream (context {h.context}) at the "
        f"draft's card acceptance (tau {tau['card']:.2f}); **{t['low']:.0f}-{t['high']:.0f} "
        f"tok/s** across its acceptance band (tau {tau['low']:.2f}-{tau['high']:.2f}; low = "
        f"{_low_words(c)}), vs **{h.no_spec_tps:.0f} tok/s** for stock vLLM without "
        f"speculation: **{h.speedup('low'):.2f}-{h.speedup('high'):.2f}x**.",
        "- The same choice is "
        + ("within 2 % of the best in every scenario of the band."
           if c.holds_across_band() else
           f"at most {c.worst_shortfall:.0%} behind each scenario's own best (the robust "
           "pick: no other configuration loses less in its worst scenario)."),
        "- Needs: " + ("nothing beyond stock vLLM 0.34.0." if not needs else "; ".join(needs)
                       + ".") + (f" Loading: {h.draft.stock_note}." if h.draft.stock_note
                                 and draft_attention_backend(h.draft) else ""),
        "- Public runs: " + public_status(h.plan),
        "",
        "```bash",
        serve_command(h.plan, c.robust.requires),
        "```",
    ]
    return "\n".join(lines)


def _low_words(c: BandRecommendation) -> str:
    src = c.band.low.source
    if src.startswith("field:"):
        return "its public field figure"
    if "ratio" in src:
        return "the card shrunk as much as the public field figures of Kimi drafts shrank"
    return "its card figure"


def readme_section(h: Headline | None = None) -> str:
    """README.md's "What to run on 8x PCIe" section, generated."""
    body = headline_markdown(h)
    return "\n".join([
        README_HEADING,
        "",
        "> **A model, not a measurement of your box.** Generated by "
        "`vllm_kimi_ext.costmodel.headline` (test-enforced): the decode cost model fitted to "
        "public Kimi-K2.x runs on 8x RTX PRO 6000 (held-out validation and every source in "
        "[docs/cost-model.md](docs/cost-model.md)), ranking only what stock vLLM 0.34.0 plus "
        "this project can build. Measure your box with `nox -s bench` and "
        "`bench/e2e/runner.py`, then "
        "`vllm-kimi-ext plan --draft NAME --acceptance-from results.json`.",
        "",
        body,
        "",
        "Every draft, the band, the sensitivity of this answer and the what-if table (settings "
        "you can apply, and upper bounds): [docs/what-to-run.md](docs/what-to-run.md).",
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


def updated_readme(readme: str, h: Headline | None = None) -> str:
    cur = current_readme_section(readme)
    if cur is None:
        raise ValueError(f"README.md has no {README_HEADING!r} section")
    return readme.replace(cur, readme_section(h), 1)
