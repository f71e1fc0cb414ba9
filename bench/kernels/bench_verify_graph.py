#!/usr/bin/env python3
"""The graph-captured sharded verification step against vLLM 0.34.0's graph-captured
verify step, per rank on one GPU (V = 163840, TP = 8, k in {3, 7}).

    python bench/kernels/bench_verify_graph.py --vllm-src DIR [--logits ROWS.pt]
        [--out-dir DIR] [--quick]

``ROWS.pt``: bf16 logits rows of a real model (``bench/topp_fallback.py
--save-logits``), embedded at Kimi width (real ids first, then a tail of low
logits); without it, synthetic rows (a heavy-tailed softmax) are used and the
report says so.

Modes: ``top_p_T1`` (T = 1.0, top_p 0.95: Kimi's thinking mode), ``top_p_T0.6``
(instant mode), ``greedy``, ``topk_minp`` (T = 1.0, top_k 50, min_p 0.05).

* ``ours``: rank 0's :class:`vllm_kimi_ext.verify.graph_step.GraphVerifyStep`
  (Triton) captured in one CUDA graph; every all-gather replaced by a copy of the
  bytes the 8 simulated ranks exchanged for that input (recorded eagerly first),
  so the merges are the real ones and communication itself is not timed.
* ``vllm``: what every rank runs after today's full logits all-gather, captured in
  one CUDA graph: the float32 copy, temperature, (min-p, top-k/top-p: vLLM's
  Triton kernels) and ``rejection_sample``.

Also, on the real rows: how often round 1 leaves a cut uncertified (the escalation
round's work) and how often a row would be deferred, per mode; and a correctness
pass: the captured step equals the eager step and the full-logits reference.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "kernels"))

import torch
from _cuda_timing import time_graph  # noqa: E402
from vllm_kernels import (  # noqa: E402
    TP,
    V,
    load_vllm_rejection_sample,
    load_vllm_top_k_top_p,
    provenance,
    write_report,
)

ROWS = (4, 16, 64, 256)
KS = (3, 7)
MODES = {
    "top_p_T1": {"temperature": 1.0, "top_p": 0.95, "top_k": 0, "min_p": 0.0},
    "top_p_T0.6": {"temperature": 0.6, "top_p": 0.95, "top_k": 0, "min_p": 0.0},
    "greedy": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0},
    "topk_minp": {"temperature": 1.0, "top_p": 1.0, "top_k": 50, "min_p": 0.05},
}


def synthetic_rows(n: int, gen: torch.Generator) -> torch.Tensor:
    """Heavy-tailed rows (a Zipf-like head over 49152 ids), bf16."""
    v = 49152
    rank = torch.arange(1, v + 1).float()
    base = -1.1 * torch.log(rank)
    z = base[None, :] * (0.5 + torch.rand(n, 1, generator=gen)) * 3
    z = z + torch.randn(n, v, generator=gen) * 0.5
    perm = torch.randperm(v, generator=gen)
    return z[:, perm].to(torch.bfloat16)


def kimi_rows(real: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    n, v = real.shape
    tail = real.float().min(dim=1, keepdim=True).values - 4 + torch.randn(
        n, V - v, generator=gen) * 0.3
    return torch.cat([real.float(), tail], dim=1).to(torch.bfloat16)


def make_batch(z: torch.Tensor, k: int, mode: dict, gen: torch.Generator):
    from vllm_kimi_ext.verify import VerifyBatch

    n = z.shape[0] // (k + 1)
    zz = z[: n * (k + 1)].float().cpu()
    t = mode["temperature"]
    probs = torch.softmax(zz / (t if t > 0 else 1.0), dim=1)
    sampled = torch.multinomial(probs, 1, generator=gen).squeeze(1)
    pick = torch.where(torch.rand(zz.shape[0], generator=gen) < 0.5, zz.argmax(dim=1), sampled)
    drafts = pick.view(n, k + 1)[:, :k]
    seeds = torch.randint(0, 2**62, (n,), generator=gen)
    b = VerifyBatch.from_draft_tokens(
        drafts, [t] * n, seeds, device="cuda", top_p=[mode["top_p"]] * n,
        top_k=[mode["top_k"]] * n, min_p=[mode["min_p"]] * n,
        positions=(500 + torch.arange(k + 1)).repeat(n))
    return b, drafts, seeds


def vllm_kwargs(rows: int, k: int, temp: float, drafts: torch.Tensor, seeds: torch.Tensor):
    n = rows // (k + 1)
    dev = "cuda"
    prev = torch.full((n, 1), 7, dtype=torch.int64, device=dev)
    return {
        "draft_logits_cache": None,
        "draft_sampled": torch.cat([prev, drafts.to(dev)], dim=1).reshape(-1).contiguous(),
        "cu_num_logits": torch.arange(0, rows + 1, k + 1, dtype=torch.int32, device=dev),
        "pos": (1000 + torch.arange(k + 1, device=dev)).repeat(n).to(torch.int64),
        "idx_mapping": torch.arange(n, dtype=torch.int32, device=dev),
        "expanded_idx_mapping": torch.arange(n, dtype=torch.int32,
                                             device=dev).repeat_interleave(k + 1),
        "expanded_local_pos": torch.arange(k + 1, dtype=torch.int32, device=dev).repeat(n),
        "temperature": torch.full((n,), temp, dtype=torch.float32, device=dev),
        "seed": seeds.to(dev).to(torch.int64),
        "num_speculative_steps": k,
    }


def load_min_p():
    return importlib.import_module("vllm.v1.worker.gpu.sample.min_p").apply_min_p


class Replay:
    """An all-gather stand-in that returns recorded bytes (a device copy: graph-safe)."""

    def __init__(self, recorded: list[torch.Tensor]):
        self.bufs = [r.clone() for r in recorded]
        self.src = [r.clone() for r in recorded]
        self.i = 0

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        j = self.i % len(self.bufs)
        self.i += 1
        return self.bufs[j].copy_(self.src[j])


def record_rank0(z: torch.Tensor, b, plan_kw: dict):
    """Run all 8 ranks eagerly (threads); return rank 0's gathered tensors, plan and output."""
    from testkit.verify_simulate import plan_for_layout, run_ranks, shard_columns
    from vllm_kimi_ext.verify.graph_step import GraphVerifyStep
    from vllm_kimi_ext.verify.step_plan import StepInputs

    shards = shard_columns(z, TP, V)
    L = b.layout()
    inp = StepInputs.from_layout(L, V)
    rec: list[torch.Tensor] = []
    res = {}

    def fn(rank, ag):
        def gather(t):
            out = ag(t)
            if rank == 0:
                rec.append(out.clone())
            return out

        step = GraphVerifyStep(V, TP, rank, gather, backend="triton")
        plan = plan_for_layout(L, tp_size=TP, shard_width=step.shard_width, vocab_size=V,
                               logits_bytes=z.element_size(), **plan_kw)
        o = step.run(shards[rank], inp, plan)
        if rank == 0:
            res["plan"], res["out"] = plan, o
        return o

    run_ranks(TP, fn)
    return rec, res["plan"], res["out"], inp, shards[0]


def ours_case(z, b, plan_kw):
    from vllm_kimi_ext.verify.graph_step import GraphVerifyStep

    rec, plan, out, inp, shard0 = record_rank0(z, b, plan_kw)
    replay = Replay(rec)
    step = GraphVerifyStep(V, TP, 0, replay, backend="triton")

    def call():
        replay.i = 0
        return step.run(shard0, inp, plan)

    eager = call()
    same_eager = torch.equal(eager.sampled, out.sampled)
    # capture once, compare the replayed output with the eager one
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gout = call()
    graph.replay()
    torch.cuda.synchronize()
    same_graph = torch.equal(gout.sampled, out.sampled) and torch.equal(gout.num_sampled,
                                                                        out.num_sampled)
    return plan, out, call, same_eager, same_graph


def vllm_case(z, b, k, mode, drafts, seeds, rej, topk_topp, apply_temp, apply_min_p):
    rows = z.shape[0]
    kw = vllm_kwargs(rows, k, mode["temperature"], drafts, seeds)
    p_rows = torch.full((rows,), mode["top_p"], device="cuda")
    k_rows = torch.full((rows,), mode["top_k"], dtype=torch.int64, device="cuda")
    minp = torch.full((rows // (k + 1),), mode["min_p"], device="cuda")

    def call():
        x = torch.empty_like(z, dtype=torch.float32).copy_(z)
        if mode["temperature"] > 0:
            apply_temp(x, kw["expanded_idx_mapping"], kw["temperature"])
            if mode["min_p"] > 0:
                apply_min_p(x, kw["expanded_idx_mapping"], minp)
            if mode["top_p"] < 1 or mode["top_k"] > 0:
                x = topk_topp(x, k_rows if mode["top_k"] > 0 else None,
                              p_rows if mode["top_p"] < 1 else None)
        return rej(x, **kw)

    return call


def warm_gpu(seconds: float = 3.0) -> None:
    """Busy the GPU for a few seconds so the first cases run at steady clocks too."""
    import time

    a = torch.randn(4096, 4096, device="cuda")
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            a = (a @ a).tanh_()
        torch.cuda.synchronize()


def alternate(ours, vllm, rounds: int, per_graph: int) -> tuple[dict, dict]:
    """Time both steps ``rounds`` times each, alternating (ours, vLLM, ours, ...), so a
    clock or thermal drift during the run hits both alike; each side's figure is the
    median of its per-round medians, with every round kept. One CUDA graph holds
    ``per_graph`` steps back to back and its time is divided by them: as in a server,
    where the verify step is queued behind the model's forward, the host's graph launch
    is not part of a step (a graph of one 10 µs step would time mostly the launch)."""
    import statistics

    runs: dict[str, list] = {"ours": [], "vllm": []}
    for _ in range(rounds):
        runs["ours"].append(time_graph([ours] * per_graph))
        runs["vllm"].append(time_graph([vllm] * per_graph))
    out = []
    for name in ("ours", "vllm"):
        med = [r["median_us"] for r in runs[name]]
        out.append({"median_us": statistics.median(med), "round_medians_us": med,
                    "min_us": min(r["min_us"] for r in runs[name]), "rounds": rounds,
                    "steps_per_graph": per_graph})
    return out[0], out[1]


def reference_check(z, b, out) -> dict:
    from testkit.verify_equivalence import assert_equivalent
    from vllm_kimi_ext.verify import ReferenceVerifier
    from vllm_kimi_ext.verify.batch import VerifyOutput

    ref = ReferenceVerifier(V).verify(z, b)
    ours = VerifyOutput(out.sampled, out.num_sampled, out.accept_margin, out.nucleus_margin)
    stopped = out.stopped.nonzero().squeeze(1).tolist()
    if stopped:
        sampled, num = ours.sampled.clone(), ours.num_sampled.clone()
        rt, ot = ref.tokens(), ours.tokens()
        for i in stopped:
            assert rt[i][:len(ot[i])] == ot[i] and len(ot[i]) >= 1
            sampled[i], num[i] = ref.sampled[i], ref.num_sampled[i]
        ours = VerifyOutput(sampled, num, ours.accept_margin, ours.nucleus_margin)
    rep = assert_equivalent(ref, ours, b, logits=z, vocab_size=V, allow_score_ties=True)
    return {"requests": rep.num_reqs, "identical": rep.identical,
            "certified_flips": rep.certified_accept_flips,
            "score_ties": rep.certified_residual_ties,
            "deferred_requests": len(stopped)}


def run(args) -> dict:
    gen = torch.Generator().manual_seed(0)
    if args.logits:
        obj = torch.load(args.logits)
        real = (obj["logits_bf16"] if isinstance(obj, dict) else obj).to(torch.bfloat16)
        source = (f"real rows, {real.shape[0]} x {real.shape[1]} bf16"
                  + (f": {obj['source']}" if isinstance(obj, dict) and "source" in obj else ""))
    else:
        real = synthetic_rows(512, gen)
        source = "synthetic heavy-tailed rows (no --logits given)"
    rej, vinfo = load_vllm_rejection_sample(args.vllm_src)
    topk_topp, apply_temp, tinfo = load_vllm_top_k_top_p(args.vllm_src, vinfo.get("how") ==
                                                         "installed vllm")
    apply_min_p = load_min_p()
    prov = provenance({**vinfo, "top_k_top_p": tinfo})
    report = {"provenance": prov, "logits": source, "cases": [],
              "hardware": prov["gpu"],
              "setup": f"one GPU, rank 0 of TP = 8 simulated (all-gathers replayed), "
                       f"{prov['sm_count']} SMs",
              "versions": {"torch": prov["torch"], "triton": prov["triton"],
                           "python": prov["python"],
                           "vllm_kernels": "0.34.0 source files (unmodified)"},
              "date": prov["date_utc"], "timing_rounds": args.rounds,
              "steps_per_graph": args.per_graph}
    rows_list = ROWS[:2] if args.quick else ROWS
    warm_gpu()
    for k, rows, (mname, mode) in itertools.product(KS, rows_list, MODES.items()):
        if rows % (k + 1):
            continue
        idx = torch.linspace(0, real.shape[0] - 1, rows).long()
        z = kimi_rows(real[idx], gen).cuda()
        b, drafts, seeds = make_batch(z, k, mode, gen)
        case = {"rows": rows, "k": k, "mode": mname, "temperature": mode["temperature"],
                "top_p": mode["top_p"], "top_k": mode["top_k"], "min_p": mode["min_p"]}
        ours_call = vllm_call = None
        try:
            plan, out, ours_call, same_eager, same_graph = ours_case(z, b, {})
            case.update(payload_bytes_per_row_per_rank=plan.bytes_per_row_per_rank,
                        rounds=len(plan.rounds), plan=plan.describe(),
                        uncertified_rows=int(out.uncertified.sum()),
                        deferred_rows=int(out.deferred.sum()),
                        graph_equals_eager=bool(same_eager and same_graph))
            case["reference"] = reference_check(z, b, out)
        except Exception as e:  # noqa: BLE001 - reported
            case["ours_error"] = "".join(traceback.format_exception(e))[-2000:]
        try:
            vllm_call = vllm_case(z, b, k, mode, drafts, seeds, rej, topk_topp, apply_temp,
                                  apply_min_p)
        except Exception as e:  # noqa: BLE001 - reported
            case["vllm_error"] = "".join(traceback.format_exception(e))[-2000:]
        if ours_call is not None and vllm_call is not None:
            t_ours, t_vllm = alternate(ours_call, vllm_call, args.rounds, args.per_graph)
            case.update(ours_graph_us=t_ours["median_us"], ours_graph=t_ours,
                        vllm_graph_us=t_vllm["median_us"], vllm_graph=t_vllm)
        if "ours_graph_us" in case and "vllm_graph_us" in case:
            case["speedup_vs_vllm"] = case["vllm_graph_us"] / case["ours_graph_us"]
        print({x: case.get(x) for x in ("rows", "k", "mode", "ours_graph_us", "vllm_graph_us",
                                         "speedup_vs_vllm", "rounds", "uncertified_rows")},
              flush=True)
        report["cases"].append(case)
    return report


def markdown(report: dict) -> str:
    p = report["provenance"]
    lines = ["# Graph-captured sharded verification vs vLLM 0.34.0 (one H200, per rank)", "",
             f"{p.get('gpu', '')}; torch {p.get('torch', '')}, Triton {p.get('triton', '')}; "
             f"{p.get('date_utc', '')}. vLLM kernels: {p.get('vllm_kernel', {}).get('how', '')}."
             f" Logits: {report['logits']}, embedded at Kimi width (real ids first, then a "
             "tail of low logits). V = 163840, TP = 8 (rank 0; "
             "all-gathers replayed from the bytes 8 simulated ranks exchanged, communication "
             "not timed). Both steps captured in CUDA graphs of "
             f"{report.get('steps_per_graph', 1)} steps back to back (time per step: the "
             "host's graph launch is not part of a step); each time is the median of "
             f"{report.get('timing_rounds', 3)} alternating rounds (ours, vLLM, ours, ...) of 30 "
             "replays each, after a few seconds of GPU warm-up.", "",
             "| k | rows | mode | ours (µs) | vLLM (µs) | vLLM / ours | rounds | bytes/row/rank "
             "| uncertified rows | deferred rows | graph = eager | = reference |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for c in report["cases"]:
        ref = c.get("reference", {})
        ok_ref = (f"{ref.get('identical')}/{ref.get('requests')}" if ref else "—")
        lines.append(
            f"| {c['k']} | {c['rows']} | {c['mode']} | {c.get('ours_graph_us', float('nan')):.1f} "
            f"| {c.get('vllm_graph_us', float('nan')):.1f} "
            f"| {c.get('speedup_vs_vllm', float('nan')):.2f} | {c.get('rounds', '—')} "
            f"| {c.get('payload_bytes_per_row_per_rank', float('nan')):.0f} "
            f"| {c.get('uncertified_rows', '—')} | {c.get('deferred_rows', '—')} "
            f"| {c.get('graph_equals_eager', '—')} | {ok_ref} |")
    errs = [c for c in report["cases"] if "ours_error" in c or "vllm_error" in c]
    if errs:
        lines += ["", "## Errors", ""]
        for c in errs:
            lines.append(f"- k={c['k']} rows={c['rows']} {c['mode']}: "
                         f"{(c.get('ours_error') or c.get('vllm_error'))[-400:]!r}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vllm-src", type=Path, default=None)
    ap.add_argument("--logits", type=Path, default=None)
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "out")
    ap.add_argument("--name", default="verify_graph_vs_vllm_h200")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternating timing rounds per case (ours, vLLM, ours, ...)")
    ap.add_argument("--per-graph", type=int, default=10,
                    help="steps captured back to back in one timed CUDA graph")
    args = ap.parse_args(argv)
    for name in ("rounds", "per_graph"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: expected an integer >= 1, "
                     f"got {getattr(args, name)}")
    if not torch.cuda.is_available():
        print("bench_verify_graph: needs a CUDA device; skipped")
        return 0
    report = run(args)
    write_report(report, args.out_dir, args.name, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
