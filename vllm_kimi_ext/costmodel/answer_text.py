"""Every rendering of the answer (:func:`~.headline.answer`): the one module that prints it.

``vllm-kimi-ext plan`` (:func:`answer_line`, :func:`format_answer`), ``plan --json``
(:func:`answer_dict`), README.md's section (:func:`readme_section`), ``docs/what-to-run.md``
(:func:`headline_markdown`, :func:`drafts_section`, :func:`sensitivity_rows`),
``docs/choosing-a-draft.md`` (:func:`choosing_answer_markdown`) and ``nox -s bench`` all
take their words and numbers from here, so the evidence level, the calibrated interval with
its coverage and the acceptance band's spread read the same everywhere.

Ranges are printed low..high with the point estimate inside.
"""

from __future__ import annotations

from vllm_kimi_ext.costmodel.catalog import list_profiles, load_draft
from vllm_kimi_ext.costmodel.evidence import evidence, public_runs, run_text
from vllm_kimi_ext.costmodel.headline import (
    TARGET,
    Answer,
    Judged,
    answer,
    commands,
    draft_attention_backend,
    factor_text,
    headline,
    rope_factor,
    serve_command,
)
from vllm_kimi_ext.costmodel.markdown import md_table
from vllm_kimi_ext.costmodel.model import CostModel, Plan
from vllm_kimi_ext.patch_ids import ref

README_HEADING = "## What to run on 8× PCIe"


def span(lo: float, hi: float, fmt: str = ".0f", unit: str = "") -> str:
    """``lo..hi`` (ordered)."""
    lo, hi = min(lo, hi), max(lo, hi)
    return f"{lo:{fmt}}..{hi:{fmt}}{unit}"


def interval_text(j: Judged) -> str:
    """The calibrated interval of ``j`` (around its point estimate)."""
    return span(*j.interval, unit=" tok/s")


def band_text(j: Judged) -> str:
    """The acceptance band's spread of ``j``: tau and tokens/s at its low and high ends."""
    return (f"tau {span(j.tau['low'], j.tau['high'], '.2f')} -> "
            f"{span(*j.band_tps, unit=' tok/s')}")


def coverage_words(h: Answer) -> str:
    return h.calib.words()


def short(plan: Plan) -> str:
    """``draft k=K placement/vocab, verifier, backend`` for one line."""
    if not plan.speculative:
        return f"no speculation ({plan.backend})"
    return (f"`{plan.draft.name}` k = {plan.k} ({plan.placement}/{plan.vocab}, "
            f"{plan.verifier}, {plan.backend})")


def choice_cell(plan: Plan) -> str:
    if not plan.speculative:
        return f"no speculation ({plan.backend})"
    return f"k={plan.k} {plan.placement}/{plan.vocab}, {plan.verifier}, {plan.backend}"


def public_short(plan: Plan) -> str:
    """A table cell: the evidence level of the exact configuration, with its sources."""
    return evidence(plan).short()


def public_status(plan: Plan) -> str:
    """The evidence behind this configuration with its sources; when it is modelled only,
    the nearest public run of the draft's kind."""
    ev = evidence(plan)
    out = ev.text()
    runs = public_runs(plan.draft) if plan.speculative else []
    if not ev.runs and runs:
        out += f". Nearest public run (another configuration): {run_text(runs[0])}"
    own = [r for r in runs if r.get("checkpoint") == plan.draft.checkpoint and r not in ev.runs]
    if own:
        out += (". Public runs of this very checkpoint in other configurations (not priced "
                "by the cost model: another decode context parallel size, all-reduce or "
                "target): " + "; ".join(run_text(r) for r in own))
    return out + "."


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


def _point_words(j: Judged) -> str:
    src = j.point.source
    if src.startswith("field:"):
        return "its public field figure"
    if "ratio" in src:
        return "its card shrunk by the mean field/card ratio of Kimi drafts"
    return "its card figure"


def expected_line(h: Answer) -> str:
    c = h.choice
    return (f"- Expected **{c.tps['point']:.0f} tok/s** single stream (context {h.context}) at "
            f"its point acceptance (tau {c.tau['point']:.2f}: {_point_words(c)}); "
            f"**{interval_text(c)}** ({coverage_words(h)}). Acceptance band, reported "
            f"separately: {band_text(c)}. Stock vLLM without speculation: "
            f"**{h.no_spec_tps:.0f} tok/s** ({span(*h.no_spec_interval, unit=' tok/s')}, the "
            f"same interval): **{h.speedup():.2f}x**.")


def rope_note(j: Judged) -> str:
    """What is known of a draft's RoPE attention factor (a draft whose factor is unknown)."""
    spec = rope_factor(j.draft) if j.plan.speculative else None
    if spec is None:
        return ""
    return (f" RoPE attention factor unknown: vLLM 0.34.0 (like Hugging Face transformers) "
            f"reads {factor_text(spec['config_factor'])} from the published config, plain YaRN "
            f"(SGLang, vLLM <= 0.29) uses {factor_text(spec['other_factor'])}; which one the "
            "draft was trained with is not published. The A/B settles it: the commands serve "
            f"the published config, and `vllm-kimi-ext draft rope-config ... --attention-factor "
            f"{factor_text(spec['other_factor'])}` writes the other arm (`bench/e2e/runner.py "
            f"recommendation` once as is and once with `--draft-dir {j.draft.name}=DIR`; "
            "choosing-a-draft.md, \"DFlash RoPE scaling\").")


def e2e_command() -> str:
    """The box-side run of the choice and the configuration to measure beside it."""
    return ("python bench/e2e/runner.py recommendation --python /path/to/venv "
            "--out bench/out/e2e/what-to-run")


def worth_measuring_lines(h: Answer) -> list[str]:
    w = h.worth_measuring
    if w is None:
        return []
    return [f"- **Worth measuring**: {short(w.plan)}, {w.tps['point']:.0f} tok/s at its point "
            f"acceptance ({interval_text(w)}; {w.evidence.short()}): faster by point "
            f"estimate, but its interval does not clear the recommendation's "
            f"({interval_text(h.choice)}), so it stays a forecast until a box measures it. "
            "Settle both on your box, back to back with the same prompts: "
            f"`{e2e_command()}`.{rope_note(w)} Its commands:", "",
            "  ```bash", *(f"  {ln}" for ln in commands(w).splitlines()), "  ```"]


def needs_line(h: Answer) -> str:
    c = h.choice
    needs = [str(r) for r in c.option.requires]
    loader = h.draft.raw.get("loader_note")
    return ("- Needs: " + ("nothing beyond stock vLLM 0.34.0." if not needs else
                           "; ".join(needs) + ".")
            + (f" {loader}." if loader else "")
            + (f" Loading: {h.draft.stock_note}." if h.draft.stock_note
               and draft_attention_backend(h.draft) else "") + rope_note(c))


def headline_markdown(h: Answer | None = None) -> str:
    """The answer as markdown bullets plus the commands that serve it (README, docs,
    bench)."""
    h = h or headline()
    c = h.choice
    lines = [
        _describe_choice(h),
        expected_line(h),
        "- Evidence: " + public_status(c.plan),
        "- Ranked by evidence: a configuration without a public run on stock vLLM or upstream "
        "main is recommended over one with such a run only when its whole interval clears "
        "the other's."
        + (f" It does here: the measured alternative is {short(h.alternative.plan)} "
           f"({interval_text(h.alternative)})." if h.alternative is not None else ""),
        *worth_measuring_lines(h),
        needs_line(h),
        "",
        "```bash",
        commands(c),
        "```",
    ]
    return "\n".join(lines)


def _judged_dict(j: Judged | None, h: Answer) -> dict | None:
    if j is None:
        return None
    p = j.plan
    return {"draft": j.draft.name, "checkpoint": j.draft.checkpoint, "k": p.k,
            "placement": p.placement, "vocab": p.vocab, "verifier": p.verifier,
            "backend": p.backend, "evidence": j.evidence.to_dict(),
            "tokens_per_s": j.tps["point"],
            "interval_tokens_per_s": {"low": j.interval[0], "high": j.interval[1],
                                      "coverage": h.calib.coverage},
            "acceptance_band": {"tau": {"low": j.tau["low"], "high": j.tau["high"]},
                                "tokens_per_s": {"low": j.band_tps[0], "high": j.band_tps[1]}},
            "tau": j.tau["point"], "point_acceptance": j.point.source,
            "serve_command": serve_command(p, j.option.requires)}


def answer_dict(h: Answer) -> dict:
    """The answer for ``plan --json``: choice and worth measuring, each with its evidence
    level, point estimate, calibrated interval (with its coverage) and acceptance band."""
    lo, hi = h.no_spec_interval
    return {"choice": _judged_dict(h.choice, h),
            "worth_measuring": _judged_dict(h.worth_measuring, h),
            "measured_alternative": _judged_dict(h.alternative, h),
            "interval": h.calib.to_dict(),
            "no_speculation": {"tokens_per_s": h.no_spec_tps,
                               "interval_tokens_per_s": {"low": lo, "high": hi,
                                                         "coverage": h.calib.coverage},
                               "evidence": "the cost model's calibration runs (stock vLLM "
                                           "without speculation, NCCL)"}}


def answer_line(h: Answer) -> str:
    """One line: the choice, its number, interval and evidence (``plan``'s first line)."""
    c = h.choice
    return (f"Answer: {short(c.plan)} -> {c.tps['point']:.0f} tok/s "
            f"({h.calib.coverage:.0%} interval {interval_text(c)}), {c.evidence.short()}"
            + (f"; worth measuring: {short(h.worth_measuring.plan)} "
               f"{h.worth_measuring.tps['point']:.0f} tok/s "
               f"({interval_text(h.worth_measuring)})" if h.worth_measuring else ""))


def format_answer(a: Answer) -> str:
    """Each draft's choice by the answer's rule (``plan``'s plain-text table)."""
    lines = [f"Ranked by evidence (point: field acceptance, else the card shrunk by the mean "
             f"field/card ratio; {a.calib.words()}; band: tokens/s at the acceptance band's "
             "low and high ends):"]
    head = (f"{'draft':22s} {'choice':30s} {'tok/s':>7s} {'interval':>11s} {'band':>11s}  "
            "evidence; worth measuring")
    lines += [head, "-" * len(head)]
    for name, c, w in a.per_draft:
        p = c.plan
        extra = "" if w is None else (f"; worth measuring k={w.plan.k} {w.plan.placement}/"
                                      f"{w.plan.vocab} {w.tps['point']:.1f} tok/s")
        choice = f"k={p.k} {p.placement}/{p.vocab} {p.verifier} {p.backend}"
        lines.append(f"{name:22s} {choice:30s} {c.tps['point']:7.1f} {span(*c.interval):>11s} "
                     f"{span(*c.band_tps):>11s}  {c.evidence.label()}{extra}")
    lo, hi = a.no_spec_interval
    lines.append(f"{'(no speculation)':22s} {'stock vLLM, nccl':30s} {a.no_spec_tps:7.1f} "
                 f"{span(lo, hi):>11s} {'-':>11s}  the cost model's calibration runs")
    return "\n".join(lines)


def readme_section(h: Answer | None = None) -> str:
    """README.md's "What to run on 8x PCIe" section, generated."""
    h = h or headline()
    body = headline_markdown(h)
    return "\n".join([
        README_HEADING,
        "",
        "> **A forecast ranked by evidence, not a measurement of your box.** Generated by "
        "`vllm_kimi_ext.costmodel.answer_text` (test-enforced): the decode cost model fitted "
        "to public Kimi-K2.x runs on 8x RTX PRO 6000 (held-out validation and every source in "
        "[docs/cost-model.md](docs/cost-model.md)), ranking only what stock vLLM 0.34.0 plus "
        "this project can build. Measure your box with "
        f"`{e2e_command()}` (it checks that python's vLLM is 0.34.0 before launching), then "
        f"re-rank with what it measured: `vllm-kimi-ext plan --draft {h.draft.name} "
        "--acceptance-from bench/out/e2e/what-to-run/results.json` (each measured draft "
        "likewise; the run prints these commands).",
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


def choosing_answer_markdown() -> str:
    """docs/choosing-a-draft.md's generated block: the answer, as README.md prints it."""
    return ("**Which one to run** (the answer of `vllm-kimi-ext plan`, README.md and "
            "[what-to-run.md](what-to-run.md), generated from the same function; every draft "
            "with its evidence is there):\n\n" + headline_markdown(headline()))


# ---------------------------------------------------------------------------------------------
# docs/what-to-run.md: every draft, and the sensitivity of the answer
# ---------------------------------------------------------------------------------------------


def _headline_role(name: str, h: Answer) -> str:
    """Why a draft is or is not the answer's (the rules of :func:`~.headline.answer`)."""
    if name == h.draft.name:
        return "**the answer**"
    if h.worth_measuring is not None and name == h.worth_measuring.draft.name:
        return "**worth measuring**"
    d = load_draft(name)
    if name not in {n for n, _, _ in h.per_draft}:
        if d.raw.get("trained_for", TARGET) != TARGET:
            return f"not a candidate: trained for {d.raw['trained_for']}, its card is not K2.5's"
        return "not a candidate: no card acceptance figure (assumed band)"
    return "candidate"


def _draft_answer(cm: CostModel, h: Answer, name: str):
    """(choice, worth measuring) of one draft: the headline's own for its candidates."""
    for n, c, w in h.per_draft:
        if n == name:
            return c, w
    try:
        a = answer(cm, [load_draft(name)], calib=h.calib)
    except ValueError:
        return None, None
    return a.choice, a.worth_measuring


def drafts_section(cm: CostModel, h: Answer) -> list[str]:
    rows = []
    for name in list_profiles("drafts"):
        d = load_draft(name)
        c, w = _draft_answer(cm, h, name)
        if c is None:
            rows.append([f"`{name}`", d.raw.get("trained_for", TARGET), "-", "-", "-", "-",
                         "-", "-", "-", "-", "no acceptance published: pass --tau or "
                         "--acceptance-from"])
            continue
        needs = "; ".join(x.short or x.text for x in c.option.requires) or "stock"
        rows.append([f"`{name}`", d.raw.get("trained_for", TARGET)
                     + (" (assumed band)" if c.band.card_is_assumed else ""),
                     choice_cell(c.plan), public_short(c.plan),
                     f"{c.tps['point']:.0f} ({interval_text(c)})",
                     f"{c.tau['point']:.2f}", band_text(c),
                     f"{c.tps['point'] / h.no_spec_tps:.2f}x", needs,
                     (f"{choice_cell(w.plan)}: {w.tps['point']:.0f} ({interval_text(w)})"
                      if w is not None else "-"), _headline_role(name, h)])
    return ["## Every draft, ranked by evidence", "",
            "Single stream, context 1024. Per draft, the configuration the rule of the answer "
            "picks among that draft's own: tokens/s at its point acceptance (the public field "
            "figure where one exists, else the card shrunk by the mean field/card ratio of Kimi "
            f"drafts) with its {h.calib.words()}; and, separately, the acceptance band's "
            "spread (tokens/s at the band's low and high acceptance, the model's point "
            "estimates). Evidence levels: *this checkpoint measured* (a public run of the "
            "draft's own checkpoint in this configuration on this box class), *a sibling "
            "checkpoint measured* (another Kimi version's head of the same kind, or a copy), "
            "*modelled only*; each measured level names its stack (stock vLLM 0.34.0, vLLM "
            "upstream main, fork). A configuration without a run on stock vLLM or upstream "
            "main displaces one with such a run only when its whole interval clears the "
            "other's; otherwise it is listed as worth measuring. The answer competes among "
            f"the drafts trained for {TARGET} with a card figure (a draft trained for another "
            f"Kimi version carries that version's card, which {TARGET} does not reach).", "",
            md_table(["draft", "trained for", "its choice", "evidence",
                      "tok/s point (interval)", "tau point", "acceptance band", "x stock",
                      "needs", "worth measuring", "the answer?"], rows), ""]


def sensitivity_rows(cm: CostModel, h: Answer, changes) -> list[list[str]]:
    """The answer's draft re-chosen under each ``(label, model, batch, context)`` of
    ``changes``."""
    rows = []
    for label, model, batch, context in changes:
        try:
            a = answer(model, [h.draft], batch=batch, context=context, calib=h.calib)
        except ValueError:
            rows.append([label, "nothing fits in memory", "-", "-", "-"])
            continue
        base = model.no_spec(batch=batch, context=context).tokens_per_s
        c = a.choice
        rows.append([label, choice_cell(c.plan), c.evidence.label(),
                     f"{c.tps['point']:.0f} ({interval_text(c)})",
                     f"{c.tps['point'] / base:.2f}x"])
    return rows
