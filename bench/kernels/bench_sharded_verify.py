#!/usr/bin/env python3
"""Per-rank sharded verification vs vLLM 0.34.0's full-vocabulary rejection sampler (GPU).

Standalone (no vLLM install needed; only torch + Triton + a CUDA GPU):

    python bench/kernels/bench_sharded_verify.py [--vllm-src DIR] [--out-dir DIR] [--quick]

1. Correctness on the GPU: the Triton shard-statistics and merge/decide kernels
   against the fused-torch implementation (bit-identical noise hash, values to
   2e-5, tokens up to certified near-ties), and the full sharded verifier
   (TP=8 simulated in-process, Triton backend) against the full-vocabulary
   reference at Kimi-K2.5 dims.
2. Timing at Kimi-K2.5 dims (V = 163840, TP = 8: a 20480-wide bf16 shard per
   rank), rows in {4, 16, 64, 256} (k = 3: rows/4 requests), temperature 0 and 1:

   * ``ours_kernel``: the shard-statistics kernel alone;
   * ``ours_decide``: the merge + accept/reject kernel alone (on a gathered
     ``[TP, rows, W]`` payload);
   * ``ours_step``: everything one rank does in a step (statistics, the
     all-gather replaced by a broadcast view of the local 16-byte-per-row
     payload, merge and decisions), i.e. per-rank compute without communication;
   * ``vllm``: vLLM 0.34.0's own Triton ``rejection_sample`` on the full
     ``[rows, 163840]`` bf16 logits every rank holds after today's all-gather.

   Each measurement is a CUDA graph of ``n`` back-to-back calls over ``n``
   rotating input buffers (>= 2x the L2 size where memory allows, so large
   cases are not L2-resident), replayed 30 times after warm-up and timed with
   CUDA events; the median replay over ``n`` is reported.
3. Writes JSON + a markdown table with hardware/software provenance.

vLLM's kernel is imported from the unmodified 0.34.0 source files without
importing the vLLM package (whose ``__init__`` needs pydantic and friends):
the handful of modules ``rejection_sampler_utils`` needs are loaded from
``--vllm-src`` (a directory containing ``vllm/``) under stub parent packages;
the only stubs are objects those modules import but ``rejection_sample`` never
calls (tensor-parallel group lookup, the input-batch type, batch-shard helpers).
If a regular vLLM install is importable it is used instead. To run on a bare
GPU machine, copy the eight files listed in ``VLLM_FILES`` from the vLLM 0.34.0
sdist into ``.vllm_src/`` (same relative paths; git-ignore it) and take that
folder along. The report records the sha256 of each file used.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import importlib
import json
import math
import os
import platform
import subprocess
import sys
import traceback
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "kernels"))

import torch
from _cuda_timing import time_eager, time_graph  # noqa: E402

V = 163840
TP = 8
K = 3
ROWS = (4, 16, 64, 256)
TEMPS = (0.0, 1.0)

VLLM_FILES = (
    "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py",
    "vllm/v1/worker/gpu/spec_decode/draft_logits.py",
    "vllm/v1/worker/gpu/spec_decode/fly.py",
    "vllm/v1/worker/gpu/sample/gumbel.py",
    "vllm/v1/worker/gpu/sample/watermark.py",
    "vllm/v1/watermarking/prfs/base.py",
    "vllm/v1/watermarking/prfs/philox.py",
    "vllm/utils/math_utils.py",
)


# ---------------------------------------------------------------------------
# vLLM's kernel
# ---------------------------------------------------------------------------
def _stub_module(name: str, **attrs) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def load_vllm_rejection_sample(src: Path | None):
    """Return ``(rejection_sample, info)``; raises with a reason on failure."""
    try:
        import vllm

        mod = importlib.import_module("vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils")
        return mod.rejection_sample, {"how": "installed vllm", "version": vllm.__version__,
                                      "file": mod.__file__}
    except Exception:  # noqa: BLE001 - fall back to the source files
        for k in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
            del sys.modules[k]
    if src is None:
        raise RuntimeError("vLLM is not importable and no --vllm-src was given")
    root = Path(src).resolve()
    missing = [f for f in VLLM_FILES if not (root / f).exists()]
    if missing:
        raise RuntimeError(f"--vllm-src lacks {missing}")
    import triton
    import triton.language as tl
    import triton.language.extra.libdevice as tldevice

    for pkg in ("vllm", "vllm.v1", "vllm.v1.worker", "vllm.v1.worker.gpu",
                "vllm.v1.worker.gpu.sample", "vllm.v1.worker.gpu.spec_decode",
                "vllm.v1.watermarking", "vllm.v1.watermarking.prfs", "vllm.utils",
                "vllm.distributed"):
        m = _stub_module(pkg)
        m.__path__ = [str(root.joinpath(*pkg.split(".")))]
    _stub_module("vllm.triton_utils", triton=triton, tl=tl, tldevice=tldevice, HAS_TRITON=True)

    def _never(*a, **k):
        raise RuntimeError("not used by rejection_sample")

    _stub_module("vllm.distributed.parallel_state", get_tp_group=_never)
    _stub_module("vllm.v1.worker.gpu.input_batch", InputBatch=object)

    @triton.jit
    def _unused(x, n):
        return x

    _stub_module("vllm.v1.worker.gpu.sample.batch_shard", shard_owner=_unused,
                 shard_owners=_never, shard_row=_unused, shard_rows=_never)
    mod = importlib.import_module("vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils")
    sha = {f: hashlib.sha256((root / f).read_bytes()).hexdigest()[:16] for f in VLLM_FILES}
    return mod.rejection_sample, {"how": "unmodified 0.34.0 source files, stub parents",
                                  "version": "0.34.0", "sha256_16": sha}


# ---------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------
def kernel_breakdown(fn, iters: int = 10) -> list:
    """Device time per kernel of one eager call (torch profiler, CUDA activity)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    out = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = getattr(e, "cuda_time_total", 0.0)
        if t and t > 0:
            out.append({"kernel": e.key[:80], "us_per_call": t / iters,
                        "launches_per_call": e.count / iters})
    return sorted(out, key=lambda r: -r["us_per_call"])


def n_buffers(bytes_per_call: int, l2_bytes: int, cap_bytes: int = 2 << 30) -> int:
    n = math.ceil(2 * l2_bytes / max(bytes_per_call, 1))
    return int(max(2, min(32, n, max(1, cap_bytes // max(bytes_per_call, 1)))))


# ---------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------
def make_case(rows: int, temp: float, gen: torch.Generator):
    from vllm_kimi_ext.verify import VerifyBatch

    num_reqs = rows // (K + 1)
    drafts = torch.randint(0, V, (num_reqs, K), generator=gen)
    seeds = torch.randint(0, 2**62, (num_reqs,), generator=gen)
    positions = (1000 + torch.arange(K + 1)).repeat(num_reqs)
    batch = VerifyBatch.from_draft_tokens(drafts, [temp] * num_reqs, seeds,
                                          positions=positions, device="cuda")
    return batch, drafts.cuda(), seeds.cuda()


def vllm_inputs(rows: int, temp: float, drafts: torch.Tensor, seeds: torch.Tensor):
    num_reqs = rows // (K + 1)
    dev = "cuda"
    prev = torch.full((num_reqs, 1), 7, dtype=torch.int64, device=dev)
    draft_sampled = torch.cat([prev, drafts], dim=1).reshape(-1).contiguous()
    return {
        "draft_logits_cache": None,
        "draft_sampled": draft_sampled,
        "cu_num_logits": torch.arange(0, rows + 1, K + 1, dtype=torch.int32, device=dev),
        "pos": (1000 + torch.arange(K + 1, device=dev)).repeat(num_reqs).to(torch.int64),
        "idx_mapping": torch.arange(num_reqs, dtype=torch.int32, device=dev),
        "expanded_idx_mapping": torch.arange(num_reqs, dtype=torch.int32,
                                             device=dev).repeat_interleave(K + 1),
        "expanded_local_pos": torch.arange(K + 1, dtype=torch.int32,
                                           device=dev).repeat(num_reqs),
        "temperature": torch.full((num_reqs,), temp, dtype=torch.float32, device=dev),
        "seed": seeds.to(torch.int64),
        "num_speculative_steps": K,
    }


def correctness(quick: bool) -> dict:
    from testkit.verify_equivalence import assert_equivalent
    from testkit.verify_kernel_check import run_checks
    from testkit.verify_simulate import simulate_sharded_verify
    from vllm_kimi_ext.verify import ReferenceVerifier, VerifyBatch
    from vllm_kimi_ext.verify.kernels import decide_triton, shard_local_stats_triton

    out = {"kernel_check": run_checks("cuda", quick=quick)}
    g = torch.Generator().manual_seed(11)
    reports = []
    for trial, (num_reqs, topk) in enumerate([(16, 0), (64, 0), (32, 50)]):
        drafts = torch.randint(0, V, (num_reqs, K), generator=g)
        temps = torch.where(torch.rand(num_reqs, generator=g) < 0.3, 0.0,
                            torch.rand(num_reqs, generator=g) + 0.3)
        b = VerifyBatch.from_draft_tokens(drafts, temps, torch.arange(num_reqs) + 100 * trial,
                                          top_k=[topk] * num_reqs, device="cuda")
        z = (torch.randn(b.num_rows, V, generator=g) * 2).to(torch.bfloat16)
        L = b.layout()
        hit = (L.draft.cpu() >= 0) & (torch.rand(b.num_rows, generator=g) < 0.7)
        idx = hit.nonzero().squeeze(1)
        z[idx, L.draft.cpu()[idx]] = 12.0
        z = z.cuda()
        # compile once in this thread before the simulated ranks run
        S = V // TP
        for thr in (None, torch.full((b.num_rows,), float("-inf"), device="cuda")):
            shard_local_stats_triton(z[:, :S].contiguous(), L.temperature, thr, L.draft,
                                     L.seeds, L.positions, 0, V)
        decide_triton(torch.zeros(TP, b.num_rows, 4, device="cuda"), L, V)
        sh, _, outs = simulate_sharded_verify(z, b, TP, V, backend="triton")
        for o in outs[1:]:
            assert torch.equal(o.sampled, sh.sampled)
        ref = ReferenceVerifier(V).verify(z, b)
        rep = assert_equivalent(ref, sh, b, logits=z, vocab_size=V, allow_score_ties=True)
        reports.append(rep.__dict__ | {"top_k": topk})
    out["sharded_vs_reference"] = reports
    return out


def provenance(vllm_info) -> dict:
    import triton

    p = torch.cuda.get_device_properties(0)
    smi = ""
    try:
        query = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit"
        smi = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=False).stdout.strip()
    except Exception as e:  # noqa: BLE001
        smi = f"nvidia-smi failed: {e}"
    return {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": p.name,
        "sm_count": p.multi_processor_count,
        "l2_bytes": getattr(p, "L2_cache_size", None),
        "capability": f"{p.major}.{p.minor}",
        "nvidia_smi": smi,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "vllm_kernel": vllm_info,
    }


def bench_case(rows: int, temp: float, gen: torch.Generator, vllm_fn, l2: int) -> dict:
    from vllm_kimi_ext.verify import VocabShardedVerifier
    from vllm_kimi_ext.verify.kernels import decide_triton, shard_local_stats_triton

    S = V // TP
    rank = 3
    batch, drafts, seeds = make_case(rows, temp, gen)
    L = batch.layout()
    shards = [(torch.randn(rows, S, device="cuda") * 3).to(torch.bfloat16)
              for _ in range(n_buffers(rows * S * 2, l2))]

    def local_only(t):  # stand-in all-gather: a broadcast view, no data movement
        return t.unsqueeze(0).expand(TP, *t.shape)

    v = VocabShardedVerifier(V, TP, rank, local_only, backend="triton")
    plan = v.plan(batch, probabilistic=False)
    rec = {"rows": rows, "temperature": temp, "num_reqs": L.num_reqs,
           "plan": plan.describe(),
           "bytes_per_row_received_sharded": plan.bytes_received_per_rank // rows,
           "bytes_per_row_received_gathered": 2 * V}

    def stats_call(sh):
        return lambda: shard_local_stats_triton(sh, L.temperature, None, L.draft, L.seeds,
                                                L.positions, rank * S, V)

    def step_call(sh):
        return lambda: v.verify(sh, batch)

    rec["ours_kernel"] = time_graph([stats_call(sh) for sh in shards])
    rec["ours_step"] = time_graph([step_call(sh) for sh in shards])
    rec["ours_step_eager_us"] = time_eager(step_call(shards[0]))
    width = 2 if temp == 0 else 4
    gath = [torch.randn(TP, rows, width, device="cuda") for _ in range(4)]
    for gg in gath:
        gg[..., 1] = torch.randint(0, V, (TP, rows), device="cuda").float()
    rec["ours_decide"] = time_graph([(lambda gg=gg: decide_triton(gg, L, V)) for gg in gath])
    profile_this = rows in (4, 256) and temp == 1.0
    if profile_this:
        rec["ours_step_kernels"] = kernel_breakdown(step_call(shards[0]))
    if vllm_fn is not None:
        fulls = [(torch.randn(rows, V, device="cuda") * 3).to(torch.bfloat16)
                 for _ in range(n_buffers(rows * V * 2, l2))]
        kw = vllm_inputs(rows, temp, drafts, seeds)

        def vllm_call(f):
            return lambda: vllm_fn(f, **kw)

        rec["vllm"] = time_graph([vllm_call(f) for f in fulls])
        rec["vllm_eager_us"] = time_eager(vllm_call(fulls[0]))
        if profile_this:
            rec["vllm_kernels"] = kernel_breakdown(vllm_call(fulls[0]))
        rec["ratio_vllm_over_ours_step"] = (rec["vllm"]["median_us"]
                                            / rec["ours_step"]["median_us"])
    return rec


def bench(quick: bool, vllm_fn) -> list[dict]:
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 60 << 20) or (60 << 20)
    gen = torch.Generator().manual_seed(0)
    results = []
    for rows in (ROWS[:2] if quick else ROWS):
        for temp in TEMPS:
            rec = bench_case(rows, temp, gen, vllm_fn, l2)
            results.append(rec)
            torch.cuda.empty_cache()
            print(json.dumps({k: (x["median_us"] if isinstance(x, dict) and "median_us" in x
                                  else x) for k, x in rec.items()}), flush=True)
    return results


def markdown(report: dict) -> str:
    prov = report["provenance"]
    env = (f"GPU: {prov['gpu']} ({prov['sm_count']} SMs, cc {prov['capability']}); "
           f"nvidia-smi: `{prov['nvidia_smi']}`; torch {prov['torch']} (CUDA "
           f"{prov['torch_cuda']}), Triton {prov['triton']}, Python {prov['python']}; "
           f"{prov['date_utc']}.")
    legend = (f"Kimi-K2.5 dims: V = {V}, TP = {TP} (shard {V // TP} bf16 columns), k = {K} "
              "(rows/4 requests). Times: median per call of a CUDA graph over rotating "
              "input buffers (us). `ours kernel` = the shard-statistics kernel(s); "
              "`ours decide` = the merge/accept kernel alone (a graph of 4 calls: "
              "dominated by launch latency); `ours step` = one rank's whole step "
              "without the communication; `vLLM` = `rejection_sample` on the full "
              "logits a rank holds after today's all-gather. Bytes: what each rank "
              "receives per row (sharded all-gather vs the bf16 logits all-gather). "
              "These are per-rank compute times on the GPU named above; the "
              "communication itself (one small all-gather vs a full-logits all-gather "
              "over PCIe on the target 8-GPU box) is not part of them.")
    header = ("| rows | T | ours kernel | ours decide | ours step | vLLM | vLLM / ours step | "
              "bytes/row sharded | bytes/row gathered |")
    lines = [
        "# Sharded verification vs vLLM 0.34.0 `rejection_sample` (per rank)",
        "",
        env,
        f"vLLM kernel: {report.get('vllm_status')}",
        "",
        legend,
        "",
        header,
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        vl = r.get("vllm", {}).get("median_us")
        ratio = r.get("ratio_vllm_over_ours_step")
        lines.append(
            f"| {r['rows']} | {r['temperature']:g} | {r['ours_kernel']['median_us']:.1f} | "
            f"{r['ours_decide']['median_us']:.1f} | {r['ours_step']['median_us']:.1f} | "
            f"{'n/a' if vl is None else f'{vl:.1f}'} | "
            f"{'n/a' if ratio is None else f'{ratio:.2f}'} | "
            f"{r['bytes_per_row_received_sharded']} | {r['bytes_per_row_received_gathered']} |")
    for r in report["results"]:
        for key in ("ours_step_kernels", "vllm_kernels"):
            if key in r:
                lines += ["", f"Kernels of one eager call, {key.split('_')[0]} (rows={r['rows']}, "
                          f"T={r['temperature']:g}; torch profiler, device us per call): "
                          + ", ".join(f"`{k['kernel']}` {k['us_per_call']:.1f}"
                                      f" (x{k['launches_per_call']:g})" for k in r[key])]
    c = report.get("correctness", {})
    if c:
        kc = c.get("kernel_check", {})
        lines += ["", "Correctness on this GPU: Triton vs fused torch on "
                  f"{len(kc.get('cases', []))} shapes (near-ties: "
                  f"{sum(x['near_ties'] for x in kc.get('cases', []))}), "
                  f"{kc.get('hash_words_checked')} hash words bit-identical, merge/decide "
                  "kernel identical; sharded (TP=8, Triton) vs full-vocabulary reference: "
                  + "; ".join(f"{x['identical']}/{x['num_reqs']} identical, "
                              f"{x['certified_accept_flips']} certified accept flips, "
                              f"{x['certified_residual_ties']} certified ties"
                              for x in c.get("sharded_vs_reference", []))]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vllm-src", type=Path, default=None,
                    help="directory holding vllm/ (0.34.0 source); default: the first of "
                         ".vllm_src/ and build/vllm-0.34.0/ that exists")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "reports")
    ap.add_argument("--name", default="verify_sharded_vs_vllm_h200")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-correctness", action="store_true")
    a = ap.parse_args(argv)
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    report: dict = {}
    src = a.vllm_src
    if src is None:
        src = next((p for p in (ROOT / ".vllm_src", ROOT / "build" / "vllm-0.34.0")
                    if (p / VLLM_FILES[0]).exists()), None)
    try:
        vllm_fn, info = load_vllm_rejection_sample(src)
        report["vllm_status"] = f"ran ({info['how']})"
    except Exception as e:  # noqa: BLE001
        vllm_fn, info = None, {"error": repr(e), "trace": traceback.format_exc()[-2000:]}
        report["vllm_status"] = f"NOT run: {e!r}"
    report["provenance"] = provenance(info)
    if not a.skip_correctness:
        report["correctness"] = correctness(a.quick)
        print("correctness ok", flush=True)
    report["results"] = bench(a.quick, vllm_fn)
    write_report(report, a.out_dir, a.name, markdown)
    return 0


def write_report(report: dict, out_dir: Path, name: str, to_markdown) -> None:
    """``<name>.json`` + ``<name>.md`` into ``out_dir`` (and ``$OUT`` when set); print the table."""
    dirs = [out_dir] + ([Path(os.environ["OUT"])] if os.environ.get("OUT") else [])
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{name}.json").write_text(json.dumps(report, indent=1, default=str))
        (d / f"{name}.md").write_text(to_markdown(report))
    print(to_markdown(report))


if __name__ == "__main__":
    sys.exit(main())
