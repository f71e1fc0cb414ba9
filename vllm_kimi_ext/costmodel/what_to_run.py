"""``docs/what-to-run.md``: the answer (:mod:`.answer_text`), every draft ranked by
evidence, the sensitivity of the answer, the what-if table and its ranking, and the verifier
crossover block. :mod:`.report` writes it (``--write-docs``). Deterministic: no dates, no
machine names."""

from __future__ import annotations

import dataclasses
import functools

from vllm_kimi_ext.costmodel import verify_cost, whatif
from vllm_kimi_ext.costmodel.acceptance import band_for, field_to_card_ratio
from vllm_kimi_ext.costmodel.answer_text import (
    drafts_section,
    headline_markdown,
    sensitivity_rows,
)
from vllm_kimi_ext.costmodel.calibration import (
    ERROR_BOUND,
    HELD_OUT,
    SPLITS,
    mean_abs,
    validate,
)
from vllm_kimi_ext.costmodel.catalog import list_profiles, load_draft
from vllm_kimi_ext.costmodel.cost_model_doc import IMG, PCIE
from vllm_kimi_ext.costmodel.headline import headline
from vllm_kimi_ext.costmodel.latency import load_latency_table
from vllm_kimi_ext.costmodel.markdown import md_table, pct, pct_range
from vllm_kimi_ext.costmodel.model import CostModel

EAGLE_REFERENCE = "lightseek-eagle3-mla"


def sensitivity_changes(cm: CostModel) -> list[tuple[str, CostModel, int, int]]:
    """(label, model, batch, context) of each change the sensitivity table applies."""
    out = [("the answer (batch 1, context 1024)", cm, 1, 1024)]
    out += [(f"context {c // 1024}k", cm, 1, c) for c in (16384, 32768, 131072)]
    out += [(f"batch {b} (aggregate tok/s)", cm, b, 1024) for b in (4, 16, 64)]
    for name, label in (("rtx-pro-6000-pcie-switch-x8", "a single-CPU PCIe-switch box"),
                        ("rtx-pro-6000-broadcom-dual-x8", "the Broadcom-switch dual-socket box")):
        out.append((f"latency table of {label}", cm.with_latency(load_latency_table(name)),
                    1, 1024))
    out.append(("in-situ collective overhead x2", cm.with_params(dataclasses.replace(
        cm.params, collective_overhead_us=2 * cm.params.collective_overhead_us)), 1, 1024))
    out.append(("uniform independent routing", cm.with_params(dataclasses.replace(
        cm.params, routing_skew=1.0, expert_popularity=0.0)), 1, 1024))
    return out


def drafts_section_of(cm: CostModel) -> list[str]:
    """"Every draft, ranked by evidence" for ``cm`` (its own answer off the PCIe profile)."""
    return drafts_section(cm, headline(cm) if cm.hw.name != PCIE else headline())


def _band_range(r) -> str:
    """A lever's batch-1 gains over the band's scenarios, ``low..high`` with the card's
    inside."""
    return pct_range(r.gain(1, s) for s in ("low", "card", "high"))


#: Drafts whose what-if table docs/what-to-run.md shows besides the headline's: the EAGLE-3
#: reference and the DSpark draft (the only method adaptive verification supports).
WHATIF_DRAFTS = (EAGLE_REFERENCE, "novita-dspark")


def lever_tables(cm: CostModel, h) -> dict[str, list]:
    """{draft name: its what-if rows}: the headline draft first, then :data:`WHATIF_DRAFTS`."""
    ratio = field_to_card_ratio([load_draft(n) for n in list_profiles("drafts")])
    out = {h.draft.name: whatif.lever_table(cm, h.draft, h.choice.band)}
    for name in WHATIF_DRAFTS:
        if name not in out:
            d = load_draft(name)
            out[name] = whatif.lever_table(cm, d, band_for(d, ratio=ratio))
    return out


def lever_markdown(rows) -> str:
    """One draft's what-if table (``docs/what-to-run.md``; the same columns as the plot)."""
    cells = []
    for r in rows:
        g = [" / ".join(pct(r.gains[b][s]) for s in ("low", "card", "high"))
             for b in whatif.BATCHES]
        cells.append([r.lever.name, r.lever.kind, *g, r.lever.takes, r.lever.rests_on,
                      r.lever.assumption])
    return md_table(["lever", "kind", *(f"batch {b}" for b in whatif.BATCHES),
                     "set / install", "measured numbers it rests on (source)",
                     "how the model uses them"], cells)


def _levers_section(cm: CostModel, h) -> list[str]:
    tables = lever_tables(cm, h)
    out = ["## What-if: settings you can apply, and upper bounds", "",
           "Gain over the recommender's best buildable configuration at the same batch and "
           "acceptance scenario (low / card / high), draft length re-optimised; '-' = does "
           "not apply or does not fit. **kind**: a *setting* of stock vLLM 0.34.0 or NCCL "
           "(environment variable or `--speculative-config` field), a *package* to install "
           "(not wired into vLLM 0.34.0), something *this project* ships, or an *upper "
           "bound, no setting*: the ceiling of a mechanism nothing available today "
           "reaches. The settings are costed from the public measurements named in each "
           "row, not from runs on this box; the recommendation above ranks only backends "
           "with public end-to-end Kimi runs on this class of box.", ""]
    for name, rows in tables.items():
        out += [f"Draft `{name}`:", "", lever_markdown(rows), ""]
    check = whatif.speculative_check(cm, h.draft, h.choice.point)
    if check is not None:
        out += [f"**All-reduce rows under speculation, checked against the public A/B**: "
                f"{check.text()}. The model's gain shrinks under speculation "
                + ("at least as much as the public one (test-enforced)" if check.holds() else
                   "LESS than the public one: treat the all-reduce rows as optimistic")
                + f". FlashInfer's own microbenchmark is not used for its latencies: its NCCL "
                f"baseline was {whatif.microbenchmark_baseline_ratio(cm):.1f}x this host's "
                "in-situ NCCL at the same size.", ""]
    head_rows = tables[h.draft.name]
    act = [r for r in head_rows if r.lever.kind != whatif.UPPER_BOUND and not r.lever.built]
    bounds = [r for r in head_rows if r.lever.kind == whatif.UPPER_BOUND]
    out += [f"![levers at batch 1]({IMG}/costmodel-levers.png)", "",
            "## Ranking", "",
            f"By predicted gain at batch 1 with the headline draft's card acceptance "
            f"(`{h.draft.name}`).", "", "What you can set or install today:", ""]
    for i, r in enumerate(act, start=1):
        out.append(f"{i}. **{r.lever.name}** ({r.lever.kind}: {r.lever.takes}): "
                   + (f"{pct(r.gain(1, 'card'))} at batch 1 ({_band_range(r)} across the "
                      f"band), {pct(r.gain(64, 'card'))} at batch 64."
                      if r.gain(1, "card") is not None else
                      f"does not apply to `{h.draft.name}`.")
                   + f" Rests on: {r.lever.rests_on}.")
    out += ["", "Upper bounds (no setting reaches them today):", ""]
    for i, r in enumerate(bounds, start=1):
        out.append(f"{i}. **{r.lever.name}**: {pct(r.gain(1, 'card'))} at batch 1 "
                   f"({_band_range(r)} across the band), "
                   f"{pct(r.gain(64, 'card'))} at batch 64. Assumes: {r.lever.assumption}.")
    return out


@functools.lru_cache(maxsize=4)  # deterministic over the shipped profiles
def what_to_run_markdown() -> str:
    cm = CostModel.build(PCIE)
    rep = validate(cm)
    h = headline()
    n = {s: len(rep.split(s)) for s in SPLITS}
    between, unseen = (rep.held_out(g) for g in HELD_OUT)
    out = [
        "# What to run on 8x PCIe", "",
        "<!-- Generated by `python -m vllm_kimi_ext.costmodel.report --write-docs docs/`; "
        "do not edit by hand. -->", "",
        "> **A forecast ranked by evidence, not a measurement of your box.** Every number "
        "below comes from the decode "
        "cost model in `vllm_kimi_ext/costmodel` ([cost-model.md](cost-model.md)), fitted to "
        f"{n['calibration']} public measurements of Kimi-K2.x on 8x RTX PRO 6000 (mean error "
        f"{rep.mean_abs_error('calibration'):.1%}) and checked on {n['validation']} held-out "
        f"ones: {len(between)} between fitted cells of the same runs (mean error "
        f"{mean_abs(between):.1%}) and {len(unseen)} from runs with no fitted cell (mean error "
        f"{mean_abs(unseen):.1%}); every miss above {ERROR_BOUND:.0%} is listed there with "
        "the difference its run records and the mechanism the model lacks. Each forecast's "
        f"interval: {h.calib.words()}. Only "
        "configurations buildable from stock vLLM 0.34.0 plus this project are recommended; "
        "everything else is in the what-if table.", "",
        "## Recommendation: single stream", "",
        headline_markdown(h), "",
    ]
    out += drafts_section(cm, h)
    out += ["## Sensitivity of the answer", "",
            f"The answer's draft (`{h.draft.name}`) re-chosen by the same rule under one change "
            "at a time; tok/s at its point acceptance with the calibrated interval; 'x stock' "
            "compares with stock vLLM without speculation under the same change.", "",
            md_table(["change", "choice", "evidence", "tok/s point (interval)", "x stock"],
                     sensitivity_rows(cm, h, sensitivity_changes(cm))), ""]
    out += _levers_section(cm, h)
    out += ["", *verify_cost.crossover_markdown(cm)]
    out += ["", "Reproduce: `vllm-kimi-ext plan --draft " + h.draft.name + "` (the answer, "
            "the table, the evidence, the explanation); `vllm-kimi-ext plan --validate` (the "
            "fit against every public point)."]
    return "\n".join(out) + "\n"
