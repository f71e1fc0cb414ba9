"""PNG plots of the cost model: a plan, the validation, the latency tables, the levers.

Readability rules: legends sit outside the axes (never over a curve); bars only on a
linear axis that includes zero; output is deterministic (no timestamps in the PNG).
matplotlib is imported inside the functions (Agg backend), so importing the cost model or
building the command-line parser never needs it.
"""

from __future__ import annotations

from pathlib import Path

from vllm_kimi_ext.costmodel.options import Option, Recommendation

_STYLES = {("tp8", "full"): "-", ("tp8", "reduced"): "--", ("tp1", "full"): ":",
           ("tp1", "reduced"): "-.", ("tp8-repemb", "full"): (0, (5, 1)),
           ("tp8-repemb", "reduced"): (0, (3, 1, 1, 1))}
FORMATS = ("png", "svg", "pdf")


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise ValueError(f"{path}: plot format must be one of {', '.join(FORMATS)} "
                         "(the file name's suffix)")
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"Software": None} if fmt == "png" else None
    fig.savefig(path, format=fmt, metadata=meta, bbox_inches="tight")
    _plt().close(fig)
    return path


def _legend_right(ax) -> None:
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


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
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drafts = sorted({key[0] for key in series(rec.options)})
    for (draft, placement, vocab), pts in series(rec.options).items():
        color = colors[drafts.index(draft) % len(colors)]
        ax.plot([k for k, _ in pts], [o.tokens_per_s for _, o in pts],
                linestyle=_STYLES[(placement, vocab)], marker="o", ms=3.5, color=color,
                label=f"{draft} {placement}/{vocab}")
    ax.axhline(rec.no_spec_stock.tokens_per_s, color="black", lw=1.2,
               label=f"no speculation, nccl ({rec.no_spec_stock.tokens_per_s:.0f})")
    b = rec.best
    if b.plan.speculative:
        ax.plot([b.plan.k], [b.tokens_per_s], marker="*", ms=16, color="crimson", ls="none",
                label=f"recommended ({b.tokens_per_s:.0f})")
    ax.set_xlabel("draft tokens per step (k)")
    ax.set_ylabel("tokens/s" + (" per request" if rec.batch == 1 else
                                f" aggregate (batch {rec.batch})"))
    ax.set_xticks(range(1, 8))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.set_title(title or f"{rec.hardware}, batch {rec.batch}, context {rec.context} "
                          "(model estimate; buildable options, best verifier/backend per point)",
                 fontsize=9)
    _legend_right(ax)
    return _save(fig, path)


def plot_validation(report, path: str | Path) -> Path:
    """Measured against predicted tokens/s at every point (log-log, the +-10 % band): the
    fitted points, held-out points between fitted cells of their run, and held-out points of
    runs with no fitted cell, each with its own marker."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 5.0), dpi=110)
    xs = [r.point.tokens_per_s for r in report.rows]
    lo, hi = min(xs) * 0.8, max(xs) * 1.25
    ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="predicted = measured")
    ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="0.85",
                    label="+-10 %")
    styles = (("o", "tab:blue"), ("s", "tab:orange"), ("^", "tab:red"))
    for (group, rows), (marker, color) in zip(report.groups().items(), styles):
        mean = sum(abs(r.error) for r in rows) / len(rows) if rows else 0.0
        ax.scatter([r.point.tokens_per_s for r in rows], [r.predicted for r in rows],
                   marker=marker, s=22, color=color,
                   label=f"{group}: {len(rows)} points, mean |error| {mean:.1%}", zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured tokens/s (public runs)")
    ax.set_ylabel("cost model, tokens/s")
    ax.grid(alpha=0.3, which="both")
    ax.set_title(f"{report.hardware}: every calibration and held-out point", fontsize=9)
    _legend_right(ax)
    return _save(fig, path)


def plot_latency(tables: list, path: str | Path) -> Path:
    """Every measured all-reduce curve: markers are the published points."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=110)
    styles = {"nccl": "-", "custom_oneshot": "--"}
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, t in enumerate(tables):
        for backend, ops in t.curves.items():
            c = ops.get("allreduce")
            if c is None:
                continue
            ax.plot(c.sizes, c.measured_us, linestyle=styles.get(backend, ":"), marker="o",
                    ms=3.5, color=colors[i % len(colors)], label=f"{t.name}: {backend}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("all-reduce message (bytes)")
    ax.set_ylabel("latency (us, idle)")
    for size, name in ((14336, "B=1"), (57344, "B=1, k=3")):
        ax.axvline(size, color="0.6", lw=0.8)
        ax.annotate(name, (size, ax.get_ylim()[0]), fontsize=7, rotation=90,
                    va="bottom", ha="right")
    ax.grid(alpha=0.3, which="both")
    ax.set_title("8x RTX PRO 6000: published all-reduce latencies (log-log lines, no bars)",
                 fontsize=9)
    _legend_right(ax)
    return _save(fig, path)


def plot_levers(rows, path: str | Path, batch: int = 1) -> Path:
    """Gain of each lever at one batch: bar = card scenario, whisker = low..high."""
    plt = _plt()
    rows = [r for r in rows if r.gains[batch]["card"] is not None]
    fig, ax = plt.subplots(figsize=(7.5, 0.42 * len(rows) + 1.2), dpi=110)
    ys = list(range(len(rows)))[::-1]
    card = [100 * r.gains[batch]["card"] for r in rows]
    lo = [100 * (r.gains[batch]["low"] or 0.0) for r in rows]
    hi = [100 * (r.gains[batch]["high"] or 0.0) for r in rows]
    colors = ["0.6" if r.lever.built else "tab:orange"
              if r.lever.kind == "upper bound, no setting" else "tab:blue" for r in rows]
    ax.barh(ys, card, color=colors, height=0.6)
    span_lo = [min(a, b, c) for a, b, c in zip(lo, hi, card)]
    span_hi = [max(a, b, c) for a, b, c in zip(lo, hi, card)]
    ax.hlines(ys, span_lo, span_hi, color="black", lw=1.2)
    ax.vlines(span_lo, [y - 0.18 for y in ys], [y + 0.18 for y in ys], color="black", lw=1.2)
    ax.vlines(span_hi, [y - 0.18 for y in ys], [y + 0.18 for y in ys], color="black", lw=1.2)
    ax.set_yticks(ys)
    ax.set_yticklabels([r.lever.name for r in rows], fontsize=7)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel(f"predicted gain at batch {batch}, % (bar: card acceptance; "
                  "line: range over the low / card / high scenarios)")
    ax.grid(alpha=0.3, axis="x")
    ax.set_title("What-if (blue: a setting or package today; orange: upper bound, no setting; "
                 "grey: this project)", fontsize=8)
    return _save(fig, path)
