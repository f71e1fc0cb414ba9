"""The sections of ``bench/run_all.py``: what each needs, how it runs, what it reports.

Each section is a function ``run(ctx) -> Outcome``; :data:`SECTIONS` lists them in order
with their requirement check (``needs(caps, ctx) -> reason or None``). A section never
raises: a failure becomes ``status="failed"`` with the reason, and parts of a section that
could not run become rows of the report's "skipped (why)" table.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vllm_kimi_ext.benchmarks.common import (
    ROOT,
    first_line,
    fmt,
    fmt_bytes,
    gpu_env,
    last_error_line,
    md_table,
    rel,
    scrub,
)

BENCH = ROOT / "bench"


@dataclasses.dataclass
class Context:
    out: Path
    caps: dict[str, Any]
    quick: bool = False
    use_git: bool = True
    progress: Callable[[str], None] = print
    e2e_config: Path | None = None
    e2e_model: str | None = None
    e2e_pythons: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Outcome:
    status: str  # ok | partial | skipped | failed
    reason: str | None = None
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    markdown: str = ""
    artifacts: list[str] = dataclasses.field(default_factory=list)
    skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (item, why)


def _ncuda(caps: dict) -> int:
    return int(caps.get("cuda", {}).get("device_count") or 0)


def _tail(text: str, n: int = 12) -> str:
    return "\n".join(scrub(text).strip().splitlines()[-n:])


# ---------------------------------------------------------------------------------------------
# (a) cost model
# ---------------------------------------------------------------------------------------------


def needs_costmodel(caps: dict, ctx: Context) -> str | None:
    return None if caps.get("matplotlib") else "matplotlib not installed (plots)"


def run_costmodel(ctx: Context) -> Outcome:
    from vllm_kimi_ext.costmodel.report import PCIE, markdown_report

    text = markdown_report(ctx.out, hardware=PCIE, name="costmodel-plan",
                           title="Cost-model plan: Kimi-K2.5 on 8x PCIe, TP=8")
    body = text.split("\n", 1)[1].strip()  # drop its title
    short, _, rest = body.partition("**All configurations**")
    md = [
        ("A **model**, not a measurement: the decode cost model's recommendation for every "
        "draft with published acceptance, on the calibrated 8x RTX PRO 6000 profile. Full "
        "table of configurations: [costmodel-plan.md](costmodel-plan.md)."),
        "",
        short.strip(),
    ]
    rows = sum(1 for ln in rest.splitlines() if ln.startswith("| ") and "---" not in ln) - 1
    return Outcome("ok", data={"hardware": PCIE, "configurations": max(rows, 0)},
                   markdown="\n".join(md),
                   artifacts=["costmodel-plan.md", "costmodel-plan.png"])


# ---------------------------------------------------------------------------------------------
# (b) CPU microbenchmarks of the verifiers (pytest-benchmark)
# ---------------------------------------------------------------------------------------------

VERIFY_BENCH = BENCH / "bench_verify_cpu.py"


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
        "reference verifier and one rank's work of the vocabulary-sharded verifier (its "
        "all-gather replaced by a local stand-in, so no communication), timed side by side "
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


# ---------------------------------------------------------------------------------------------
# (c) collectives of a target pass (and drafts) from gloo TP runs
# ---------------------------------------------------------------------------------------------


def needs_collectives(caps: dict, ctx: Context) -> str | None:
    if not caps.get("vllm_importable"):
        return "vLLM not importable (nox -s apply-patches)"
    return None


def _draft_cases(ckpt: Path, quick: bool) -> tuple[list, dict[str, str], list[tuple[str, str]]]:
    from vllm_kimi_ext.benchmarks.collectives import draft_scenarios_usable

    ok, why = draft_scenarios_usable()
    if not ok:
        return [], {}, [("draft passes", why)]
    if quick:
        return [], {}, [("draft passes", "--quick")]
    from vllm_kimi_ext.testing import draft_scenarios as ds
    from vllm_kimi_ext.testing.checkpoints import TinyEagle3Spec, TinyKimiSpec, write_tiny_eagle3

    target = TinyKimiSpec()
    cases, placements, skipped = [], {}, []
    write_tiny_eagle3(ckpt / "eagle3-llama", target, TinyEagle3Spec(style="llama"))
    write_tiny_eagle3(ckpt / "eagle3-mla", target, TinyEagle3Spec(style="mla"))
    cases.append(ds.DraftCase("eagle3-llama", "eagle3", str(ckpt / "eagle3-llama")))
    cases.append(ds.DraftCase("eagle3-mla", "eagle3", str(ckpt / "eagle3-mla")))
    if hasattr(ds, "write_tiny_dflash"):
        ds.write_tiny_dflash(ckpt / "dflash", target)
        block = getattr(getattr(ds, "TinyDFlashSpec", None), "block_size", 4)
        cases.append(ds.DraftCase("dflash", "dflash", str(ckpt / "dflash"), rows=int(block)))
    if getattr(ds, "has_unsharded_draft_patch", lambda: False)():
        cases.append(ds.DraftCase("eagle3-llama-draft-tp1", "eagle3", str(ckpt / "eagle3-llama"),
                                  options=(("draft_tensor_parallel_size", 1),)))
        placements["eagle3-llama-draft-tp1"] = "unsharded"
    else:
        skipped.append(("draft at draft_tensor_parallel_size 1",
                        "the unsharded-draft vLLM patch is not in the applied series"))
    opt = getattr(ds, "REPLICATED_EMBEDDING_OPTION", None)
    if opt and getattr(ds, "has_replicated_embedding_patch", lambda: False)():
        cases.append(ds.DraftCase("eagle3-llama-replicated-embedding", "eagle3",
                                  str(ckpt / "eagle3-llama"), options=((opt, True),)))
        placements["eagle3-llama-replicated-embedding"] = "replicated_embedding"
    else:
        skipped.append(("draft with a replicated embedding",
                        "the replicated-embedding vLLM patch is not in the applied series"))
    return cases, placements, skipped


def run_collectives(ctx: Context) -> Outcome:
    from vllm_kimi_ext.benchmarks.collectives import KIMI, KIMI_TP, bench_rank
    from vllm_kimi_ext.testing.checkpoints import write_tiny_kimi_k25
    from vllm_kimi_ext.testing.distributed import RankFailed, run_tp

    ckpt = Path(tempfile.mkdtemp(prefix="bench-collectives-"))
    try:
        write_tiny_kimi_k25(ckpt / "target")
        cases, placements, skipped = _draft_cases(ckpt, ctx.quick)
        rows_per_pass = 4
        extra = f" + {len(cases)} draft case(s)" if cases else ""
        ctx.progress(f"    gloo TP=2: target pass{extra}")
        try:
            res = run_tp(bench_rank, 2, str(ckpt / "target"), rows_per_pass, cases, placements,
                         timeout=480, env={"VLLM_LOGGING_LEVEL": "ERROR"})
        except RankFailed as exc:
            return Outcome("failed", first_line(exc), data={"error": scrub(str(exc))[-3000:]})
    finally:
        import shutil

        shutil.rmtree(ckpt, ignore_errors=True)
    r0, r1 = res
    spmd = r0["target"]["summary"] == r1["target"]["summary"]
    t = r0["target"]
    exp = t["expected"]
    rows = [[f"target pass + logits, {rows_per_pass} rows", *(_cnt(t["summary"])),
             f"{exp['all_reduce']} / {exp['all_gather']}",
             "yes" if not t["discrepancies"] else "no: " + "; ".join(t["discrepancies"])]]
    drafts_out = {}
    for name, d in r0["drafts"].items():
        if "error" in d:
            skipped.append((f"draft pass {name} ({d['method']})",
                            f"could not run on this machine: {d['error']}"))
            continue
        e = d["expected"]
        rows.append([f"draft {name} ({d['placement']}), {d['rows']} row(s)", *_cnt(d["summary"]),
                     f"{e['all_reduce']} / {e['all_gather']}",
                     "yes" if d["matches"] else f"no: counted {d['counted']}"])
        drafts_out[name] = d
    proj = r0["kimi_projection"]
    prow = []
    for label, e in proj.items():
        prow.append([label, e["all_reduce"], fmt_bytes(e["all_reduce_bytes"]), e["all_gather"],
                     fmt_bytes(e["all_gather_bytes"])])
    md = [
        ("Collectives counted by instrumenting vLLM's `GroupCoordinator` "
        "(`vllm_kimi_ext.comm.CollectiveCounter`) while the tiny Kimi-K2.5-shaped target "
        "(and tiny drafts) run one pass at TP=2 over gloo, against the counts derived from "
        "each config. Bytes are one rank's payload."),
        "",
        md_table(["pass", "all-reduce", "AR bytes", "all-gather", "AG bytes",
                  "expected AR / AG", "matches config"], rows),
        "",
        (f"- Both ranks made identical calls: {'yes' if spmd else '**no**'}. A planted extra "
        f"all-reduce is caught by the check: {'yes' if t['planted_caught'] else '**no**'}."),
    ]
    local = t.get("local_logits") or {}
    if local.get("available"):
        md.append(f"- `compute_logits_local` (patch 0002): {local['collectives']} collectives, "
                  f"returns this rank's shard {tuple(local['shape'])}: "
                  f"{'matches' if local['matches_slice'] else 'does NOT match'} the gathered "
                  "logits.")
    md += [
        "",
        (f"The same config-derived formulas at Kimi-K2.5 dimensions ({KIMI['num_hidden_layers']} "
        f"layers, hidden {KIMI['hidden_size']}, vocab {KIMI['vocab_size']}), TP={KIMI_TP} "
        "(derived, not run):"),
        "",
        md_table(["pass", "all-reduce", "AR bytes/rank", "all-gather", "AG bytes/rank"], prow),
    ]
    status = "ok" if not t["discrepancies"] and spmd else "failed"
    if status == "ok" and len(drafts_out) < len(r0["drafts"]):
        status = "partial"  # some draft case could not run here
    return Outcome(status, None if status != "failed" else "counts differ from the config",
                   data={"tp": 2, "rows": rows_per_pass, "target": t, "drafts": drafts_out,
                         "spmd": spmd, "kimi_projection": proj},
                   markdown="\n".join(md), skipped=skipped)


def _cnt(summary_rows: list) -> list[str]:
    ar = [r for r in summary_rows if r[2] == "all_reduce"]
    ag = [r for r in summary_rows if r[2] == "all_gather"]
    return [str(sum(r[3] for r in ar)), fmt_bytes(sum(r[4] for r in ar)),
            str(sum(r[3] for r in ag)), fmt_bytes(sum(r[4] for r in ag))]


# ---------------------------------------------------------------------------------------------
# one GPU: kernel bench scripts
# ---------------------------------------------------------------------------------------------


def kernel_scripts() -> list[Path]:
    d = BENCH / "kernels"
    return sorted(p for p in d.glob("*.py") if not p.name.startswith("_")) if d.is_dir() else []


def needs_kernels(caps: dict, ctx: Context) -> str | None:
    if _ncuda(caps) < 1:
        return "no CUDA device"
    if not kernel_scripts():
        return "no kernel bench scripts in bench/kernels/"
    return None


def _script_args(script: Path, out_dir: Path, quick: bool) -> list[str]:
    """Arguments for a kernel script, from the options its source declares: an output
    directory (``--out-dir``, or ``--out`` used as a directory), else an output file
    (``--out`` / ``--json``); ``--quick`` when asked and supported."""
    src = script.read_text(errors="replace")

    def has(opt: str) -> bool:
        return f'"{opt}"' in src or f"'{opt}'" in src

    args: list[str] = []
    if has("--out-dir"):
        args += ["--out-dir", str(out_dir)]
    elif has("--out"):
        as_dir = re.search(r"\.out\s*/|\.out\.mkdir", src) is not None
        args += ["--out", str(out_dir if as_dir else out_dir / f"{script.stem}.json")]
    elif has("--json"):
        args += ["--json", str(out_dir / f"{script.stem}.json")]
    if quick and has("--quick"):
        args.append("--quick")
    return args


def _json_table(data: Any, limit: int = 30) -> str | None:
    recs = data
    if isinstance(data, dict):
        recs = next((v for v in data.values() if isinstance(v, list) and v
                     and all(isinstance(x, dict) for x in v)), None)
    if not isinstance(recs, list) or not recs or not all(isinstance(r, dict) for r in recs):
        return None
    keys = [k for k, v in recs[0].items() if isinstance(v, (int, float, str, bool)) or v is None]
    rows = [[(f"{r.get(k):.4g}" if isinstance(r.get(k), float) else r.get(k)) for k in keys]
            for r in recs[:limit]]
    more = f"\n\n({len(recs) - limit} more rows in the JSON)" if len(recs) > limit else ""
    return md_table(keys, rows) + more


def run_kernels(ctx: Context) -> Outcome:
    out_dir = ctx.out / "kernels"
    out_dir.mkdir(parents=True, exist_ok=True)
    md, data, skipped = [], {}, []
    failures = 0
    for script in kernel_scripts():
        sdir = out_dir / script.stem
        sdir.mkdir(parents=True, exist_ok=True)
        before = {p: p.stat().st_mtime for p in sdir.rglob("*.json")}
        cmd = [sys.executable, str(script), *_script_args(script, sdir, ctx.quick)]
        ctx.progress(f"    {rel(script)}")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                                  cwd=sdir, env={**gpu_env(),
                                                 "VLLM_KIMI_EXT_BENCH_OUT": str(sdir)},
                                  check=False)
            rc = proc.returncode
            log = proc.stdout + proc.stderr
        except subprocess.TimeoutExpired:
            rc, log = "timeout (900 s)", ""
        new = sorted(p for p in sdir.rglob("*.json") if before.get(p) != p.stat().st_mtime)
        (sdir / f"{script.stem}.log").write_text(scrub(log))
        entry = {"exit": rc, "json": [rel(p) for p in new]}
        data[script.name] = entry
        md += [f"### {script.name}", ""]
        if rc != 0:
            failures += 1
            skipped.append((script.name, f"exited {rc}: {last_error_line(log)}"))
            md += [f"Exited {rc}: `{last_error_line(log)}`", ""]
        for p in new:
            try:
                payload = json.loads(p.read_text())
            except ValueError:
                continue
            entry.setdefault("results", {})[p.name] = payload
            md += [f"`{rel(p)}`:", "", _json_table(payload) or "(see the JSON)", ""]
        if rc == 0 and not new:
            md += ["Ran, wrote no JSON.", ""]
    status = "ok" if failures == 0 else ("partial" if failures < len(data) else "failed")
    return Outcome(status, None if status == "ok" else f"{failures} script(s) failed",
                   data=data, markdown="\n".join(md).strip(), skipped=skipped)


# ---------------------------------------------------------------------------------------------
# several GPUs: all-reduce microbenchmark
# ---------------------------------------------------------------------------------------------

ALLREDUCE_BENCH = BENCH / "allreduce_bench.py"


def needs_allreduce(caps: dict, ctx: Context) -> str | None:
    n = _ncuda(caps)
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
            ax.plot([x for x, _ in sp], [y for _, y in sp], ":", color=f"C{i}",
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
    n = min(_ncuda(ctx.caps), 8)
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


# ---------------------------------------------------------------------------------------------
# the real box: end-to-end serving (here: the pipeline on a tiny checkpoint)
# ---------------------------------------------------------------------------------------------

RUNNER = BENCH / "e2e" / "runner.py"


def needs_e2e(caps: dict, ctx: Context) -> str | None:
    if not caps.get("vllm_importable") and not ctx.e2e_pythons:
        return "vLLM not importable in this environment (give --e2e-python NAME=PATH)"
    return None


def run_e2e(ctx: Context) -> Outcome:
    from vllm_kimi_ext.benchmarks.schema import E2EResults, validate

    out_dir = ctx.out / "e2e"
    gpu = _ncuda(ctx.caps) > 0
    cmd = [sys.executable, str(RUNNER), "run", "--out", str(out_dir)]
    if ctx.e2e_config:
        cmd += ["--config", str(ctx.e2e_config)]
    if ctx.e2e_model:
        cmd += ["--model", ctx.e2e_model]
    for p in ctx.e2e_pythons:
        cmd += ["--python", p]
    if not ctx.use_git:
        cmd.append("--no-git")
    if not gpu:
        cmd += ["--stop-after-failed-starts", "1", "--startup-timeout", "180"]
    if ctx.quick:
        cmd += ["--requests", "4", "--concurrency", "1", "--time-budget", "600"]
    ctx.progress("    bench/e2e/runner.py run" + ("" if ctx.e2e_config else
                                                    " (tiny Kimi-shaped checkpoint)"))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              timeout=None if ctx.e2e_config else 2400,
                              env=gpu_env() if gpu else dict(os.environ), check=False)
    except subprocess.TimeoutExpired:
        return Outcome("failed", "e2e runner exceeded its time limit")
    (ctx.out / "e2e.log").write_text(scrub(proc.stdout + proc.stderr))
    res_file = out_dir / "results.json"
    if proc.returncode not in (0, 4) or not res_file.is_file():
        return Outcome("failed", f"runner exited {proc.returncode}: "
                                 f"{last_error_line(proc.stdout + proc.stderr)}")
    res = json.loads(res_file.read_text())
    problems = validate(res, E2EResults)
    runs = res["runs"]
    measured = [r for r in runs if r["status"] == "ok"]
    skipped = []
    for d, p in res["prompts"].items():
        if p["source"] == "builtin":
            skipped.append((f"prompts {d}", p["note"] or "built-in prompts used"))
    not_run = [r for r in runs if r["status"] != "ok"]
    if not_run:
        reasons = sorted({r["reason"] or r["status"] for r in not_run if
                          r["status"] == "server_failed"}) or \
            sorted({r["reason"] or r["status"] for r in not_run})
        skipped.append((f"serving ({len(not_run)} of {len(runs)} launches)",
                        "; ".join(reasons)))
    e2e_md = (out_dir / "report.md").read_text() if (out_dir / "report.md").is_file() else ""
    body = e2e_md.split("\n", 1)[1].strip() if e2e_md else ""
    body = body.replace("\n## ", "\n### ")
    validity = "valid" if not problems else "INVALID: " + "; ".join(problems[:3])
    md = [("The end-to-end pipeline (`bench/e2e/runner.py run`, config "
           f"`{res['config_file']}`): server launch and readiness, prompts, load levels, "
           f"metric scraping and the result schema (`{res['schema']}`: {validity}). "
           "Full result: [e2e/results.json](e2e/results.json)."), "", body]
    if problems:
        status = "failed"
    elif measured and not not_run:
        status = "ok"
    else:
        status = "partial"
    reason = None if status == "ok" else (
        "results do not match the schema" if problems else
        f"{len(measured)} of {len(runs)} launches measured")
    return Outcome(status, reason, data={"results_file": rel(res_file),
                                         "runs": [{k: r[k] for k in ("id", "status", "reason")}
                                                  for r in runs],
                                         "schema_problems": problems},
                   markdown="\n".join(md), skipped=skipped,
                   artifacts=["e2e/results.json", "e2e/report.md"])


# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SectionSpec:
    name: str
    title: str
    scope: str  # any machine / one GPU / several GPUs / the real box
    needs: Callable[[dict, Context], str | None]
    run: Callable[[Context], Outcome]


SECTIONS: tuple[SectionSpec, ...] = (
    SectionSpec("costmodel", "Cost model (prediction)", "any machine", needs_costmodel,
                run_costmodel),
    SectionSpec("verify-cpu", "Verifier CPU microbenchmark", "any machine", needs_verify,
                run_verify),
    SectionSpec("collectives", "Collectives per pass (gloo, TP=2)", "any machine",
                needs_collectives, run_collectives),
    SectionSpec("gpu-kernels", "GPU kernel benchmarks", "one GPU", needs_kernels, run_kernels),
    SectionSpec("allreduce", "All-reduce microbenchmark", "several GPUs", needs_allreduce,
                run_allreduce),
    SectionSpec("e2e", "End-to-end serving", "the real box", needs_e2e, run_e2e),
)
SECTION_NAMES = tuple(s.name for s in SECTIONS)


def plan(caps: dict, ctx: Context, only: list[str] | None = None,
         skip: list[str] | None = None) -> list[tuple[SectionSpec, str | None]]:
    """[(section, None to run / reason to skip)] in order."""
    out = []
    for s in SECTIONS:
        if only and s.name not in only:
            why = f"not selected (--only {','.join(only)})"
        elif skip and s.name in skip:
            why = "--skip"
        else:
            why = s.needs(caps, ctx)
        out.append((s, why))
    return out


def run_section(spec: SectionSpec, ctx: Context) -> tuple[Outcome, float]:
    t0 = time.monotonic()
    try:
        outcome = spec.run(ctx)
    except Exception as exc:  # noqa: BLE001 - a section never takes the run down
        import traceback

        outcome = Outcome("failed", first_line(exc),
                          data={"traceback": scrub(traceback.format_exc())[-4000:]})
    return outcome, time.monotonic() - t0
