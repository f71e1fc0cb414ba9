#!/usr/bin/env python3
"""Per-kernel GPU time of one sharded verify step: the folded escalation against the
whole-row escalation, on the case where the folded step is slowest.

    python bench/kernels/profile_folded.py [--logits ROWS.pt] [--steps N] [--top N]
                                           [--kernels both|new|old]
    python bench/kernels/profile_folded.py --dry-run      # CPU, V = 4096, torch backend

The case is ``bench_verify_graph.py --escalation folded``'s k = 3, 16 rows (4 requests),
``top_p_T1`` (T = 1.0, top_p 0.95), V = 163840, TP = 8, rank 0, built by that benchmark's
own functions with its random draws in its order (the cases ``bench/gpu/release_runs.py``
runs before it are drawn and dropped), so the rows and drafts are the ones it timed. Rank 0's
:class:`vllm_kimi_ext.verify.graph_step.GraphVerifyStep` runs eagerly; its all-gathers
replay the bytes the 8 simulated ranks exchanged (device copies: ``Memcpy DtoD`` below is
that replay, not communication). After ``--warmup`` steps, ``--steps`` steps run under
``torch.profiler`` (CUDA activity); every CUDA kernel / memcpy / memset is summed by name.
Printed per escalation and kernel variant: kernel, calls per step, µs per step, share of the
step's kernel time, then the total; and which rows were uncertified, escalated or deferred.
``--kernels both`` (default) runs each escalation with the faster kernels (``new``: the merge
orders candidates by merging the ranks' sorted runs from 256 per rank, i.e. the folded
escalation's second merge, off by default, see ``verify.merge.MERGE_RUNS_MIN_WIDTH``; the
folded send kernel bisects for its rank keys, the default) and with a full sort / one top-k
everywhere (``old``), and prints, side
by side in the same run, each variant's CUDA-graph time per step and whether the tokens are
the same.

The kernel times add up the GPU's busy time of an eager step: launch gaps are not in them
(a CUDA graph removes most of those), so the totals sit below the benchmark's graph times.

``--dry-run``: the same code path on CPU with a tiny vocabulary (V = 4096, the first 2048
ids of the rows) and the torch backend; the table sums CPU operators' self time instead.

Exit status: 0 clean (also without a CUDA device: nothing to do); 2 usage error or
unreadable input (one line on stderr, ``--debug`` adds the traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
import types
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "kernels"))

import torch  # noqa: E402
from _cuda_timing import time_graph  # noqa: E402
from bench_verify_graph import (  # noqa: E402
    DRY_V,
    MODES,
    TP,
    V,
    _logits_rows,
    kimi_rows,
    make_batch,
    ours_case,
)
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from bench.gpu.release_runs import FOLDED_ARGS  # noqa: E402
from bench.harness.cli import (  # noqa: E402
    EXIT_OK,
    ArgumentParser,
    UsageError,
    add_debug,
    check_input_file,
    positive_int,
    run_cli,
)

PROG = "profile_folded"
#: The profiled case (``bench_verify_graph.py``'s k, rows and mode).
K, ROWS, MODE = 3, 16, "top_p_T1"
DEFAULT_LOGITS = ROOT / "bench" / "out" / "verify_rows_smollm2.pt"
NAME_WIDTH = 64
#: The folded benchmark's committed report (its times and row counts for this case).
REPORT = ROOT / "bench" / "reports" / "verify_folded.json"


def _folded_order() -> tuple[list[int], list[int], list[str]]:
    """``(ks, rows, modes)`` of the folded benchmark run (``FOLDED_ARGS``)."""
    a = dict(zip(FOLDED_ARGS[::2], FOLDED_ARGS[1::2]))
    return ([int(x) for x in a["--ks"].split(",")], [int(x) for x in a["--rows"].split(",")],
            a["--modes"].split(","))


def bench_case(logits: Path, dry: bool):
    """``(z, batch, vocab, source)``: the benchmark's case (K, ROWS, MODE), drawing every
    earlier case of the folded run from the same generator as ``bench_verify_graph.run``."""
    vocab = DRY_V if dry else V
    dev = "cpu" if dry else "cuda"
    gen = torch.Generator().manual_seed(0)
    try:
        obj = torch.load(logits)
        t = obj["logits_bf16"] if isinstance(obj, dict) else obj
        shape = list(t.shape)
        if len(shape) == 2 and shape[0] >= ROWS:
            real, source = _logits_rows(types.SimpleNamespace(logits=logits), gen, dry)
    except Exception as e:  # noqa: BLE001 - an unreadable file is a usage error
        raise UsageError(f"--logits {logits}: not a logits rows file (expected a .pt of bf16 "
                         f"rows from bench/topp_fallback.py --save-logits): "
                         f"{type(e).__name__}: {e}") from e
    if len(shape) != 2 or shape[0] < ROWS:
        raise UsageError(f"--logits {logits}: expected [rows >= {ROWS}, vocab] logits, got "
                         f"{shape}")
    if real.dim() != 2 or real.shape[0] < ROWS:
        raise UsageError(f"--logits {logits}: expected [rows >= {ROWS}, vocab] logits, got "
                         f"{list(real.shape)}")
    for k, rows, mname in itertools.product(*_folded_order()):
        if rows % (k + 1):
            continue
        idx = torch.linspace(0, real.shape[0] - 1, rows).long()
        z = kimi_rows(real[idx], gen, vocab).to(dev)
        b, _, _ = make_batch(z, k, MODES[mname], gen)
        if (k, rows, mname) == (K, ROWS, MODE):
            return z, b, vocab, source
    raise RuntimeError(f"k={K} rows={ROWS} {MODE} is not a case of {' '.join(FOLDED_ARGS)}")


def kernel_times(call, steps: int, warmup: int, cuda: bool) -> dict[str, list[float]]:
    """``{name: [calls, total µs]}`` over ``steps`` profiled calls: CUDA kernels / memcpy /
    memset on a GPU, CPU operators' self time on CPU."""
    for _ in range(warmup):
        call()
    if cuda:
        torch.cuda.synchronize()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            call()
        if cuda:
            torch.cuda.synchronize()
    agg: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if cuda:
            if e.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = e.time_range.elapsed_us()
        else:
            if e.device_type != torch.autograd.DeviceType.CPU:
                continue
            us = e.self_cpu_time_total
        agg[e.name][0] += 1
        agg[e.name][1] += us
    return dict(agg)


def table(title: str, agg: dict[str, list[float]], steps: int, top: int) -> list[str]:
    total = sum(us for _, us in agg.values()) or 1.0
    rows = sorted(agg.items(), key=lambda kv: -kv[1][1])
    out = [f"== {title}", f"{'kernel':<{NAME_WIDTH}} {'calls/step':>10} {'us/step':>9} "
           f"{'share':>6}"]
    for name, (n, us) in rows[:top]:
        short = name if len(name) <= NAME_WIDTH else name[:NAME_WIDTH - 3] + "..."
        out.append(f"{short:<{NAME_WIDTH}} {n / steps:>10.2f} {us / steps:>9.1f} "
                   f"{us / total:>6.1%}")
    rest = rows[top:]
    if rest:
        n, us = sum(r[1][0] for r in rest), sum(r[1][1] for r in rest)
        out.append(f"{f'({len(rest)} more names)':<{NAME_WIDTH}} {n / steps:>10.2f} "
                   f"{us / steps:>9.1f} {us / total:>6.1%}")
    launches = sum(n for n, _ in agg.values())
    out.append(f"{'TOTAL':<{NAME_WIDTH}} {launches / steps:>10.2f} {total / steps:>9.1f} "
               f"{1:>6.1%}")
    return out


def reported_case() -> str:
    """This case's line of the folded benchmark's report, when it has one."""
    try:
        rep = json.loads(REPORT.read_text(encoding="utf-8"))
        c = next(c for c in rep["cases"] if (c["k"], c["rows"], c["mode"]) == (K, ROWS, MODE))
        return (f"{REPORT.relative_to(ROOT)} ({rep['provenance'].get('gpu')}, CUDA graphs): "
                f"folded {c['ours_graph_us']:.1f} us, rows {c['ours_rows_us']:.1f} us, "
                f"uncertified rows {c['uncertified_rows']}, deferred {c['deferred_rows']}")
    except (OSError, ValueError, KeyError, TypeError, StopIteration) as e:
        return f"{REPORT.relative_to(ROOT)}: no such case ({type(e).__name__})"


#: The kernel variants ``--kernels`` compares: the merge by runs from RUNS_FROM candidates per
#: rank and the send kernel's rank bisection (``new``) or a sort of all keys and one top-k
#: (``old``).
RUNS_FROM = 256
VARIANTS = {"new": "merge of sorted runs (wide merges), send by bisection",
            "old": "merge by full sort, send by top-k over all splits"}
KERNELS = {"both": ("new", "old"), "new": ("new",), "old": ("old",)}


@contextlib.contextmanager
def kernel_variant(kern: str):
    """Round 1's merge and the folded send kernel as ``kern`` (``new`` / ``old``)."""
    from vllm_kimi_ext.verify import merge
    from vllm_kimi_ext.verify.escalate import folded

    saved = merge.MERGE_RUNS_MIN_WIDTH, folded.SEND_SELECT
    merge.MERGE_RUNS_MIN_WIDTH, folded.SEND_SELECT = (
        (RUNS_FROM, True) if kern == "new" else (None, False))
    try:
        yield
    finally:
        merge.MERGE_RUNS_MIN_WIDTH, folded.SEND_SELECT = saved


def _idx(t: torch.Tensor) -> list[int]:
    return t.bool().nonzero().squeeze(1).tolist()


def body(args: argparse.Namespace) -> int:
    cuda = not args.dry_run
    if cuda and not torch.cuda.is_available():
        print(f"{PROG}: needs a CUDA device (or --dry-run); skipped")
        return EXIT_OK
    z, b, vocab, source = bench_case(args.logits, args.dry_run)
    backend = "triton" if cuda else "torch"
    unit = "CUDA kernel time" if cuda else "CPU operator self time (dry run)"
    print(f"{PROG}: k={K}, {ROWS} rows ({ROWS // (K + 1)} requests), {MODE} "
          f"(T={MODES[MODE]['temperature']}, top_p {MODES[MODE]['top_p']}), V={vocab}, "
          f"TP={TP} rank 0, backend {backend}; logits: {source}")
    print(f"{unit} per step, mean of {args.steps} eager steps after {args.warmup} warm-up "
          "steps; all-gathers replayed from the 8 simulated ranks' bytes (Memcpy DtoD)")
    totals, graphs, tokens = {}, {}, {}
    for esc, kern in itertools.product(("folded", "rows"), KERNELS[args.kernels]):
        with kernel_variant(kern):
            plan, out, call, same, *_ = ours_case(z, b, vocab, backend, False, esc)
            agg = kernel_times(call, args.steps, args.warmup, cuda)
            if cuda:
                graphs[esc, kern] = time_graph([call] * 4)["median_us"]
        tokens[esc, kern] = (out.sampled.tolist(), out.num_sampled.tolist())
        totals[esc, kern] = sum(us for _, us in agg.values()) / args.steps
        print()
        print(f"-- escalation {esc!r}, {kern} kernels ({VARIANTS[kern]}): "
              f"plan {plan.describe()}")
        print(f"   escalation slots E={plan.escalation_slots}, whole-row slots "
              f"F={getattr(plan, 'row_fallback_slots', None)}, further candidates "
              f"W2={getattr(plan, 'folded_candidates', None)}; uncertified rows "
              f"{_idx(out.uncertified)} ({int(out.uncertified.bool().sum())}), escalated "
              f"(uncertified, not deferred) {_idx(out.uncertified.bool() & ~out.deferred.bool())}"
              f", deferred {_idx(out.deferred)}, stopped requests {_idx(out.stopped)}; "
              f"graph/eager = simulated ranks: {same}")
        print("\n".join(table(f"escalation {esc!r}, {kern} kernels", agg, args.steps,
                               args.top)))
    print()
    if cuda:
        print(f"benchmark: {reported_case()}")
    kerns = KERNELS[args.kernels]
    for kern in kerns:
        f, r = totals["folded", kern], totals["rows", kern]
        print(f"TOTAL per step, {kern} kernels: folded {f:.1f} us, rows {r:.1f} us "
              f"(folded / rows {f / max(r, 1e-9):.2f}x)")
    for esc in ("folded", "rows"):
        same = len({repr(tokens[esc, k]) for k in kerns}) == 1
        line = f"{esc}: same tokens with {' and '.join(kerns)} kernels: {same}"
        if cuda:
            line += ("; CUDA graph us per step (median of 30 replays of 4 steps): " +
                     ", ".join(f"{k} {graphs[esc, k]:.1f}" for k in kerns))
            if len(kerns) == 2:
                line += f" (old / new {graphs[esc, 'old'] / graphs[esc, 'new']:.2f}x)"
        print(line)
    return EXIT_OK


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0],
                        epilog="exit status: 0 clean (or no CUDA device); 2 usage error or "
                               "unreadable input (one line on stderr; --debug shows the "
                               "traceback)")
    ap.add_argument("--logits", type=Path, default=DEFAULT_LOGITS,
                    help="real logits rows (.pt from bench/topp_fallback.py --save-logits); "
                         "default bench/out/verify_rows_smollm2.pt")
    ap.add_argument("--steps", type=positive_int, default=20, help="profiled steps (20)")
    ap.add_argument("--warmup", type=positive_int, default=5, help="warm-up steps (5)")
    ap.add_argument("--top", type=positive_int, default=30,
                    help="kernel names listed per escalation, the rest summed (30)")
    ap.add_argument("--kernels", choices=sorted(KERNELS), default="both",
                    help="merge/send kernel variants to profile side by side: new (merge of "
                         "sorted runs, send by bisection), old (full sort, top-k) or both "
                         "(default)")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU, V = 4096, torch backend: the same code path, CPU operator times")
    add_debug(ap)
    return ap


def parse_args(argv: list[str]) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    check_input_file("--logits", args.logits)
    for name in ("steps", "warmup"):
        if getattr(args, name) > 1000:
            raise UsageError(f"--{name}: expected at most 1000, got {getattr(args, name)}")
    return args


def main(argv=None) -> int:
    return run_cli(PROG, parse_args, body, argv)


if __name__ == "__main__":
    sys.exit(main())
