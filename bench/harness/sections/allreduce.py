"""Section ``allreduce`` (several GPUs): ``bench/allreduce_bench.py`` written as a cost-model
latency table, beside the shipped PCIe table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.harness.common import fmt, fmt_bytes, gpu_env, last_error_line, md_table, scrub
from bench.harness.sections.base import BENCH, Context, Outcome, cuda_devices

ALLREDUCE_BENCH = BENCH / "allreduce_bench.py"


def needs_allreduce(caps: dict, ctx: Context) -> str | None:
    n = cuda_devices(caps)
    return None if n >= 2 else f"needs >= 2 CUDA devices (found {n})"


def _plot_allreduce(table: dict, shipped: dict | None, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=110)
    measured = [b for b, s in table["backends"].items() if "measurements" in s]
    for i, b in enumerate(measured):
        pts = table["backends"][b]["measurements"].get("allreduce", [])
        xs = [p["bytes"] for p in pts]
        ax.plot(xs, [p["p50_us"] for p in pts], "-o", ms=3, color=f"C{i}",
                label=f"{b} (measured p50)")
        ax.fill_between(xs, [p["p10_us"] for p in pts], [p["p90_us"] for p in pts],
                        color=f"C{i}", alpha=0.15)
        if shipped and b in shipped["backends"]:
            sp = shipped["backends"][b]["ops"].get("allreduce", [])
            ax.plot([p[0] for p in sp], [p[1] for p in sp], ":", color=f"C{i}",
                    label=f"{b} (cost-model table)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("all-reduce bytes ([T, 7168] bf16)")
    ax.set_ylabel("us per all-reduce")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    ax.set_title(table["description"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def run_allreduce(ctx: Context) -> Outcome:
    n = min(cuda_devices(ctx.caps), 8)
    out_json = ctx.out / "allreduce-latency-table.json"
    cmd = [sys.executable, str(ALLREDUCE_BENCH), "--launch", str(n), "--p2p", "both",
           "--out", str(out_json), "--base", "rtx-pro-6000-pcie-x8"]
    if ctx.quick:
        cmd.append("--quick")
    ctx.progress(f"    {n} ranks: nccl (P2P on, off), flashinfer_pcie_ipc if importable")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=gpu_env(),
                              check=False)
    except subprocess.TimeoutExpired:
        return Outcome("failed", "all-reduce bench exceeded 1800 s")
    (ctx.out / "allreduce.log").write_text(scrub(proc.stdout + proc.stderr))
    if not out_json.is_file():
        return Outcome("failed", f"exited {proc.returncode}: "
                                 f"{last_error_line(proc.stdout + proc.stderr)}")
    from vllm_kimi_ext.costmodel.catalog import load_raw
    from vllm_kimi_ext.costmodel.latency import load_latency_table

    table = json.loads(out_json.read_text())
    load_latency_table(out_json)  # the cost model can load it (raises otherwise)
    shipped = load_raw("latency", "rtx-pro-6000-pcie-x8")
    shipped_t = load_latency_table("rtx-pro-6000-pcie-x8")
    rows = []
    for b, spec in table["backends"].items():
        if "measurements" not in spec:
            continue
        for op, pts in spec["measurements"].items():
            for p in pts:
                ref = (shipped_t.latency_us(op, p["bytes"], b)
                       if b in shipped_t.backends else None)
                rows.append([b, op, p.get("tokens", "-"), fmt_bytes(p["bytes"]),
                             fmt(p["p50_us"], ".1f"), fmt(p["p10_us"], ".1f"),
                             fmt(p["p90_us"], ".1f"), fmt(ref, ".1f"),
                             fmt(p["p50_us"] / ref if ref else None, ".2f")])
    skipped = [(f"backend {b}", why) for b, why in (table.get("not_measured") or {}).items()]
    png = _plot_allreduce(table, shipped, ctx.out / "allreduce.png")
    md = [(f"`bench/allreduce_bench.py --launch {n} --p2p both` on {table['description']} "
          f"({table['measurement'].get('mode')} mode). Written as a cost-model latency table "
          f"([{out_json.name}]({out_json.name})); the shipped PCIe table's value at the same "
          "size is beside it (note: that table is for 8 PCIe GPUs)."), "",
          md_table(["backend", "op", "T", "bytes", "p50 us", "p10 us", "p90 us",
                    "cost-model table us", "measured / table"], rows)]
    if png:
        md += ["", f"![all-reduce latency]({png.name})"]
    status = "ok" if proc.returncode == 0 and not skipped else "partial"
    return Outcome(status, None if status == "ok" else "some backends not measured",
                   data={"table": table}, markdown="\n".join(md), skipped=skipped,
                   artifacts=[out_json.name] + ([png.name] if png else []))
