"""Markdown reports from the cost model, and the generated documentation.

* :func:`markdown_report` - a plan report (tables + PNG) for one box and set of drafts; the
  bench session uses it to put the model's prediction beside its measurements.
* :func:`what_to_run_markdown` - ``docs/what-to-run.md`` (the headline of
  :mod:`.headline`, every draft across its band, sensitivity, the what-if ranking).
* the blocks between the ``GENERATED`` markers of ``docs/cost-model.md``: parameters and
  validation, sources, latency tables, anatomy of a step.

``python -m vllm_kimi_ext.costmodel.report --write-docs DIR`` regenerates both documents
and their PNGs under ``DIR/img``; ``--check-docs DIR`` exits 1 when a document is stale
(a unit test does the same). Everything here is deterministic: no dates, no machine names.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from pathlib import Path

from vllm_kimi_ext.costmodel import verify_cost, whatif
from vllm_kimi_ext.costmodel.acceptance import (
    Acceptance,
    band_for,
    field_to_card_ratio,
    from_draft_profile,
)
from vllm_kimi_ext.costmodel.calibration import (
    ERROR_BOUND,
    HELD_OUT,
    SPLITS,
    mean_abs,
    validate,
)
from vllm_kimi_ext.costmodel.catalog import (
    list_profiles,
    load_draft,
    load_hardware,
)
from vllm_kimi_ext.costmodel.evidence import WORDS
from vllm_kimi_ext.costmodel.headline import (
    TARGET,
    answer,
    headline,
    headline_markdown,
    interval_text,
    public_short,
    recommendation,
)
from vllm_kimi_ext.costmodel.latency import load_latency_table
from vllm_kimi_ext.costmodel.model import CostModel, StepEstimate
from vllm_kimi_ext.costmodel.options import Recommendation, describe, fmt_bytes
from vllm_kimi_ext.costmodel.params import BOUNDS, FITTED
from vllm_kimi_ext.costmodel.plot import (
    plot_latency,
    plot_levers,
    plot_plan,
    plot_validation,
    series,
)
from vllm_kimi_ext.costmodel.recommend import recommend
from vllm_kimi_ext.user_input import (
    EXIT_CODES_HELP,
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    UserInputError,
    bounded_int,
    one_line,
)

PCIE = "rtx-pro-6000-pcie-x8"
GENERATED_BLOCKS = ("calibration", "sources", "latency", "anatomy")
IMG = "img"
EAGLE_REFERENCE = "lightseek-eagle3-mla"
PARAM_MEANING = {
    "bandwidth_efficiency": "fraction of peak memory bandwidth streaming weights",
    "collective_overhead_us": "in-situ cost per collective on top of the idle table (us)",
    "kv_read_factor": "attention time per KV byte relative to a weight byte (context cost)",
    "kv_query_share": "extra KV read per additional verified token of a sequence",
    "routing_skew": "correlation of one sequence's verified tokens (1 = independent)",
    "expert_popularity": "Zipf exponent of expert choice (0 = uniform)",
    "spec_step_overhead_us": "fixed cost of a speculative step (us)",
    "draft_forward_overhead_us": "fixed cost of each draft forward (us)",
    "compute_efficiency": "fraction of peak BF16 rate where compute-bound",
    "kernel_gap_us": "idle gap per kernel launch (us; prior, not fitted)",
}


def _markers(block: str) -> tuple[str, str]:
    return (f"<!-- BEGIN GENERATED: {block} (python -m vllm_kimi_ext.costmodel.report "
            f"--write-docs docs/) -->", f"<!-- END GENERATED: {block} -->")


def _numeric(cell: str) -> bool:
    c = cell.strip("*` ")
    return bool(c) and (c[0].isdigit() or (c[0] in "+-" and len(c) > 1 and c[1].isdigit())
                        or c == "-")


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table; columns whose cells are all numbers are right-aligned."""
    align = ["---:" if rows and all(_numeric(r[i]) for r in rows) else "---"
             for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def pct(x: float | None) -> str:
    if x is None:
        return "-"
    return "0%" if abs(x) < 5e-3 else f"{x:+.0%}"


def _src_cell(src: dict) -> str:
    return (f"`{src.get('repo', '?')}` `{src.get('file', '?')}` @ "
            f"`{str(src.get('commit', '?'))[:10]}` ({src.get('date', '?')})")


# ---------------------------------------------------------------------------------------------
# docs/cost-model.md blocks
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)  # deterministic over the shipped profiles
def calibration_markdown(hardware: str = PCIE) -> str:
    cm = CostModel.build(hardware)
    prior = CostModel.build(hardware, params="prior").params
    rep = validate(cm)
    n = {s: len(rep.split(s)) for s in SPLITS}
    rows = [[f"`{name}`", f"{getattr(cm.params, name):.3g}", f"{getattr(prior, name):.3g}",
             f"{BOUNDS[name][0]:g}-{BOUNDS[name][1]:g}", PARAM_MEANING[name]] for name in FITTED]
    out = [
        f"Fitted on `{hardware}`: {n['calibration']} calibration points; {n['validation']} "
        f"more held out ({n['validation'] / (n['calibration'] + n['validation']):.0%}).",
        "",
        md_table(["parameter", "fitted", "prior", "bounds", "meaning"], rows),
        "",
        md_table(["points", "n", "mean abs error", "largest error"],
                 [[g, str(len(rows)), f"{mean_abs(rows):.1%}",
                   f"{max((abs(r.error) for r in rows), default=0.0):.1%}"]
                  for g, rows in rep.groups().items()]),
        "",
        "Held-out points between fitted cells of a run test interpolation within a run the "
        "fit saw; points of runs with no fitted cell test the model on a configuration, image "
        "or host it was not fitted to.",
        "",
        f"![measured against predicted]({IMG}/costmodel-validation.png)",
        "",
        "Every point (`vllm-kimi-ext plan --validate` prints the same):",
        "",
    ]
    rows = []
    for r in rep.rows:
        p = r.point
        rows.append([f"`{p.id}`", p.split[:3], p.backend, f"{p.draft or '-'}",
                     f"{p.acceptance.tau(p.k):.2f}" if p.k else "-",
                     f"{p.tokens_per_s:.1f}", f"{r.predicted:.1f}",
                     ("" if r.within_bound else "**") + pct(r.error)
                     + ("" if r.within_bound else "**")])
    out.append(md_table(["point", "split", "all-reduce", "draft", "tau", "measured tok/s",
                         "model tok/s", "error"], rows))
    misses = rep.misses
    out += ["", f"Points beyond {ERROR_BOUND:.0%}, the difference from the fitted runs their "
            "run records (image, kernels or host) and the mechanism the model lacks "
            "(`vllm-kimi-ext plan --validate` fails on a miss that names none):", ""]
    by_run: dict[str, list] = {}
    for r in misses:
        by_run.setdefault(r.point.run, []).append(r)
    for run, rs in by_run.items():
        errs = ", ".join(f"{r.point.id.split('/', 1)[1]} {pct(r.error)}" for r in rs)
        p, why_not = rs[0].point, rep.why_unexplained(rs[0])
        named = (f"UNEXPLAINED ({why_not})" if why_not else
                 f"{p.difference}: {p.recorded(p.difference)}")
        out.append(f"- `{run}` ({errs}): {named}; {p.model_lacks}.")
    if not misses:
        out.append("- none.")
    return "\n".join(out)


@functools.lru_cache(maxsize=4)  # deterministic over the shipped profiles
def sources_markdown(hardware: str = PCIE) -> str:
    cm = CostModel.build(hardware)
    rows = [[f"`{sid}`", _src_cell(s), s.get("topology", ""), s.get("note", "")]
            for sid, s in cm.hw.calibration.get("sources", {}).items()]
    out = ["Throughput runs (`calibration.sources` of the hardware profile):", "",
           md_table(["id", "source", "box", "what"], rows), "",
           "Collective latencies (`sources` of each latency table):", ""]
    rows = []
    for name in list_profiles("latency"):
        t = load_latency_table(name)
        for sid, s in t.sources.items():
            rows.append([f"`{name}`", f"`{sid}`", _src_cell(s), s.get("topology", ""),
                         s.get("method", "")])
    out.append(md_table(["table", "id", "source", "box", "method"], rows))
    out += ["", f"Settings costed in the what-if table (`settings.sources` of the "
            f"`{whatif.SETTINGS_TABLE}` latency table):", ""]
    rows = [[f"`{sid}`", f"`{s['repo']}` {s['ref']}" + (f" @ `{s['commit'][:10]}`"
                                                       if s.get("commit") else "")
             + (f" ({s['date']})" if s.get("date") else ""), s.get("topology", ""),
             "; ".join(x for x in (s.get("where", ""), s.get("method", "")) if x)]
            for sid, s in whatif.settings_data()["sources"].items()]
    out.append(md_table(["id", "source", "box", "what"], rows))
    out += ["", "Acceptance (draft profiles: the card and every public field figure):", ""]
    rows = []
    for name in list_profiles("drafts"):
        d = load_draft(name)
        acc = d.acceptance or {}
        card = ", ".join(f"{k} {v:g}" for k, v in sorted(acc.get("values", {}).items())) or "-"
        fields = "; ".join(f"{f.get('label', '')} ({_src_cell(f.get('source', {}))})"
                           for f in acc.get("field", [])) or "none public"
        rows.append([f"`{name}`", card + (f" (k={acc['k_ref']})" if acc.get("values") else ""),
                     acc.get("source", "-") if acc.get("values") else
                     (acc.get("assumed", {}).get("source", "none") if acc else "none"), fields])
    out.append(md_table(["draft", "card", "card source", "field figures"], rows))
    return "\n".join(out)


@functools.lru_cache(maxsize=4)  # deterministic over the shipped profiles
def latency_markdown() -> str:
    out = ["Shipped tables (`profiles/latency/`); every point is a published measurement:", ""]
    rows = []
    for name in list_profiles("latency"):
        t = load_latency_table(name)
        for backend, ops in t.curves.items():
            for op, c in ops.items():
                pts = ", ".join(f"{fmt_bytes(x)} {y:g}" for x, y in zip(c.sizes, c.measured_us))
                lifted = "; lifted: " + ", ".join(fmt_bytes(x) for x, _, _ in c.lifted) \
                    if c.lifted else ""
                rows.append([f"`{name}`", backend + (" (auto crossover)"
                                                     if backend in t.auto_crossover else ""),
                             op, pts + lifted])
    out += [md_table(["table", "backend", "op", "bytes us (published)"], rows), "",
            f"![published all-reduce latencies]({IMG}/costmodel-latency.png)"]
    return "\n".join(out)


@functools.lru_cache(maxsize=4)  # deterministic over the shipped profiles
def anatomy_markdown(hardware: str = PCIE) -> str:
    """Per-GPU bytes of one target pass, distinct experts, and a no-speculation step."""
    cm = CostModel.build(hardware)
    m = cm.model
    w1 = cm.target_weight_bytes(1)
    rep, shd = m.mla_params()
    dense, moe, h = m.first_k_dense_replace, m.num_layers - m.first_k_dense_replace, m.hidden_size
    notes = {
        "attention": f"{m.num_layers} x ({rep / 1e6:.1f}M replicated fused_qkv_a + "
                     f"{shd / 1e6:.1f}M / TP) bf16; replicated part "
                     f"{m.num_layers * rep * m.dtype_bytes / 1e9:.2f} GB",
        "dense_mlp": f"{dense} dense layer{'s' * (dense != 1)}, 3 x {h} x "
                     f"{m.dense_intermediate_size} / TP, bf16",
        "router": f"{moe} x {h} x {m.n_routed_experts} bf16, replicated on every rank",
        "shared_experts": f"{moe} x {3 * m.n_shared_experts} x {h} x "
                          f"{m.moe_intermediate_size} / TP, bf16",
        "routed_experts": f"{moe} x {m.num_experts_per_tok} experts x "
                          f"{m.expert_params() / 1e6:.1f}M / TP at "
                          f"{m.routed_expert_bits_per_weight:g} bits",
        "lm_head": f"{m.vocab_size} x {h} / TP, bf16",
    }
    rows = [[k, f"{v / 1e9:.3f}", notes[k]] for k, v in w1.items()]
    rows.append(["**total**", f"**{sum(w1.values()) / 1e9:.3f}**",
                 f"+ {cm.kv_bytes_per_token() / 1e3:.1f} KB of MLA latent per context token"])
    out = ["Weight bytes each GPU streams in one target pass over one token (TP=8):", "",
           md_table(["part", "GB per GPU", "how"], rows), "",
           f"All weights {m.total_params() / 1e12:.3f}T parameters, {m.active_params() / 1e9:.1f}B "
           f"active per token; resident per GPU {cm.target_memory_bytes() / 1e9:.1f} GB.", "",
           "Expected distinct routed experts per MoE layer (fitted routing: skew "
           f"{cm.params.routing_skew:.2f}, popularity {cm.params.expert_popularity:.2f}) "
           "for B independent sequences, and for one sequence verifying q tokens:", ""]
    step = cm.no_spec(backend="nccl")
    share = step.allreduce_time_s / step.step_s
    per_call = step.allreduce_time_s / sum(t.allreduces for t in step.terms) * 1e6
    rows = []
    for n in (1, 2, 4, 8, 16, 32, 64, 128):
        rows.append([str(n), f"{m.expected_distinct_experts(n, skew=1.0, batch=n):.1f}",
                     f"{cm.distinct_experts(n):.1f}", f"{cm.distinct_experts(n, 1):.1f}"])
    out += [md_table(["tokens", "uniform", "B sequences (fitted)", "1 sequence, q tokens "
                      "(fitted)"], rows), "",
            "One no-speculation step at batch 1, context 1024 (fitted, NCCL):", "",
            breakdown_markdown(step), "",
            f"All-reduce share of this step: {share:.0%}, {per_call:.0f} us per call in situ "
            "(the unsourced profile stated 51.5 % and 127 x ~78 us)."]
    return "\n".join(out)


def breakdown_markdown(e: StepEstimate) -> str:
    rows = []
    for t in e.terms:
        rows.append([t.phase, t.name, f"{t.time_s * 1e3:.3f}",
                     fmt_bytes(t.hbm_bytes) if t.hbm_bytes else "-",
                     str(t.collectives) if t.collectives else "-",
                     fmt_bytes(t.comm_bytes) if t.comm_bytes else "-"])
    rows.append(["", "**step**", f"**{e.step_s * 1e3:.3f}**", fmt_bytes(e.total("hbm_bytes")),
                 str(e.collectives_per_step), fmt_bytes(e.total("comm_bytes"))])
    return md_table(["phase", "term", "ms", "HBM bytes/GPU", "collectives", "comm bytes"], rows)


# ---------------------------------------------------------------------------------------------
# Plan reports (bench)
# ---------------------------------------------------------------------------------------------


def _option_row(o, base_tps: float) -> list[str]:
    e, p = o.estimate, o.plan
    return [p.draft.name if p.speculative else "(no speculation)", str(p.k),
            f"{p.placement}/{p.vocab}" if p.speculative else "-",
            p.verifier if p.speculative else "-", p.backend, f"{e.tau:.2f}",
            f"{e.tokens_per_s:.1f}", f"{e.tokens_per_s / base_tps:.2f}x",
            f"{e.collectives_per_token:.1f}", fmt_bytes(e.comm_bytes_per_token),
            fmt_bytes(e.hbm_bytes_per_token)]


_HEADER = ["draft", "k", "placement", "verifier", "backend", "tau", "tok/s",
           "x stock no-spec", "collectives/token", "comm bytes/token", "HBM bytes/token"]


def plan_markdown(cm: CostModel, rec: Recommendation, plot_name: str | None = None,
                  heading: str = "Recommendation") -> str:
    base = rec.no_spec_stock.tokens_per_s
    rows = [_option_row(o, base) for o in rec.options if not o.plan.speculative]
    for _, pts in series(rec.options).items():
        rows += [_option_row(o, base) for _, o in pts]
    p = cm.params
    out = [f"Hardware `{cm.hw.name}` ({cm.hw.description}); batch {rec.batch}, context "
           f"{rec.context}; {'fitted' if p.calibrated else 'prior'} parameters "
           "([cost model](../../docs/cost-model.md)).", "", f"**{heading}**", ""]
    out += [f"- {line}" for line in rec.explanation]
    out += ["", "**Caveats**", ""] + [f"- {line}" for line in rec.caveats]
    if plot_name:
        out += ["", f"![tokens/s against draft length]({plot_name})"]
    out += ["", "**All configurations** (buildable; best verifier and backend per draft, k "
            "and placement)", "", md_table(_HEADER, rows), "",
            f"**Step breakdown of the recommendation** ({describe(rec.best.plan)})", "",
            breakdown_markdown(rec.best.estimate)]
    return "\n".join(out)


def markdown_report(out_dir: str | Path, hardware: str = PCIE, drafts: list[str] | None = None,
                    batch: int = 1, context: int = 1024,
                    acceptance: dict[str, Acceptance] | None = None,
                    name: str = "costmodel-plan", title: str | None = None) -> str:
    """Write ``<name>.md`` and ``<name>.png`` under ``out_dir``; return the markdown.

    With the defaults it is the headline's report: the one answer
    (:func:`~.headline.headline_markdown`) and the same choice explained
    (:func:`~.headline.recommendation`), every draft across its band, and the headline
    draft's configurations. Given ``drafts``, ``acceptance`` (draft name -> measured
    acceptance, overriding the cards), another batch, context or box, it is a plan for
    those inputs and says that it is not the headline."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if (hardware, drafts, batch, context, acceptance) == (PCIE, None, 1, 1024, None):
        h = headline()
        rec = recommendation(h)
        png = plot_plan(rec, out_dir / f"{name}.png")
        text = (f"# {title or 'Cost-model plan'}\n\n**What to run** (the same answer as "
                f"README.md and docs/what-to-run.md):\n\n{headline_markdown(h)}\n\n"
                + plan_markdown(h.cm, rec, png.name, heading="Why this configuration")
                + "\n\n" + "\n".join(_drafts_section(h.cm)) + "\n")
        (out_dir / f"{name}.md").write_text(text)
        return text
    cm = CostModel.build(hardware)
    pairs = []
    for dname in drafts or list_profiles("drafts"):
        d = load_draft(dname)
        acc = (acceptance or {}).get(dname) or from_draft_profile(d.acceptance)
        if acc is not None:
            pairs.append((d, acc))
    if not pairs:
        raise ValueError("no draft with an acceptance figure to report on")
    rec = recommend(cm, pairs, batch=batch, context=context)
    png = plot_plan(rec, out_dir / f"{name}.png")
    text = (f"# {title or 'Cost-model plan'}\n\n> A plan for the inputs given (drafts "
            f"{', '.join(d.name for d, _ in pairs)}; batch {batch}, context {context}, "
            f"`{hardware}`), at single acceptance figures: not the answer of "
            "README.md and docs/what-to-run.md, which ranks configurations by evidence.\n\n"
            + plan_markdown(cm, rec, png.name) + "\n")
    (out_dir / f"{name}.md").write_text(text)
    return text


# ---------------------------------------------------------------------------------------------
# docs/what-to-run.md
# ---------------------------------------------------------------------------------------------


def _short(plan) -> str:
    if not plan.speculative:
        return f"no speculation ({plan.backend})"
    return f"k={plan.k} {plan.placement}/{plan.vocab}, {plan.verifier}, {plan.backend}"


def _headline_role(name: str, h) -> str:
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


def _draft_answer(cm: CostModel, h, name: str):
    """(choice, worth measuring) of one draft: the headline's own for its candidates."""
    for n, c, w in h.per_draft:
        if n == name:
            return c, w
    try:
        a = answer(cm, [load_draft(name)])
    except ValueError:
        return None, None
    return a.choice, a.worth_measuring


def _drafts_section(cm: CostModel) -> list[str]:
    h = headline(cm) if cm.hw.name != PCIE else headline()
    rows = []
    for name in list_profiles("drafts"):
        d = load_draft(name)
        c, w = _draft_answer(cm, h, name)
        if c is None:
            rows.append([f"`{name}`", d.raw.get("trained_for", TARGET), "-", "-", "-", "-",
                         "-", "-", "-", "no acceptance published: pass --tau or "
                         "--acceptance-from"])
            continue
        needs = "; ".join(x.short or x.text for x in c.option.requires) or "stock"
        rows.append([f"`{name}`", d.raw.get("trained_for", TARGET)
                     + (" (assumed band)" if c.band.card_is_assumed else ""),
                     _short(c.plan), public_short(c.plan),
                     f"{c.tau['point']:.2f} ({c.tau['low']:.2f}-{c.tau['high']:.2f})",
                     f"{c.tps['point']:.0f} ({interval_text(c)})",
                     f"{c.tps['point'] / h.no_spec_tps:.2f}x", needs,
                     (f"{_short(w.plan)}: {w.tps['point']:.0f} ({interval_text(w)})"
                      if w is not None else "-"), _headline_role(name, h)])
    return ["## Every draft, ranked by evidence", "",
            "Single stream, context 1024. Per draft, the configuration the rule of the answer "
            "picks among that draft's own: tokens/s at its point acceptance (the public field "
            "figure where one exists, else the card shrunk by the mean field/card ratio of Kimi "
            f"drafts), and its interval (the acceptance band's low and high ends, widened by "
            f"the model's out-of-sample error ±{h.error:.1%}). A configuration only modelled "
            "displaces a measured one only when its whole interval clears the measured "
            "one's; otherwise it is listed as worth measuring. The answer competes among the "
            f"drafts trained for {TARGET} with a card figure (a draft trained for another Kimi "
            f"version carries that version's card, which {TARGET} does not reach).", "",
            md_table(["draft", "trained for", "its choice", "evidence", "tau point (band)",
                      "tok/s point (interval)", "x stock", "needs", "worth measuring",
                      "the answer?"], rows), ""]


def _sensitivity_rows(cm: CostModel, h) -> list[list[str]]:
    d = h.draft

    def row(label: str, model: CostModel, batch: int = 1, context: int = 1024) -> list[str]:
        try:
            a = answer(model, [d], batch=batch, context=context, error=h.error)
        except ValueError:
            return [label, "nothing fits in memory", "-", "-", "-"]
        base = model.no_spec(batch=batch, context=context).tokens_per_s
        c = a.choice
        return [label, _short(c.plan), WORDS[c.evidence.level],
                f"{c.tps['point']:.0f} ({interval_text(c)})", f"{c.tps['point'] / base:.2f}x"]

    rows = [row("the answer (batch 1, context 1024)", cm)]
    rows += [row(f"context {c // 1024}k", cm, context=c) for c in (16384, 32768, 131072)]
    rows += [row(f"batch {b} (aggregate tok/s)", cm, batch=b) for b in (4, 16, 64)]
    for name, label in (("rtx-pro-6000-pcie-switch-x8", "a single-CPU PCIe-switch box"),
                        ("rtx-pro-6000-broadcom-dual-x8", "the Broadcom-switch dual-socket box")):
        rows.append(row(f"latency table of {label}", cm.with_latency(load_latency_table(name))))
    rows.append(row("in-situ collective overhead x2", cm.with_params(dataclasses.replace(
        cm.params, collective_overhead_us=2 * cm.params.collective_overhead_us))))
    rows.append(row("uniform independent routing", cm.with_params(dataclasses.replace(
        cm.params, routing_skew=1.0, expert_popularity=0.0))))
    return rows


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
                   + (f"{pct(r.gain(1, 'card'))} at batch 1 ({pct(r.gain(1, 'low'))} to "
                      f"{pct(r.gain(1, 'high'))} across the band), {pct(r.gain(64, 'card'))} "
                      "at batch 64." if r.gain(1, "card") is not None else
                      f"does not apply to `{h.draft.name}`.")
                   + f" Rests on: {r.lever.rests_on}.")
    out += ["", "Upper bounds (no setting reaches them today):", ""]
    for i, r in enumerate(bounds, start=1):
        out.append(f"{i}. **{r.lever.name}**: {pct(r.gain(1, 'card'))} at batch 1 "
                   f"({pct(r.gain(1, 'low'))} to {pct(r.gain(1, 'high'))} across the band), "
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
        "the difference its run records and the mechanism the model lacks. Only "
        "configurations buildable from stock vLLM 0.34.0 plus this project are recommended; "
        "everything else is in the what-if table.", "",
        "## Recommendation: single stream", "",
        headline_markdown(h), "",
    ]
    out += _drafts_section(cm)
    out += ["## Sensitivity of the answer", "",
            f"The answer's draft (`{h.draft.name}`) re-chosen by the same rule under one change "
            "at a time; tok/s at its point acceptance with the interval; 'x stock' compares "
            "with stock vLLM without speculation under the same change.", "",
            md_table(["change", "choice", "evidence", "tok/s point (interval)", "x stock"],
                     _sensitivity_rows(cm, h)), ""]
    out += _levers_section(cm, h)
    out += ["", *verify_cost.crossover_markdown(cm)]
    out += ["", "Reproduce: `vllm-kimi-ext plan --draft " + h.draft.name + "` (the answer, "
            "the table, the evidence, the explanation); `vllm-kimi-ext plan --validate` (the "
            "fit against every public point)."]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# docs
# ---------------------------------------------------------------------------------------------


def _with_generated_block(text: str, name: str, block: str,
                          doc: str = "docs/cost-model.md") -> str:
    begin, end = _markers(name)
    if begin not in text or end not in text:
        raise ValueError(f"{doc} lacks the GENERATED {name} markers")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{block}\n{end}{tail}"


def choosing_answer_markdown() -> str:
    """docs/choosing-a-draft.md's generated block: the answer, as README.md prints it."""
    return ("**Which one to run** (the answer of `vllm-kimi-ext plan`, README.md and "
            "[what-to-run.md](what-to-run.md), generated from the same function; every draft "
            "with its evidence is there):\n\n" + headline_markdown(headline()))


_BLOCKS = {"calibration": calibration_markdown, "sources": sources_markdown,
           "latency": latency_markdown, "anatomy": anatomy_markdown}


def generated_docs(docs_dir: str | Path) -> dict[Path, str]:
    """{path: expected content} for the generated documents under ``docs_dir``."""
    docs_dir = Path(docs_dir)
    cost = docs_dir / "cost-model.md"
    out = {docs_dir / "what-to-run.md": what_to_run_markdown()}
    choosing = docs_dir / "choosing-a-draft.md"
    if choosing.exists():
        out[choosing] = _with_generated_block(choosing.read_text(), "answer",
                                              choosing_answer_markdown(),
                                              "docs/choosing-a-draft.md")
    if cost.exists():
        text = cost.read_text()
        for name in GENERATED_BLOCKS:
            text = _with_generated_block(text, name, _BLOCKS[name]())
        out[cost] = text
    return out


#: Hand-written documents that hold generated blocks: written only when they exist.
HOSTS = ("cost-model.md", "choosing-a-draft.md")


def skipped_docs(docs_dir: str | Path) -> list[Path]:
    """The documents :func:`generated_docs` leaves out because they do not exist."""
    return [Path(docs_dir) / name for name in HOSTS if not (Path(docs_dir) / name).exists()]


def write_images(img_dir: str | Path) -> list[Path]:
    img_dir = Path(img_dir)
    cm = CostModel.build(PCIE)
    h = headline()
    return [
        plot_validation(validate(cm), img_dir / "costmodel-validation.png"),
        plot_latency([load_latency_table(n) for n in list_profiles("latency")],
                     img_dir / "costmodel-latency.png"),
        plot_levers(whatif.lever_table(cm, h.draft, h.choice.band),
                    img_dir / "costmodel-levers.png"),
    ]


def write_docs(docs_dir: str | Path, images: bool = True) -> list[Path]:
    written = []
    for path, text in generated_docs(docs_dir).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    if images:
        written += write_images(Path(docs_dir) / IMG)
    return written


def stale_docs(docs_dir: str | Path) -> list[Path]:
    return [p for p, text in generated_docs(docs_dir).items()
            if not p.exists() or p.read_text() != text]


PROG = "python -m vllm_kimi_ext.costmodel.report"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                 epilog=EXIT_CODES_HELP)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write-docs", type=Path, metavar="DIR",
                   help="regenerate what-to-run.md, the generated blocks of cost-model.md "
                        "and their PNGs (DIR/img)")
    g.add_argument("--check-docs", type=Path, metavar="DIR",
                   help="exit 1 if the generated documents under DIR are stale")
    g.add_argument("--report", type=Path, metavar="DIR",
                   help="write a plan report (markdown + PNG) into DIR")
    ap.add_argument("--hardware", default=PCIE, help=f"hardware profile (default {PCIE})")
    ap.add_argument("--draft", action="append", default=None,
                    help="draft profile for --report (repeat; default: the headline's report)")
    ap.add_argument("--batch", type=bounded_int(1, 4096, what="a batch size"), default=1)
    ap.add_argument("--context", type=bounded_int(0, 1 << 20, what="a context length"),
                    default=1024)
    ap.add_argument("--debug", action="store_true", help="on an error, print the traceback too")

    def one_line_error(message: str):  # argparse's usage dump would bury the reason
        print(f"{PROG}: error: {one_line(message)}", file=sys.stderr)
        sys.exit(EXIT_USAGE)

    ap.error = one_line_error
    return ap


def _directory(flag: str, path: Path, must_exist: bool) -> None:
    """A directory argument: refused when it is a file, lies under a file, or (to check)
    does not exist."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path}: is a file, not a directory")
    if must_exist and not path.is_dir():
        raise UsageError(f"{flag} {path}: no such directory")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{flag} {path}: {parent} is a file, not a directory")
            break


def _run(args: argparse.Namespace) -> int:
    if args.write_docs:
        _directory("--write-docs", args.write_docs, must_exist=False)
        for p in write_docs(args.write_docs):
            print(f"wrote {p}")
        for p in skipped_docs(args.write_docs):
            print(f"skipped: {p} does not exist (its generated blocks live inside a "
                  "hand-written document; copy it from the repository's docs/ first)",
                  file=sys.stderr)
        return EXIT_OK
    if args.check_docs:
        _directory("--check-docs", args.check_docs, must_exist=True)
        stale = stale_docs(args.check_docs)
        for p in stale:
            print(f"stale: {p} (run {PROG} --write-docs {args.check_docs})", file=sys.stderr)
        return EXIT_FINDINGS if stale else EXIT_OK
    _directory("--report", args.report, must_exist=False)
    load_hardware(args.hardware)  # an unknown name or a bad file: one line, exit 2
    if args.draft:
        for name in args.draft:
            d = load_draft(name)  # an unknown name or a bad file: one line, exit 2
            if from_draft_profile(d.acceptance) is None:
                raise UsageError(f"--draft {name}: publishes no acceptance figure to report on")
    try:
        markdown_report(args.report, args.hardware, args.draft, args.batch, args.context)
    except ValueError as exc:  # nothing fits in memory at this batch and context
        if isinstance(exc, UserInputError):
            raise
        raise UsageError(f"--batch {args.batch} --context {args.context}: {exc}") from None
    print(f"wrote {args.report}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """The command line, under the package's exit-code contract (0 clean, 1 stale documents,
    2 usage or unreadable input: one line on stderr, never a traceback unless --debug)."""
    from vllm_kimi_ext.cli import run_handler

    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a refusal already printed (2)
        return EXIT_OK if exc.code in (None, 0) else EXIT_USAGE
    args.func, args._prog = _run, PROG
    return run_handler(args)


if __name__ == "__main__":
    sys.exit(main())
