"""PNG plot of a plan: tokens/s against draft length, one line per draft and placement.

matplotlib is imported inside :func:`plot_plan` (Agg backend) so that importing the cost
model, or building the command-line parser, never needs it.
"""

from __future__ import annotations

from pathlib import Path

from vllm_kimi_ext.costmodel.recommend import Option, Recommendation

_STYLES = {("tp8", "full"): "-", ("tp8", "reduced"): "--", ("tp1", "full"): ":",
           ("tp1", "reduced"): "-."}


def series(options: tuple[Option, ...] | list[Option]) -> dict[tuple[str, str, str], list]:
    """{(draft, placement, vocab): [(k, best option at that k), ...]} over verifier/backend."""
    out: dict[tuple[str, str, str], dict[int, Option]] = {}
    for o in options:
        p = o.plan
        if not p.speculative:
            continue
        key = (p.draft.name, p.placement, p.vocab)
        cur = out.setdefault(key, {}).get(p.k)
        if cur is None or o.tokens_per_s > cur.tokens_per_s:
            out[key][p.k] = o
    return {k: sorted(v.items()) for k, v in sorted(out.items())}


def plot_plan(rec: Recommendation, path: str | Path, title: str | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, ax = plt.subplots(figsize=(8.5, 5.2), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drafts = sorted({key[0] for key in series(rec.options)})
    for (draft, placement, vocab), pts in series(rec.options).items():
        idx = drafts.index(draft) if len(drafts) > 1 else list(_STYLES).index((placement, vocab))
        color = colors[idx % len(colors)]
        ax.plot([k for k, _ in pts], [o.tokens_per_s for _, o in pts],
                _STYLES[(placement, vocab)], marker="o", ms=3.5, color=color,
                label=f"{draft} {placement}/{vocab}")
    ax.axhline(rec.no_spec_stock.tokens_per_s, color="black", lw=1.2,
               label=f"no speculation, nccl ({rec.no_spec_stock.tokens_per_s:.0f})")
    if rec.no_spec_best.plan.backend != rec.no_spec_stock.plan.backend:
        ax.axhline(rec.no_spec_best.tokens_per_s, color="gray", lw=1.2, ls="--",
                   label=f"no speculation, {rec.no_spec_best.plan.backend} "
                         f"({rec.no_spec_best.tokens_per_s:.0f})")
    b = rec.best
    if b.plan.speculative:
        ax.plot([b.plan.k], [b.tokens_per_s], marker="*", ms=16, color="crimson",
                ls="none", label=f"recommended ({b.tokens_per_s:.0f})")
    ax.set_xlabel("draft tokens per step (k)")
    ax.set_ylabel("tokens/s" + (" per request" if rec.batch == 1 else
                                f" aggregate (batch {rec.batch})"))
    ax.set_xticks(range(1, 8))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.set_title(title or f"{rec.hardware}, batch {rec.batch}, context {rec.context} "
                          f"(model estimate; best verifier/backend per point)", fontsize=9)
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
