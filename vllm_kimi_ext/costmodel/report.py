"""Markdown reports from the cost model, and the generated documentation.

* :func:`markdown_report` - a plan report (tables + PNG) for one box and set of drafts; the
  bench session uses it to put the model's prediction beside its measurements.
* :func:`what_to_run_markdown` - the README section "What to run on 8x PCIe", written to
  ``docs/what-to-run.md``.
* :func:`anatomy_markdown` and :func:`calibration_markdown` - the tables written between the
  ``GENERATED`` markers of ``docs/cost-model.md``.

``python -m vllm_kimi_ext.costmodel.report --write-docs docs/`` regenerates both documents;
``--check-docs docs/`` exits 1 when the committed ones are stale (a unit test does the same).
Everything here is deterministic: no dates, no machine names.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from vllm_kimi_ext.costmodel.acceptance import Acceptance, from_draft_profile
from vllm_kimi_ext.costmodel.calibration import (
    DEFAULT_HYPOTHESIS,
    HYPOTHESES,
    IN_SAMPLE_BOUND,
    LEAVE_ONE_OUT_BOUND,
    calibrate,
    hypothesis_report,
)
from vllm_kimi_ext.costmodel.catalog import DraftProfile, list_profiles, load_draft
from vllm_kimi_ext.costmodel.model import CostModel, Plan, StepEstimate
from vllm_kimi_ext.costmodel.recommend import (
    Recommendation,
    _fmt_bytes,
    describe,
    recommend,
)

PCIE = "rtx-pro-6000-pcie-x8"
NVLINK = "h200-nvlink-x8"
HEADLINE_DRAFT = "lightseek-eagle3"
GENERATED_BLOCKS = ("anatomy", "calibration")


def _markers(block: str) -> tuple[str, str]:
    return (f"<!-- BEGIN GENERATED: {block} (python -m vllm_kimi_ext.costmodel.report "
            f"--write-docs docs/) -->", f"<!-- END GENERATED: {block} -->")


def drafts_with_acceptance(names: list[str] | None = None,
                           dataset: str | None = None) -> list[tuple[DraftProfile, Acceptance]]:
    """Drafts paired with their reported acceptance (drafts without one are skipped)."""
    out = []
    for name in names or list_profiles("drafts"):
        d = load_draft(name)
        ds = dataset if dataset in d.datasets() else None
        acc = from_draft_profile(d.acceptance, ds)
        if acc is not None:
            out.append((d, acc))
    return out


def _numeric(cell: str) -> bool:
    c = cell.strip("*` ")
    return bool(c) and (c[0].isdigit() or (c[0] in "+-" and len(c) > 1 and c[1].isdigit())
                        or c == "-")


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table; columns whose cells are all numbers are right-aligned."""
    align = ["---:" if rows and all(_numeric(r[i]) for r in rows) else "---"
             for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _pct(x: float) -> str:
    return "0.0%" if abs(x) < 5e-4 else f"{x:+.1%}"


# ---------------------------------------------------------------------------------------------
# Anatomy of a step
# ---------------------------------------------------------------------------------------------


def anatomy_markdown(hardware: str = PCIE) -> str:
    """Per-GPU bytes of one target pass, distinct experts, and a no-speculation step."""
    cm = CostModel.build(hardware)
    m = cm.model
    w1 = cm.target_weight_bytes(1)
    rep, shd = m.mla_params()
    notes = {
        "attention": f"61 x ({rep / 1e6:.1f}M replicated fused_qkv_a + {shd / 1e6:.1f}M / TP) "
                     f"bf16; replicated part {m.num_layers * rep * m.dtype_bytes / 1e9:.2f} GB",
        "dense_mlp": "1 dense layer, 3 x 7168 x 18432 / TP, bf16",
        "router": "60 x 7168 x 384 bf16, replicated on every rank",
        "shared_experts": "60 x 3 x 7168 x 2048 / TP, bf16",
        "routed_experts": f"60 x E[distinct]=8 x {m.expert_params() / 1e6:.1f}M / TP at "
                          f"{m.routed_expert_bits_per_weight:g} bits",
        "lm_head": "163840 x 7168 / TP, bf16",
    }
    rows = [[k, f"{v / 1e9:.3f}", notes[k]] for k, v in w1.items()]
    rows.append(["**total**", f"**{sum(w1.values()) / 1e9:.3f}**",
                 f"+ {cm.kv_bytes_per_token() / 1e3:.1f} KB of MLA latent per context token"])
    out = [
        "Weight bytes each GPU streams in one target pass over one token (TP=8):",
        "",
        _md_table(["part", "GB per GPU", "how"], rows),
        "",
        f"All weights {m.total_params() / 1e12:.3f}T parameters, {m.active_params() / 1e9:.1f}B "
        f"active per token; resident per GPU {cm.target_memory_bytes() / 1e9:.1f} GB.",
        "",
        "Expected distinct routed experts per MoE layer for n tokens in one pass "
        "(uniform routing, and with skew 4) and the routed-expert bytes per GPU:",
        "",
    ]
    rows = []
    for n in (1, 2, 4, 8, 16, 32, 64):
        e1 = m.expected_distinct_experts(n)
        e4 = m.expected_distinct_experts(n, skew=4.0)
        gb = cm.target_weight_bytes(n)["routed_experts"] / 1e9
        rows.append([str(n), f"{e1:.1f}", f"{e4:.1f}", f"{gb:.2f}"])
    out += [_md_table(["n = B(k+1)", "E[distinct], uniform", "skew 4", "routed GB/GPU, uniform"],
                      rows), "",
            "One no-speculation step at batch 1 (calibrated, NCCL):", "",
            breakdown_markdown(cm.no_spec(backend="nccl"))]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------------------------


def calibration_markdown(hardware: str = PCIE) -> str:
    base = CostModel.build(hardware, params="prior")
    res = calibrate(base, DEFAULT_HYPOTHESIS)
    p = res.params
    rows = []
    for r in res.rows:
        unit, fmt = ("tok/s", ".1f") if r.quantity == "step_time" else ("ms", ".2f")
        rows.append([
            r.label, f"{r.observed:{fmt}} {unit}", f"{r.fitted:{fmt}}", _pct(r.error),
            "-" if r.loo is None else f"{r.loo:{fmt}}",
            "-" if r.loo_error is None else _pct(r.loo_error),
        ])
    out = [
        f"Fitted on `{hardware}` (hypothesis `{DEFAULT_HYPOTHESIS}`: "
        f"{HYPOTHESES[DEFAULT_HYPOTHESIS]}):",
        "",
        f"- bandwidth fraction eta = **{p.bandwidth_efficiency:.3f}** "
        f"(achieved {base.hw.memory_bandwidth_GBps * p.bandwidth_efficiency / 1e3:.2f} TB/s "
        f"of {base.hw.memory_bandwidth_GBps / 1e3:.2f} TB/s)",
        f"- in-situ overhead per collective delta = **{p.collective_overhead_us:.1f} us** "
        "(added to the latency table)",
        "",
        _md_table(["observable", "published", "model (fit on all)", "error",
                   "leave-one-figure-out", "LOO error"], rows),
        "",
        f"Largest in-sample error {res.max_in_sample_error:.1%} (bound "
        f"{IN_SAMPLE_BOUND:.0%}); largest leave-one-out error on a tokens/s figure "
        f"{max(abs(r.loo_error) for r in res.rows if r.quantity == 'step_time'):.1%} (bound "
        f"{LEAVE_ONE_OUT_BOUND:.0%}). The all-reduce time cannot be predicted without the "
        "figure that measured it: without the profile's share, eta and delta are not "
        "separately identifiable (both add a constant to every batch-1 step), so that "
        "leave-one-out fit keeps delta at its prior (0).",
        "",
        "Leave-one-figure-out parameters:",
        "",
        _md_table(["left out", "eta", "delta (us)"],
                  [[fid, f"{q.bandwidth_efficiency:.3f}", f"{q.collective_overhead_us:.1f}"]
                   for fid, q in sorted(res.loo_params.items())]),
        "",
        "The two statements of the profiled all-reduce time:",
        "",
    ]
    hyp_rows = []
    for h in hypothesis_report(base):
        hyp_rows.append([
            f"`{h['hypothesis']}`", f"{h['allreduce_ms']:.2f}", f"{h['rest_of_step_ms']:.2f}",
            f"{h['weight_stream_floor_ms']:.2f}",
            f"{h['implied_bandwidth_TBps_if_rest_were_only_streaming']:.2f}",
            f"{h['implied_per_call_us']:.1f}", f"{h['implied_in_situ_overhead_us']:.1f}",
            "yes" if h["physically_possible"] else "**no**",
        ])
    out.append(_md_table(
        ["reading", "all-reduce ms", "rest of step ms", "weight+KV stream at 100% BW, ms",
         "bandwidth the rest implies, TB/s", "us per call", "us over table", "possible"],
        hyp_rows))
    alt = calibrate(base, "per_call")
    out += [
        "",
        f"Fitting the `per_call` reading instead pins eta at its bound "
        f"({alt.params.bandwidth_efficiency:.2f}) and still misses: largest in-sample error "
        f"{alt.max_in_sample_error:.1%} "
        f"({', '.join(f'{r.label}: {_pct(r.error)}' for r in alt.rows)}).",
    ]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Plan reports
# ---------------------------------------------------------------------------------------------


def _option_row(o, base_tps: float) -> list[str]:
    e = o.estimate
    p = o.plan
    return [
        p.draft.name if p.speculative else "(no speculation)",
        str(p.k),
        f"{p.placement}/{p.vocab}" if p.speculative else "-",
        p.verifier if p.speculative else "-",
        p.backend,
        f"{e.tau:.2f}",
        f"{e.tokens_per_s:.1f}",
        f"{e.tokens_per_s / base_tps:.2f}x",
        f"{e.collectives_per_token:.1f}",
        _fmt_bytes(e.comm_bytes_per_token),
        _fmt_bytes(e.hbm_bytes_per_token),
    ]


_HEADER = ["draft", "k", "placement", "verifier", "backend", "tau", "tok/s",
           "x stock no-spec", "collectives/token", "comm bytes/token", "HBM bytes/token"]


def breakdown_markdown(e: StepEstimate) -> str:
    rows = []
    for t in e.terms:
        rows.append([t.phase, t.name, f"{t.time_s * 1e3:.3f}",
                     _fmt_bytes(t.hbm_bytes) if t.hbm_bytes else "-",
                     str(t.collectives) if t.collectives else "-",
                     _fmt_bytes(t.comm_bytes) if t.comm_bytes else "-"])
    rows.append(["", "**step**", f"**{e.step_s * 1e3:.3f}**", _fmt_bytes(e.total("hbm_bytes")),
                 str(e.collectives_per_step), _fmt_bytes(e.total("comm_bytes"))])
    return _md_table(["phase", "term", "ms", "HBM bytes/GPU", "collectives", "comm bytes"], rows)


def plan_markdown(cm: CostModel, rec: Recommendation, plot_name: str | None = None) -> str:
    from vllm_kimi_ext.costmodel.plot import series

    base = rec.no_spec_stock.tokens_per_s
    rows = [_option_row(o, base) for o in rec.options if not o.plan.speculative]
    for _, pts in series(rec.options).items():
        rows += [_option_row(o, base) for _, o in pts]
    p = cm.params
    out = [
        f"Hardware `{cm.hw.name}` ({cm.hw.description}); batch {rec.batch}, context "
        f"{rec.context}; eta {p.bandwidth_efficiency:.3f}, delta "
        f"{p.collective_overhead_us:.1f} us ({'calibrated' if p.calibrated else 'priors'}).",
        "",
        "**Recommendation**",
        "",
    ]
    out += [f"- {line}" for line in rec.explanation]
    out += ["", "**Caveats**", ""] + [f"- {line}" for line in rec.caveats]
    if plot_name:
        out += ["", f"![tokens/s against draft length]({plot_name})"]
    out += ["", "**All configurations** (best verifier and backend per draft, k and placement)",
            "", _md_table(_HEADER, rows), "",
            f"**Step breakdown of the recommendation** ({describe(rec.best.plan)})", "",
            breakdown_markdown(rec.best.estimate)]
    return "\n".join(out)


def markdown_report(
    out_dir: str | Path,
    hardware: str = PCIE,
    drafts: list[str] | None = None,
    batch: int = 1,
    context: int = 1024,
    acceptance: dict[str, Acceptance] | None = None,
    name: str = "costmodel-plan",
    title: str | None = None,
) -> str:
    """Write ``<name>.md`` and ``<name>.png`` under ``out_dir``; return the markdown.

    ``acceptance`` maps draft names to measured acceptance (e.g. from a bench run) and
    overrides the drafts' reported figures; drafts with neither are skipped.
    """
    from vllm_kimi_ext.costmodel.plot import plot_plan

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
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
    text = f"# {title or 'Cost-model plan'}\n\n" + plan_markdown(cm, rec, png.name) + "\n"
    (out_dir / f"{name}.md").write_text(text)
    return text


# ---------------------------------------------------------------------------------------------
# docs/what-to-run.md
# ---------------------------------------------------------------------------------------------


def _spec_config(plan: Plan) -> str:
    method = {"eagle3": "eagle3", "eagle3_mla": "eagle3", "mtp": "mtp",
              "dflash": "dflash"}[plan.draft.kind]
    return (f'{{"method": "{method}", "model": "{plan.draft.checkpoint}", '
            f'"num_speculative_tokens": {plan.k}}}')


def what_to_run_markdown() -> str:
    cm = CostModel.build(PCIE)
    cal = calibrate(CostModel.build(PCIE, params="prior"))
    figures = ", ".join(f"{f.tokens_per_s:g}" for f in cm.hw.published)
    pairs = drafts_with_acceptance()
    headline = [(d, a) for d, a in pairs if d.name == HEADLINE_DRAFT]
    rec = recommend(cm, headline, batch=1, context=1024)
    best, stock = rec.best, rec.best_stock
    placement = ("sharded over the 8 GPUs like the target" if best.plan.placement == "tp8"
                 else "replicated on every GPU")
    verifier = ("stock full-logits all-gather" if best.plan.verifier == "gather"
                else "vocabulary-sharded")
    out = [
        "# What to run on 8x PCIe",
        "",
        "<!-- Generated by `python -m vllm_kimi_ext.costmodel.report --write-docs docs/`; "
        "do not edit by hand. -->",
        "",
        "> **This is a model until the real box confirms it.** Every number below comes from "
        "the decode cost model in `vllm_kimi_ext/costmodel` (see [cost-model.md]"
        f"(cost-model.md)), calibrated on {len(cm.hw.published)} published no-speculation "
        f"figures for 8x RTX PRO 6000 Blackwell ({figures} tok/s, fitted within "
        f"{cal.max_in_sample_error:.0%}), a latency table synthesised from public "
        "measurements, and the drafts' self-reported acceptance. Nothing here has been "
        "measured on the target hardware with speculation; replace it with bench results as "
        "soon as they exist. Options using the one-shot all-reduce inherit the model's "
        f"{_pct(_row(cal, 'custom_oneshot').error)} error on the one figure measured with "
        "such a kernel.",
        "",
        f"## Recommendation: {HEADLINE_DRAFT}, single stream",
        "",
        f"- **Draft** `{best.plan.draft.checkpoint}` with **k = {best.plan.k}** "
        f"(`num_speculative_tokens`), draft **{best.plan.placement}** ({placement}), "
        f"**{best.plan.vocab}** vocabulary.",
        f"- **Verifier**: {verifier}; **all-reduce**: `{best.plan.backend}`.",
        f"- Expected **{best.estimate.tokens_per_s:.0f} tok/s** per request "
        f"(tau {best.estimate.tau:.2f} tokens per step, {best.estimate.step_s * 1e3:.1f} ms per "
        f"step) vs **{rec.no_spec_stock.tokens_per_s:.0f} tok/s** for stock vLLM without "
        f"speculation: **{rec.speedup_vs_stock:.2f}x**.",
        f"- With stock vLLM 0.34 only: {describe(stock.plan)} -> "
        f"**{stock.estimate.tokens_per_s:.0f} tok/s** "
        f"({stock.estimate.tokens_per_s / rec.no_spec_stock.tokens_per_s:.2f}x):",
        "",
        "```bash",
    ]
    env = []
    if stock.plan.backend == "flashinfer_pcie_ipc":
        env.append("VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1 ")
    out += [
        f"{''.join(env)}vllm serve <Kimi-K2.5 checkpoint> --tensor-parallel-size 8 \\",
        f"  --speculative-config '{_spec_config(stock.plan)}'",
        "```",
        "",
        "Why (one change at a time from the recommendation):",
        "",
    ]
    out += [f"- {line}" for line in rec.explanation[1:]]
    out += ["", "## Every draft with a published acceptance figure", "",
            "Single stream, context 1024, each draft's reported acceptance (default dataset).",
            ""]
    rows = []
    for d, a in pairs:
        r = recommend(cm, [(d, a)], batch=1, context=1024)
        b, s = r.best, r.best_stock
        spec_ok = b.plan.speculative
        rows.append([
            f"`{d.name}`", a.source.split(":")[0],
            f"{b.plan.k}" if spec_ok else "0",
            f"{b.plan.placement}/{b.plan.vocab}" if spec_ok else "-",
            b.plan.verifier if spec_ok else "-", b.plan.backend,
            f"{b.estimate.tau:.2f}", f"{b.estimate.tokens_per_s:.0f}",
            f"{r.speedup_vs_stock:.2f}x",
            f"{s.estimate.tokens_per_s:.0f} ({_short(s.plan)})",
        ])
    out.append(_md_table(["draft", "acceptance from", "k", "placement", "verifier",
                          "all-reduce", "tau", "tok/s", "x stock no-spec",
                          "stock vLLM only"], rows))
    out += ["", "## Sensitivity of the headline", ""]
    rows = []
    hd = headline[0][0]
    for ds in hd.datasets():
        acc = from_draft_profile(hd.acceptance, ds)
        r = recommend(cm, [(hd, acc)])
        rows.append([f"acceptance from {ds}", _short(r.best.plan, acc),
                     f"{r.best.estimate.tokens_per_s:.0f}", f"{r.speedup_vs_stock:.2f}x"])
    for batch in (4, 16):
        r = recommend(cm, headline, batch=batch)
        rows.append([f"batch {batch} (aggregate tok/s)", _short(r.best.plan),
                     f"{r.best.estimate.tokens_per_s:.0f}", f"{r.speedup_vs_stock:.2f}x"])
    r = recommend(cm, headline, context=32768)
    rows.append(["context 32768", _short(r.best.plan), f"{r.best.estimate.tokens_per_s:.0f}",
                 f"{r.speedup_vs_stock:.2f}x"])
    skewed = cm.with_model(dataclasses.replace(cm.model, routing_skew=4.0))
    r = recommend(skewed, headline)
    rows.append(["correlated routing (skew 4)", _short(r.best.plan),
                 f"{r.best.estimate.tokens_per_s:.0f}", f"{r.speedup_vs_stock:.2f}x"])
    slow = cm.with_latency(cm.latency.scaled(2.0))
    r = recommend(slow, headline)
    rows.append(["collective latencies x2", _short(r.best.plan),
                 f"{r.best.estimate.tokens_per_s:.0f}", f"{r.speedup_vs_stock:.2f}x"])
    r = recommend(cm, headline, backends=["nccl"])
    rows.append(["NCCL only", _short(r.best.plan), f"{r.best.estimate.tokens_per_s:.0f}",
                 f"{r.speedup_vs_stock:.2f}x"])
    nv = CostModel.build(NVLINK)
    r = recommend(nv, headline)
    rows.append([f"`{NVLINK}` (uncalibrated priors)", _short(r.best.plan),
                 f"{r.best.estimate.tokens_per_s:.0f}", f"{r.speedup_vs_stock:.2f}x"])
    out.append(_md_table(["scenario", "recommended", "tok/s", "x stock no-spec"], rows))
    out += ["", "Each row changes one thing from the headline; \"x stock no-spec\" compares with "
            "stock vLLM without speculation (NCCL) under the same scenario."]
    out += [
        "",
        "## What would change the answer",
        "",
        "- **The latency table** is synthesised from public anchors, not measured on this box; "
        "the project's collective benchmark should replace it "
        "(`vllm_kimi_ext/costmodel/profiles/latency/`).",
        "- **Acceptance beyond the measured draft length** is extrapolated with a constant "
        "per-position rate; measure per-position acceptance with vLLM and pass it with "
        "`vllm-kimi-ext plan --acceptance r1,r2,...`.",
        "- **Expert routing** is taken as uniform and independent (the pessimistic case for "
        "speculation on a MoE target); a measured skew goes in the model profile.",
        "- **Reduced-vocabulary rows** assume 97 % coverage of the target's tokens by a 32K head.",
        "",
        "Reproduce: `vllm-kimi-ext plan --hardware rtx-pro-6000-pcie-x8 --draft "
        f"{HEADLINE_DRAFT} --out plan.png`.",
    ]
    return "\n".join(out) + "\n"


def _row(cal, backend: str):
    return next(r for r in cal.rows if r.quantity == "step_time" and backend in r.label)


def _short(plan: Plan, acc: Acceptance | None = None) -> str:
    if not plan.speculative:
        return f"no speculation ({plan.backend})"
    text = f"k={plan.k} {plan.placement}/{plan.vocab}, {plan.verifier}, {plan.backend}"
    if acc is not None and plan.k > acc.measured_positions:
        text += f" (acceptance extrapolated beyond k={acc.measured_positions})"
    return text


# ---------------------------------------------------------------------------------------------
# docs
# ---------------------------------------------------------------------------------------------


def _with_generated_block(text: str, name: str, block: str) -> str:
    begin, end = _markers(name)
    if begin not in text or end not in text:
        raise ValueError(f"docs/cost-model.md lacks the GENERATED {name} markers")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{block}\n{end}{tail}"


def generated_docs(docs_dir: str | Path) -> dict[Path, str]:
    """{path: expected content} for the generated documents under ``docs_dir``."""
    docs_dir = Path(docs_dir)
    cost = docs_dir / "cost-model.md"
    out = {docs_dir / "what-to-run.md": what_to_run_markdown()}
    if cost.exists():
        text = cost.read_text()
        text = _with_generated_block(text, "anatomy", anatomy_markdown())
        text = _with_generated_block(text, "calibration", calibration_markdown())
        out[cost] = text
    return out


def write_docs(docs_dir: str | Path) -> list[Path]:
    written = []
    for path, text in generated_docs(docs_dir).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    return written


def stale_docs(docs_dir: str | Path) -> list[Path]:
    return [p for p, text in generated_docs(docs_dir).items()
            if not p.exists() or p.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vllm_kimi_ext.costmodel.report",
                                 description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write-docs", type=Path, metavar="DIR",
                   help="regenerate what-to-run.md and the calibration block of cost-model.md")
    g.add_argument("--check-docs", type=Path, metavar="DIR",
                   help="exit 1 if the generated documents under DIR are stale")
    g.add_argument("--report", type=Path, metavar="DIR",
                   help="write a plan report (markdown + PNG) into DIR")
    ap.add_argument("--hardware", default=PCIE)
    ap.add_argument("--draft", action="append", default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=1024)
    args = ap.parse_args(argv)
    if args.write_docs:
        for p in write_docs(args.write_docs):
            print(f"wrote {p}")
        return 0
    if args.check_docs:
        stale = stale_docs(args.check_docs)
        for p in stale:
            print(f"stale: {p} (run python -m vllm_kimi_ext.costmodel.report --write-docs "
                  f"{args.check_docs})", file=sys.stderr)
        return 1 if stale else 0
    markdown_report(args.report, args.hardware, args.draft, args.batch, args.context)
    print(f"wrote {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
