#!/usr/bin/env python
"""All-reduce / all-gather latency at Kimi-K2.5 decode sizes, as a cost-model latency table.

Measures, on one host:

* all-reduce of ``[T, 7168]`` bf16 for T in 1, 4, 8, 16, 32, 64, 256 (the per-layer
  all-reduces of a decode step with T = batch x (k + 1) tokens);
* all-gather (NCCL only) at the same byte sizes plus the logits gathers of
  ``[rows, 163840]`` bf16 for rows in 1, 4, 8, 16 (message size = the gathered output);

for each backend:

* ``nccl``: ``torch.distributed`` over NCCL with peer-to-peer allowed (``NCCL_P2P_DISABLE=0``);
* ``nccl_p2p_off``: the same with ``NCCL_P2P_DISABLE=1`` (a separate launch: NCCL reads it
  once per process);
* ``flashinfer_pcie_ipc``: FlashInfer's PCIe CUDA-IPC all-reduce driven the way vLLM 0.34's
  ``FlashInferPcieIpcAllReduce`` drives it (workspace, tune, prepare, all_reduce), if
  ``flashinfer.comm.PcieIpcAllReduceWorkspace`` is importable; otherwise reported as skipped;
* ``gloo`` (``--device cpu``): a mechanics check of this script on a machine without GPUs.

Latency of one point: the collective is captured ``--inner`` times back to back in a CUDA
graph (``--mode graph``, how vLLM runs decode; ``--mode eager`` launches them one by one),
the graph is replayed ``--reps`` times, each replay timed with CUDA events; per replay the
slowest rank counts; the point is the median over replays (p10/p90/mean/min kept too).

Output: JSON in the schema of ``vllm_kimi_ext/costmodel/profiles/latency/*.json`` (what
``vllm_kimi_ext.costmodel.latency.load_latency_table`` loads): per backend and op a curve of
``[bytes, microseconds]`` points. The curves are the running maximum of the medians (the
cost model requires latency non-decreasing in bytes); the raw percentiles are under
``backends.<name>.measurements``. ``--base NAME_OR_PATH`` starts from an existing table and
replaces only the backends measured here (e.g. keep the synthesised ``custom_oneshot``).

Runs with torch alone (no vLLM, no vllm_kimi_ext needed)::

    torchrun --nproc-per-node 8 bench/allreduce_bench.py --out ar.json
    python bench/allreduce_bench.py --launch 8 --p2p both --out ar.json   # both P2P settings
    python bench/allreduce_bench.py --launch 2 --device cpu --out ar-cpu.json  # gloo check
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HIDDEN = 7168
VOCAB = 163840
DEFAULT_TOKENS = (1, 4, 8, 16, 32, 64, 256)
DEFAULT_LOGIT_ROWS = (1, 4, 8, 16)
ELEM = 2  # bf16
SCHEMA_UNITS = {
    "bytes": "message size: the whole buffer for an all-reduce, the gathered OUTPUT (all ranks "
             "together) for an all-gather",
    "latency_us": "wall time of one collective on an idle system, microseconds (no rank skew; "
                  "the cost model adds its calibrated in-situ overhead on top)",
}
DESCRIPTIONS = {
    "nccl": "NCCL via torch.distributed, peer-to-peer allowed (NCCL_P2P_DISABLE=0)",
    "nccl_p2p_off": "NCCL via torch.distributed with NCCL_P2P_DISABLE=1 (through host memory)",
    "flashinfer_pcie_ipc": "FlashInfer PCIe-IPC all-reduce (vLLM 0.34 opt-in: "
                           "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1), prepared for the "
                           "measured token counts",
    "gloo": "gloo on CPU (mechanics check of the benchmark, not a GPU measurement)",
}


# ---------------------------------------------------------------------------------------------
# arguments
# ---------------------------------------------------------------------------------------------


def _ints(text: str) -> tuple[int, ...]:
    vals = tuple(int(x) for x in text.split(",") if x.strip())
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="allreduce_bench.py",
        description="All-reduce / all-gather latency at Kimi-K2.5 decode sizes, written as a "
                    "cost-model latency table. Run under torchrun, or with --launch N.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("allreduce.json"),
                    help="latency-table JSON to write (default allreduce.json)")
    ap.add_argument("--launch", type=int, metavar="N",
                    help="start N ranks with torchrun yourself (one launch per P2P setting)")
    ap.add_argument("--p2p", choices=("default", "on", "off", "both"), default=None,
                    help="with --launch: NCCL peer-to-peer setting(s) to measure (default: "
                         "both on CUDA, default on CPU)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cuda (NCCL, FlashInfer) or cpu (gloo mechanics check)")
    ap.add_argument("--backends", default=None,
                    help="comma list of nccl, flashinfer_pcie_ipc (cuda) or gloo (cpu); "
                         "default: all for the device")
    ap.add_argument("--tokens", type=_ints, default=DEFAULT_TOKENS,
                    help="all-reduce token counts T of [T, hidden] (default 1,4,8,16,32,64,256)")
    ap.add_argument("--hidden", type=int, default=HIDDEN, help="hidden size (default 7168)")
    ap.add_argument("--logit-rows", type=_ints, default=DEFAULT_LOGIT_ROWS,
                    help="all-gather rows of [rows, vocab] logits (default 1,4,8,16)")
    ap.add_argument("--vocab", type=int, default=VOCAB, help="vocabulary (default 163840)")
    ap.add_argument("--no-allgather", action="store_true", help="all-reduce only")
    ap.add_argument("--mode", choices=("graph", "eager"), default="graph",
                    help="CUDA-graph replay (default, as vLLM decodes) or eager launches")
    ap.add_argument("--inner", type=int, default=20, help="collectives per timed replay")
    ap.add_argument("--reps", type=int, default=50, help="timed replays per point")
    ap.add_argument("--warmup", type=int, default=10, help="untimed replays per point")
    ap.add_argument("--quick", action="store_true", help="fewer replays (--reps 10 --inner 5)")
    ap.add_argument("--name", default=None, help="table name (default measured-<gpu>-x<N>)")
    ap.add_argument("--base", default=None,
                    help="existing latency table (JSON path, or a shipped profile name when "
                         "vllm_kimi_ext is importable) whose other backends are kept")
    ap.add_argument("--timeout", type=float, default=900.0,
                    help="with --launch: seconds per launch before it is killed")
    ap.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--nccl-label", default="nccl", help=argparse.SUPPRESS)
    return ap


def resolve_args(args: argparse.Namespace) -> argparse.Namespace:
    if args.quick:
        args.reps, args.inner, args.warmup = (min(args.reps, 10), min(args.inner, 5),
            min(args.warmup, 3))
    if args.backends is None:
        args.backends = "gloo" if args.device == "cpu" else "nccl,flashinfer_pcie_ipc"
    args.backend_list = [b.strip() for b in args.backends.split(",") if b.strip()]
    ok = {"cpu": {"gloo"}, "cuda": {"nccl", "flashinfer_pcie_ipc"}}[args.device]
    bad = [b for b in args.backend_list if b not in ok]
    if bad:
        raise SystemExit(f"allreduce_bench.py: backend(s) {bad} not available with --device "
                         f"{args.device} (choose from {sorted(ok)})")
    if args.p2p is None:
        args.p2p = "both" if args.device == "cuda" else "default"
    return args


def allreduce_sizes(tokens, hidden) -> list[int]:
    return sorted({t * hidden * ELEM for t in tokens})


def allgather_sizes(tokens, hidden, logit_rows, vocab) -> list[int]:
    return sorted({t * hidden * ELEM for t in tokens} | {r * vocab * ELEM for r in logit_rows})


# ---------------------------------------------------------------------------------------------
# statistics and the latency table
# ---------------------------------------------------------------------------------------------


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        raise ValueError("no samples")
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(per_rank: list[list[float]]) -> dict[str, float]:
    """Samples (us per collective) per rank and replay -> stats over the slowest rank."""
    slowest = [max(vals) for vals in zip(*per_rank)]
    return {
        "p50_us": round(percentile(slowest, 0.5), 3),
        "p10_us": round(percentile(slowest, 0.1), 3),
        "p90_us": round(percentile(slowest, 0.9), 3),
        "mean_us": round(sum(slowest) / len(slowest), 3),
        "min_us": round(min(slowest), 3),
        "reps": len(slowest),
    }


def monotone_curve(records: list[dict]) -> list[list[float]]:
    """``[[bytes, us], ...]`` from per-point medians, strictly increasing in bytes and
    non-decreasing in latency (running maximum), as the cost model's loader requires."""
    pts = sorted((int(r["bytes"]), float(r["p50_us"])) for r in records)
    out: list[list[float]] = []
    hi = 0.0
    for b, us in pts:
        if out and b == out[-1][0]:
            continue
        hi = max(hi, us, 1e-3)
        out.append([b, round(hi, 2)])
    return out


def _load_base(base: str) -> dict:
    if base.endswith(".json") and Path(base).is_file():
        return json.loads(Path(base).read_text())
    try:
        from vllm_kimi_ext.costmodel.catalog import load_raw
    except ImportError:
        raise SystemExit(f"--base {base!r}: not a JSON file, and vllm_kimi_ext (for shipped "
                         "profile names) is not importable") from None
    return load_raw("latency", base)


def build_table(partials: list[dict], *, name: str | None = None, base: dict | None = None,
                base_name: str | None = None) -> dict:
    """Merge worker outputs (one per launch) into one latency table."""
    meta = partials[0].get("measurement", {}) if partials else {}
    backends: dict[str, dict] = {}
    errors: dict[str, str] = {}
    for part in partials:
        for label, b in part.get("backends", {}).items():
            ops = {op: monotone_curve(recs) for op, recs in b["measurements"].items()
                   if len(recs) >= 2}
            if not ops:
                errors[label] = "fewer than two measured sizes"
                continue
            backends[label] = {
                "description": DESCRIPTIONS.get(label, label),
                "max_bytes": None,
                "ops": ops,
                "measurements": b["measurements"],
                "env": b.get("env", {}),
            }
        errors.update(part.get("errors", {}))
    gpu = (meta.get("devices") or ["unknown"])[0]
    world = meta.get("world_size", "?")
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    table = {
        "name": name or f"measured-{slug}-x{world}",
        "description": f"{world}x {gpu}, measured by bench/allreduce_bench.py",
        "units": dict(SCHEMA_UNITS),
        "provenance": [
            (f"MEASURED on {socket.gethostname()} ({world}x {gpu}) by bench/allreduce_bench.py "
            f"on {meta.get('date', '?')}: torch {meta.get('torch')}, NCCL {meta.get('nccl')}, "
            f"mode {meta.get('mode')}."),
            (f"Each point: {meta.get('inner')} collectives back to back per "
            f"{'CUDA-graph replay' if meta.get('mode') == 'graph' else 'timed batch'}, "
            f"{meta.get('reps')} timed replays after {meta.get('warmup')} warm-up; per replay "
            "the slowest rank; the point is the median. Curves are the running maximum of the "
            "medians; raw p10/p50/p90 under backends.<name>.measurements."),
        ],
        "backends": {},
        "measurement": meta,
    }
    if errors:
        table["not_measured"] = errors
        table["provenance"].append("Not measured: " + "; ".join(
            f"{k}: {v}" for k, v in sorted(errors.items())))
    if base is not None:
        kept = [b for b in base.get("backends", {}) if b not in backends]
        table["backends"].update({b: base["backends"][b] for b in kept})
        if kept:
            table["provenance"].append(
                f"Carried over unmeasured from {base_name or base.get('name')}: "
                f"{', '.join(kept)} (see that table's provenance).")
    table["backends"].update(backends)
    return table


# ---------------------------------------------------------------------------------------------
# worker (one process per rank, under torchrun)
# ---------------------------------------------------------------------------------------------


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _time_point(fn, args, cpu_group, world: int, capture_stream=None) -> dict[str, float]:
    """Time ``fn`` (one collective) and return stats over ranks and replays. In graph mode
    the warm-up and the capture run on ``capture_stream`` (default: a new side stream)."""
    import torch
    import torch.distributed as dist

    samples: list[float] = []
    mode = args.device == "cuda" and args.mode
    if args.device == "cpu":
        for _ in range(args.warmup):
            fn()
        for _ in range(args.reps):
            dist.barrier(group=cpu_group)
            t0 = time.perf_counter()
            for _ in range(args.inner):
                fn()
            samples.append((time.perf_counter() - t0) * 1e6 / args.inner)
    else:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        graph = None
        if mode == "graph":
            stream = capture_stream or torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(args.inner):
                    fn()
            torch.cuda.synchronize()

        def batch():
            if graph is not None:
                graph.replay()
            else:
                for _ in range(args.inner):
                    fn()

        for _ in range(args.warmup):
            batch()
        torch.cuda.synchronize()
        for _ in range(args.reps):
            dist.barrier(group=cpu_group)
            start.record()
            batch()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3 / args.inner)
        del graph
    gathered: list[list[float] | None] = [None] * world
    dist.all_gather_object(gathered, samples, group=cpu_group)
    return summarize([g for g in gathered if g is not None])


def _bench_torch(label, args, rank, world, cpu_group, device) -> dict:
    import torch
    import torch.distributed as dist

    dtype = torch.bfloat16
    # correctness first: every rank contributes rank + 1
    x = torch.full((4, args.hidden), float(rank + 1), dtype=dtype, device=device)
    dist.all_reduce(x)
    _sync(args.device)
    want = world * (world + 1) / 2
    if not torch.all(x == want):
        raise RuntimeError(f"{label}: all-reduce returned {x.flatten()[0].item()}, "
                           f"expected {want}")
    meas: dict[str, list[dict]] = {"allreduce": []}
    for nbytes in allreduce_sizes(args.tokens, args.hidden):
        buf = torch.zeros(nbytes // ELEM, dtype=dtype, device=device)
        st = _time_point(lambda buf=buf: dist.all_reduce(buf), args, cpu_group, world)
        meas["allreduce"].append({"bytes": nbytes, "tokens": nbytes // ELEM // args.hidden,
                                  **st})
        if rank == 0:
            print(f"[{label}] allreduce {nbytes:>10d} B  p50 {st['p50_us']:9.2f} us",
                  flush=True)
    if not args.no_allgather:
        # all_gather_single is the newer name of all_gather_into_tensor (same collective)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        meas["allgather"] = []
        for nbytes in allgather_sizes(args.tokens, args.hidden, args.logit_rows, args.vocab):
            n = nbytes // ELEM
            if n % world:
                continue
            out = torch.empty(n, dtype=dtype, device=device)
            inp = torch.zeros(n // world, dtype=dtype, device=device)
            st = _time_point(lambda out=out, inp=inp: gather(out, inp), args, cpu_group, world)
            meas["allgather"].append({"bytes": nbytes, **st})
            if rank == 0:
                print(f"[{label}] allgather {nbytes:>10d} B  p50 {st['p50_us']:9.2f} us",
                      flush=True)
    env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    return {"measurements": meas, "env": env}


def _bench_flashinfer(args, rank, world, cpu_group, device) -> dict:
    import torch
    import torch.distributed as dist

    try:
        import flashinfer.comm as fc
    except ImportError as exc:
        raise _Skip(f"flashinfer not importable ({exc})") from None
    if not hasattr(fc, "PcieIpcAllReduceWorkspace"):
        raise _Skip("this FlashInfer build has no PcieIpcAllReduceWorkspace")
    if world not in (2, 4, 8):
        raise _Skip(f"FlashInfer PCIe IPC supports TP 2/4/8, not {world}")
    dtype = torch.bfloat16
    tokens = tuple(sorted(set(args.tokens)))
    cache = Path(tempfile.gettempdir()) / f"allreduce_bench_pcie_ipc_tp{world}.json"
    ws = fc.PcieIpcAllReduceWorkspace(group=dist.group.WORLD, max_numel=tokens[-1] * args.hidden,
                                      dtype=dtype, tune_batches=tokens, tune_cache=str(cache))
    try:
        torch.cuda.synchronize()
        ws.rebind_stream()
        ws.tune([args.hidden], dtype=dtype, tune_group=cpu_group)
        ws.prepare([(t, args.hidden) for t in tokens], dtype=dtype)
        torch.cuda.synchronize()
        ws.rebind_stream()
        x = torch.full((tokens[0], args.hidden), float(rank + 1), dtype=dtype, device=device)
        y = ws.all_reduce(x)
        torch.cuda.synchronize()
        want = world * (world + 1) / 2
        if not torch.all(y == want):
            raise RuntimeError(f"flashinfer_pcie_ipc: all-reduce returned "
                               f"{y.flatten()[0].item()}, expected {want}")
        meas: dict[str, list[dict]] = {"allreduce": []}
        g = torch.Generator(device=device).manual_seed(rank)
        for t in tokens:
            inp = torch.randn(t, args.hidden, generator=g, device=device).to(dtype)

            def fn(inp=inp):
                return ws.all_reduce(inp)

            if args.mode == "graph":
                # vLLM's capture(): synchronize and rebind the workspace around the capture
                side = torch.cuda.Stream()
                with torch.cuda.stream(side):
                    torch.cuda.synchronize()
                    ws.rebind_stream()
                    try:
                        st = _time_point(fn, args, cpu_group, world, capture_stream=side)
                    finally:
                        torch.cuda.synchronize()
                        ws.rebind_stream()
            else:
                st = _time_point(fn, args, cpu_group, world)
            nbytes = t * args.hidden * ELEM
            meas["allreduce"].append({"bytes": nbytes, "tokens": t, **st})
            if rank == 0:
                print(f"[flashinfer_pcie_ipc] allreduce {nbytes:>10d} B  p50 "
                      f"{st['p50_us']:9.2f} us", flush=True)
        return {"measurements": meas, "env": {}}
    finally:
        ws.destroy()


class _Skip(Exception):
    pass


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("allreduce_bench.py: --device cuda but no CUDA device")
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    cpu_group = dist.new_group(backend="gloo")
    meta = {
        "world_size": world,
        "device": args.device,
        "devices": ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                    if args.device == "cuda" else [_cpu_name()]),
        "hidden": args.hidden,
        "dtype": "bfloat16",
        "tokens": list(args.tokens),
        "mode": args.mode if args.device == "cuda" else "cpu-wallclock",
        "inner": args.inner,
        "reps": args.reps,
        "warmup": args.warmup,
        "torch": torch.__version__,
        "nccl": (".".join(map(str, torch.cuda.nccl.version()))
                 if args.device == "cuda" else None),
        "date": _dt.date.today().isoformat(),
        "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
    }
    part: dict = {"measurement": meta, "backends": {}, "errors": {}}
    for backend in args.backend_list:
        label = args.nccl_label if backend == "nccl" else backend
        try:
            if backend in ("nccl", "gloo"):
                part["backends"][label] = _bench_torch(label, args, rank, world, cpu_group,
                                                       device)
            elif backend == "flashinfer_pcie_ipc":
                part["backends"][label] = _bench_flashinfer(args, rank, world, cpu_group,
                                                            device)
        except _Skip as exc:
            part["errors"][label] = f"skipped: {exc}"
        except Exception as exc:  # noqa: BLE001 - recorded, next backend
            part["errors"][label] = f"failed: {type(exc).__name__}: {exc}"[:400]
        dist.barrier(group=cpu_group)
    if rank == 0:
        if args.worker_out:
            args.worker_out.write_text(json.dumps(part))
        else:
            base = _load_base(args.base) if args.base else None
            write_table(build_table([part], name=args.name, base=base, base_name=args.base),
                        args.out)
    dist.destroy_process_group()
    return 0


def write_table(table: dict, out: Path) -> None:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {out}", flush=True)


# ---------------------------------------------------------------------------------------------
# launcher
# ---------------------------------------------------------------------------------------------


def _forward_args(args: argparse.Namespace) -> list[str]:
    out = ["--device", args.device, "--hidden", str(args.hidden), "--vocab", str(args.vocab),
           "--tokens", ",".join(map(str, args.tokens)),
           "--logit-rows", ",".join(map(str, args.logit_rows)),
           "--mode", args.mode, "--inner", str(args.inner), "--reps", str(args.reps),
           "--warmup", str(args.warmup)]
    if args.no_allgather:
        out.append("--no-allgather")
    return out


def launch_plan(args: argparse.Namespace) -> list[tuple[str, dict[str, str], list[str]]]:
    """[(nccl label, env overrides, backends)] - one torchrun launch each."""
    backends = args.backend_list
    if args.device == "cpu" or args.p2p == "default":
        return [("nccl", {}, backends)]
    if args.p2p == "on":
        return [("nccl", {"NCCL_P2P_DISABLE": "0"}, backends)]
    if args.p2p == "off":
        return [("nccl_p2p_off", {"NCCL_P2P_DISABLE": "1"}, backends)]
    plan = [("nccl", {"NCCL_P2P_DISABLE": "0"}, backends)]
    if "nccl" in backends:
        plan.append(("nccl_p2p_off", {"NCCL_P2P_DISABLE": "1"}, ["nccl"]))
    return plan


def launch(args: argparse.Namespace) -> int:
    parts = []
    failures = []
    with tempfile.TemporaryDirectory(prefix="allreduce_bench_") as tmp:
        for i, (label, env_over, backends) in enumerate(launch_plan(args)):
            part_file = Path(tmp) / f"part{i}.json"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={args.launch}", str(Path(__file__).resolve()),
                   "--worker-out", str(part_file), "--nccl-label", label,
                   "--backends", ",".join(backends), *_forward_args(args)]
            env = {**os.environ, **env_over}
            env.setdefault("OMP_NUM_THREADS", "1")
            print(f"launch {i + 1}: {args.launch} ranks, {','.join(backends)}"
                  f"{' ' + ' '.join(f'{k}={v}' for k, v in env_over.items()) if env_over else ''}",
                  flush=True)
            try:
                proc = subprocess.run(cmd, env=env, timeout=args.timeout, check=False)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
            if rc == 0 and part_file.is_file():
                parts.append(json.loads(part_file.read_text()))
            else:
                failures.append(f"launch {label} ({','.join(backends)}) exited {rc}")
    if not parts:
        print("allreduce_bench.py: no launch produced results: " + "; ".join(failures),
              file=sys.stderr)
        return 1
    base = _load_base(args.base) if args.base else None
    table = build_table(parts, name=args.name, base=base, base_name=args.base)
    if failures:
        table.setdefault("not_measured", {})["launches"] = "; ".join(failures)
    write_table(table, args.out)
    return 0 if not failures else 3


def main(argv: list[str] | None = None) -> int:
    args = resolve_args(build_parser().parse_args(argv))
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return worker(args)
    if args.launch:
        return launch(args)
    build_parser().error("run under torchrun (torchrun --nproc-per-node N "
                         "bench/allreduce_bench.py ...) or pass --launch N")
    return 2


if __name__ == "__main__":
    sys.exit(main())
