"""The generated blocks of ``docs/cost-model.md``: parameters and validation, sources, latency
tables, anatomy of a step (between its ``GENERATED`` markers; :mod:`.report` writes them).
Everything here is deterministic: no dates, no machine names."""

from __future__ import annotations

import functools

from vllm_kimi_ext.costmodel import whatif
from vllm_kimi_ext.costmodel.calibration import (
    ERROR_BOUND,
    SPLITS,
    mean_abs,
    validate,
)
from vllm_kimi_ext.costmodel.catalog import list_profiles, load_draft
from vllm_kimi_ext.costmodel.latency import load_latency_table
from vllm_kimi_ext.costmodel.markdown import md_table, pct
from vllm_kimi_ext.costmodel.model import CostModel, StepEstimate
from vllm_kimi_ext.costmodel.options import fmt_bytes
from vllm_kimi_ext.costmodel.params import BOUNDS, FITTED

PCIE = "rtx-pro-6000-pcie-x8"
GENERATED_BLOCKS = ("calibration", "sources", "latency", "anatomy")
IMG = "img"
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



def generated_markers(block: str) -> tuple[str, str]:
    return (f"<!-- BEGIN GENERATED: {block} (python -m vllm_kimi_ext.costmodel.report "
            f"--write-docs docs/) -->", f"<!-- END GENERATED: {block} -->")



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
                lifted = ("; lifted: " + ", ".join(fmt_bytes(x) for x, _, _ in c.lifted)
                    if c.lifted else "")
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



BLOCKS = {"calibration": calibration_markdown, "sources": sources_markdown,
          "latency": latency_markdown, "anatomy": anatomy_markdown}
