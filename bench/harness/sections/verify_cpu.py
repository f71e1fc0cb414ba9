"""Section ``verify-cpu`` (any machine): pytest-benchmark of the reference verifier beside
one rank's graph verification step, the product's verifier (``bench/bench_verify_cpu.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.harness.common import ROOT, fmt, last_error_line, md_table, scrub
from bench.harness.sections.base import BENCH, Context, Outcome

VERIFY_BENCH = BENCH / "bench_verify_cpu.py"


def _tail(text: str, n: int = 12) -> str:
    return "\n".join(scrub(text).strip().splitlines()[-n:])


def needs_verify(caps: dict, ctx: Context) -> str | None:
    if not VERIFY_BENCH.is_file():
        return "bench/bench_verify_cpu.py not present"
    if not caps.get("pytest_benchmark"):
        return "pytest-benchmark not installed"
    return None


def verify_ratios(bench_json: dict) -> list[dict[str, Any]]:
    """Per pytest-benchmark group: every case's median beside the group's reference case
    (name containing ``reference``), measured in the same run."""
    groups: dict[str, list[dict]] = {}
    for b in bench_json.get("benchmarks", []):
        groups.setdefault(b.get("group") or b["name"], []).append(b)
    rows = []
    for group, items in sorted(groups.items()):
        ref = next((b for b in items if "reference" in b["name"].lower()), None)
        for b in sorted(items, key=lambda b: ("reference" not in b["name"].lower(), b["name"])):
            st = b["stats"]
            rows.append({
                "group": group, "case": b["name"], "median_us": st["median"] * 1e6,
                "q1_us": st.get("q1", st["median"]) * 1e6,
                "q3_us": st.get("q3", st["median"]) * 1e6,
                "iqr_us": st["iqr"] * 1e6, "min_us": st["min"] * 1e6, "rounds": st["rounds"],
                "reference": ref["name"] if ref else None,
                "speedup_vs_reference": (ref["stats"]["median"] / st["median"]
                                         if ref and st["median"] > 0 else None),
                "speedup_vs_reference_min": (ref["stats"]["min"] / st["min"]
                                             if ref and st["min"] > 0 else None),
            })
    return rows


def _plot_verify(rows: list[dict], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    groups = list(dict.fromkeys(r["group"] for r in rows))
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.4), dpi=110,
                             squeeze=False)
    for ax, g in zip(axes[0], groups):
        rs = [r for r in rows if r["group"] == g]
        names = [r["case"].replace("test_bench_", "") for r in rs]
        vals = [r["median_us"] for r in rs]
        bars = ax.bar(range(len(rs)), vals, color=["#777" if r["case"] == r["reference"]
                                                   else "#2a7" for r in rs])
        ax.errorbar(range(len(rs)), vals,
                    yerr=[[max(r["median_us"] - r["q1_us"], 0) for r in rs],
                          [max(r["q3_us"] - r["median_us"], 0) for r in rs]],
                    fmt="none", ecolor="black", capsize=3, lw=0.8)
        ax.set_yscale("log")
        for b, r in zip(bars, rs):
            if r["speedup_vs_reference"] and r["case"] != r["reference"]:
                ax.annotate(f"{r['speedup_vs_reference']:.2f}x", (b.get_x() + b.get_width() / 2,
                            b.get_height()), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(rs)), names, rotation=20, ha="right", fontsize=7)
        ax.set_ylabel("median us per call")
        ax.set_title(g, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("CPU verifier microbenchmark (one run; bar = median, whisker = Q1..Q3)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def run_verify(ctx: Context) -> Outcome:
    out_json = ctx.out / "verify-cpu-benchmark.json"
    out_json.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", str(VERIFY_BENCH), "-q", "-p", "no:cacheprovider",
           "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
           f"--benchmark-json={out_json}", "--benchmark-min-rounds=5",
           f"--benchmark-max-time={0.2 if ctx.quick else 1.0}", "--benchmark-warmup=on",
           "--benchmark-warmup-iterations=2", "--benchmark-sort=name"]
    # one thread unless told otherwise: OpenMP spin-waiting on an oversubscribed (shared)
    # machine can slow torch ops by orders of magnitude, which is noise, not the verifier
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    env.setdefault("OMP_NUM_THREADS", "1")
    threads = env["OMP_NUM_THREADS"]
    with tempfile.TemporaryDirectory() as tmp:
        cwd = ROOT
        if not ctx.use_git:  # pytest-benchmark records commit info with git: keep it away
            env["GIT_DIR"] = str(Path(tmp) / "no-git")
            cwd = Path(tmp)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env,
                                  cwd=cwd, check=False)
        except subprocess.TimeoutExpired:
            return Outcome("failed", "pytest-benchmark run exceeded 600 s")
    if proc.returncode == 5:
        return Outcome("skipped", "bench/bench_verify_cpu.py collected no benchmark")
    if proc.returncode != 0 or not out_json.is_file():
        return Outcome("failed", f"pytest exited {proc.returncode}: "
                                 f"{last_error_line(proc.stdout + proc.stderr)}",
                       data={"output_tail": _tail(proc.stdout + proc.stderr)})
    data = json.loads(out_json.read_text())
    rows = verify_ratios(data)
    png = _plot_verify(rows, ctx.out / "verify-cpu.png")
    table = md_table(
        ["group", "case", "median us", "IQR us", "min us", "rounds",
         "speed-up vs reference (median)", "(min)"],
        [[r["group"], r["case"].replace("test_bench_", ""), fmt(r["median_us"], ".1f"),
          fmt(r["iqr_us"], ".1f"), fmt(r["min_us"], ".1f"), r["rounds"],
          "1 (reference)" if r["case"] == r["reference"]
          else fmt(r["speedup_vs_reference"], ".2f", "x"),
          "1" if r["case"] == r["reference"]
          else fmt(r["speedup_vs_reference_min"], ".2f", "x")] for r in rows])
    cpu = data.get("machine_info", {}).get("cpu", {})
    md = [
        ("`pytest bench/bench_verify_cpu.py` with pytest-benchmark: the full-vocabulary "
        "reference verifier and one rank's graph verification step (`GraphVerifyStep`, torch "
        "backend; its all-gather replaced by a local stand-in, so no communication), timed "
        "side by side "
        f"in one run on {cpu.get('brand_raw') or ctx.caps.get('cpu')} "
        f"(OMP_NUM_THREADS={threads}). Ratios are "
        "reference / case within a group, of medians and of minima; on a shared 2-core "
        "machine the spread is wide (see IQR) and the minima are the steadier estimate."),
        "",
        table,
    ]
    if png:
        md += ["", f"![verify microbenchmark]({png.name})"]
    return Outcome("ok", data={"rows": rows, "pytest_benchmark": data.get("version"),
                               "omp_num_threads": threads},
                   markdown="\n".join(md),
                   artifacts=[out_json.name] + ([png.name] if png else []))
