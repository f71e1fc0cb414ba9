"""Plain-text tables of ``vllm-kimi-ext plan``: options and validation (the answer's own table
is :func:`~.answer_text.format_answer`)."""

from __future__ import annotations

from vllm_kimi_ext.costmodel.calibration import ERROR_BOUND, mean_abs
from vllm_kimi_ext.costmodel.options import fmt_bytes
from vllm_kimi_ext.costmodel.plot import series


def format_table(rec, show_all: bool = False) -> str:
    base = {o.plan.backend: o for o in rec.options if not o.plan.speculative}
    head = (f"{'draft':22s} {'k':>2s} {'placement':16s} {'verifier':8s} {'backend':15s} "
            f"{'tau':>5s} {'tok/s':>7s} {'x no-spec':>9s} {'coll/tok':>8s} {'comm/tok':>9s} "
            f"{'HBM/tok':>8s}")
    lines = [head, "-" * len(head)]

    def row(o, name, k, placement):
        e = o.estimate
        mark = " *" if o is rec.best else ""
        sp = e.tokens_per_s / base[o.plan.backend].tokens_per_s
        return (f"{name:22s} {k:>2d} {placement:16s} "
                f"{(o.plan.verifier if o.plan.speculative else '-'):8s} {o.plan.backend:15s} "
                f"{e.tau:5.2f} {e.tokens_per_s:7.1f} {sp:8.2f}x {e.collectives_per_token:8.1f} "
                f"{fmt_bytes(e.comm_bytes_per_token):>9s} {fmt_bytes(e.hbm_bytes_per_token):>8s}"
                f"{mark}")

    for o in sorted(base.values(), key=lambda o: -o.tokens_per_s):
        lines.append(row(o, "(no speculation)", 0, "-"))
    if show_all:
        spec = sorted((o for o in rec.options if o.plan.speculative),
                      key=lambda o: (o.plan.draft.name, o.plan.k, o.plan.placement,
                                     o.plan.vocab, -o.tokens_per_s))
        for o in spec:
            lines.append(row(o, o.plan.draft.name, o.plan.k, f"{o.plan.placement}/{o.plan.vocab}"))
    else:
        b = rec.best.plan
        for (draft, placement, vocab), pts in series(rec.options).items():
            for k, o in pts:
                # the recommended option stands in for its row so the marker shows
                if (b.speculative and b.draft.name == draft and b.k == k
                        and b.placement == placement and b.vocab == vocab):
                    o = rec.best
                lines.append(row(o, draft, k, f"{placement}/{vocab}"))
    lines.append("  * recommended (buildable from stock vLLM 0.34.0 plus this project). x no-spec: "
                 "against no speculation on the same all-reduce backend. comm/tok: collective "
                 "payload per output token; HBM/tok: bytes each GPU streams per output token.")
    return "\n".join(lines)


def format_validation(rep) -> str:
    """Every point: measured, predicted, error; then the summary and the named mechanisms."""
    head = f"{'split':5s} {'point':34s} {'measured':>9s} {'predicted':>9s} {'error':>7s}  source"
    lines = [f"{rep.hardware}: cost model against public measurements (tokens/s)", head,
             "-" * len(head)]
    for r in rep.rows:
        flag = "" if r.within_bound else " !"
        lines.append(f"{r.point.split[:5]:5s} {r.point.id:34s} {r.point.tokens_per_s:9.1f} "
                     f"{r.predicted:9.1f} {r.error:+7.1%}  {r.point.source_id}{flag}")
    for group, rows in rep.groups().items():
        lines.append(f"{group}: {len(rows)} points, mean |error| {mean_abs(rows):.1%}, "
                     f"largest {max((abs(r.error) for r in rows), default=0.0):.1%}")
    runs: dict[str, str] = {}
    for r in rep.misses:
        why_not = rep.why_unexplained(r)
        p = r.point
        runs.setdefault(p.run, f"UNEXPLAINED ({why_not}): {p.model_lacks}" if why_not else
                        f"{p.difference} ({p.recorded(p.difference)}): {p.model_lacks}")
    if runs:
        lines.append(f"! beyond {ERROR_BOUND:.0%}; the recorded difference and the mechanism the "
                     "model lacks:")
        lines += [f"  {run}: {why}" for run, why in runs.items()]
    return "\n".join(lines)
