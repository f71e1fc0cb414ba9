#!/usr/bin/env python3
"""Sharded top-p on one GPU: exactness on real-model logits and one rank's step time
against vLLM 0.34.0's own top-p + ``rejection_sample`` (V = 163840, TP = 8).

    python bench/kernels/bench_sharded_top_p.py --logits ROWS.pt [--vllm-src DIR]
        [--out-dir DIR] [--quick]

``ROWS.pt``: bf16 logits rows of a real model (``bench/topp_fallback.py
--save-logits``: SmolLM2-135M-Instruct on MT-Bench / HumanEval / GSM8K answers).

1. Exactness on the real rows (V = 49152, TP = 8 simulated in-process, Triton
   backend), T = 1.0 and 0.6, top_p = 0.95: requests of k = 3 drafts + bonus over
   consecutive rows (drafts: the row's argmax or a token sampled from the row),
   token for token against the full-logits reference (``assert_equivalent``), with
   the wider rounds counted. The same rows through vLLM's Triton
   ``apply_top_k_top_p``: rows whose kept set differs from the exact nucleus
   (definition in ``vllm_kimi_ext.verify.reference``) and the probability mass of
   the difference.
2. Time per rank at Kimi dims (V = 163840, TP = 8, rank 0, rows in {4, 16, 64,
   256}, k = 3): the real rows embedded in a 163840-wide row (real ids first, a
   tail of low logits after them), T in {1.0, 0.6}, top_p 0.95.

   * ``ours``: rank 0's whole ``VocabShardedVerifier.verify`` (threshold round(s),
     statistics kernel, merge/decide), every all-gather replaced by a replay of
     the bytes the 8 simulated ranks exchanged for that input (so merges and
     wider rounds are the real ones; communication itself is not timed);
   * ``vllm``: what every rank does after today's full all-gather: the float32
     copy, temperature, ``apply_top_k_top_p`` (Triton) and ``rejection_sample``.

   Eager medians over rotating inputs (a top-p step that may need a wider round
   synchronises with the host once, so it is not graph-captured); vLLM's step is
   also timed as a CUDA graph. Ratios = vLLM / ours.

vLLM's kernels come from the unmodified 0.34.0 source files, as in
``bench_sharded_verify.py`` (``VLLM_FILES`` + ``VLLM_TOPP_FILES``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import itertools
import json
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "kernels"))

import torch
from _cuda_timing import time_eager, time_graph  # noqa: E402
from bench_sharded_verify import (  # noqa: E402
    TP,
    K,
    V,
    _stub_module,
    load_vllm_rejection_sample,
    n_buffers,
    provenance,
    vllm_inputs,
    write_report,
)

TOP_P = 0.95
TEMPS = (1.0, 0.6)
ROWS = (4, 16, 64, 256)
VLLM_TOPP_FILES = (
    "vllm/v1/sample/ops/topk_topp_triton.py",
    "vllm/model_executor/warmup/jit_warmup.py",
    "vllm/model_executor/warmup/jit_warmup_triton_helper.py",
)


# ---------------------------------------------------------------------------
# vLLM's top-k/top-p kernel
# ---------------------------------------------------------------------------
class _CudaPlatform:
    device_type = "cuda"

    def __getattr__(self, name):
        if name.startswith("is_"):
            return lambda *a, **k: name in ("is_cuda", "is_cuda_alike")
        raise AttributeError(name)


def load_vllm_top_k_top_p(src: Path | None, installed: bool):
    """``(apply_top_k_top_p_triton, apply_temperature, info)``; call after
    :func:`load_vllm_rejection_sample` (``installed``: it used an installed vLLM;
    otherwise this extends its stub parents)."""
    if installed:
        mod = importlib.import_module("vllm.v1.sample.ops.topk_topp_triton")
        gum = importlib.import_module("vllm.v1.worker.gpu.sample.gumbel")
        return mod.apply_top_k_top_p_triton, gum.apply_temperature, {"how": "installed vllm"}
    if src is None:
        raise RuntimeError("no --vllm-src")
    root = Path(src).resolve()
    missing = [f for f in VLLM_TOPP_FILES if not (root / f).exists()]
    if missing:
        raise RuntimeError(f"--vllm-src lacks {missing}")
    for pkg in ("vllm.model_executor", "vllm.model_executor.warmup", "vllm.v1.sample",
                "vllm.v1.sample.ops"):
        m = _stub_module(pkg)
        m.__path__ = [str(root.joinpath(*pkg.split(".")))]
    envs = _stub_module("vllm.envs", VLLM_TRITON_JIT_WARMUP_NUM_THREADS=1)
    sys.modules["vllm"].envs = envs
    _stub_module("vllm.platforms", current_platform=_CudaPlatform())
    _stub_module("vllm.utils.gpu_sync_debug", gpu_sync_allowed=contextlib.nullcontext)
    _stub_module("vllm.utils.platform_utils", num_compute_units=lambda index=None:
                 torch.cuda.get_device_properties(index or 0).multi_processor_count)
    mod = importlib.import_module("vllm.v1.sample.ops.topk_topp_triton")
    gum = importlib.import_module("vllm.v1.worker.gpu.sample.gumbel")
    sha = {f: hashlib.sha256((root / f).read_bytes()).hexdigest()[:16] for f in VLLM_TOPP_FILES}
    return mod.apply_top_k_top_p_triton, gum.apply_temperature, {
        "how": "unmodified 0.34.0 source files, stub parents", "sha256_16": sha}


# ---------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------
def requests_over(rows: torch.Tensor, temp: float, gen: torch.Generator, device="cuda"):
    """A batch of k = 3 drafts + bonus per 4 consecutive rows (drafts: argmax or sampled)."""
    from vllm_kimi_ext.verify import VerifyBatch

    n = rows.shape[0] // (K + 1)
    z = rows[: n * (K + 1)].float()
    probs = torch.softmax(z / temp, dim=1)
    sampled = torch.multinomial(probs, 1, generator=gen).squeeze(1)
    pick = torch.where(torch.rand(z.shape[0], generator=gen) < 0.5, z.argmax(dim=1), sampled)
    drafts = pick.view(n, K + 1)[:, :K]  # the draft verified at row j: a token of row j
    seeds = torch.randint(0, 2**62, (n,), generator=gen)
    b = VerifyBatch.from_draft_tokens(drafts, [temp] * n, seeds, device=device,
                                      top_p=[TOP_P] * n,
                                      positions=(500 + torch.arange(K + 1)).repeat(n))
    return b, rows[: n * (K + 1)], drafts, seeds


def kimi_width(rows: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Real rows first, then a tail of low logits up to V = 163840 (bf16)."""
    n, v = rows.shape
    tail = rows.float().min(dim=1, keepdim=True).values - 4 + torch.randn(n, V - v,
                                                                           generator=gen) * 0.3
    return torch.cat([rows.float(), tail], dim=1).to(torch.bfloat16)


# ---------------------------------------------------------------------------
# 1. exactness on real logits
# ---------------------------------------------------------------------------
def exactness(real: torch.Tensor, topk_topp) -> dict:
    from testkit.verify_equivalence import assert_equivalent
    from testkit.verify_simulate import simulate_sharded_verify
    from vllm_kimi_ext.verify import ReferenceVerifier, VocabShardedVerifier
    from vllm_kimi_ext.verify.reference import sampling_keep_mask

    gen = torch.Generator().manual_seed(1)
    v = real.shape[1]
    out = {"rows": int(real.shape[0]), "vocab": v, "cases": []}
    S = -(-v // TP)
    for temp in TEMPS:
        b, z, _, _ = requests_over(real, temp, gen)
        z = z.cuda()
        # compile the kernels once in this thread, at the ranks' shapes, before they start
        VocabShardedVerifier(v, TP, 0, lambda t: t[None].expand(TP, *t.shape).contiguous(),
                             backend="triton").verify(z[:, :S].contiguous(), b)
        rec = {"temperature": temp, "top_p": TOP_P}
        made: list = []
        sh, group, outs = simulate_sharded_verify(z, b, TP, v, backend="triton",
                                                  verifier_cls=_recording(made))
        assert all(torch.equal(o.sampled, sh.sampled) for o in outs[1:])
        ref = ReferenceVerifier(v).verify(z, b)
        try:
            rec["sharded_vs_reference"] = assert_equivalent(
                ref, sh, b, logits=z, vocab_size=v, allow_score_ties=True).__dict__
        except AssertionError as e:  # reported, not hidden
            rec["sharded_vs_reference"] = {"FAILED": str(e)[:2000], "num_reqs": b.num_reqs,
                                           "identical": -1, "certified_accept_flips": 0,
                                           "certified_residual_ties": 0}
        rec["escalations_rank0"] = dict(made[0].escalations)
        rec["collectives_rank0"] = [shape for shape, _ in group.calls[0]]
        # vLLM's own kernel on the same rows vs the exact nucleus
        for name, rows in (("real_width", z.float()),
                           ("kimi_width", kimi_width(z.cpu(), gen).cuda().float())):
            s = rows / temp
            n = s.shape[0]
            exact, _ = sampling_keep_mask(s, torch.zeros(n, dtype=torch.long, device=s.device),
                                          torch.zeros(n, device=s.device),
                                          torch.full((n,), TOP_P, device=s.device))
            rec[f"vllm_mask_{name}"] = compare_masks(s, exact, topk_topp)
            # <= 64 rows take vLLM's split-row pipeline, more rows its monolithic kernel
            rec[f"vllm_mask_{name}_64_rows"] = compare_masks(s[:64], exact[:64], topk_topp)
        out["cases"].append(rec)
    return out


def _recording(made: list):
    """A verifier class that appends every instance to ``made``."""
    from vllm_kimi_ext.verify import VocabShardedVerifier

    class Recorder(VocabShardedVerifier):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    return Recorder


def compare_masks(s: torch.Tensor, exact: torch.Tensor, topk_topp) -> dict:
    if topk_topp is None:
        return {"status": "not run"}
    try:
        return _compare_masks(s, exact, topk_topp)
    except Exception as e:  # noqa: BLE001 - reported
        return {"status": f"failed: {e!r}"[:500]}


def _compare_masks(s: torch.Tensor, exact: torch.Tensor, topk_topp) -> dict:
    n = s.shape[0]
    kept = topk_topp(s.clone(), None, torch.full((n,), TOP_P, device=s.device)) > float("-inf")
    p = torch.softmax(s.double(), dim=1)
    diff = kept != exact
    rows = diff.any(dim=1)
    return {"rows": n, "rows_differing": int(rows.sum()),
            "extra_tokens": int((kept & ~exact).sum()), "missing_tokens": int((exact & ~kept)
                                                                                 .sum()),
            "max_row_mass_of_difference": float((p * diff).sum(dim=1).max()),
            "nucleus_tokens_exact": int(exact.sum())}


# ---------------------------------------------------------------------------
# 2. time per rank
# ---------------------------------------------------------------------------
def recorded_gathers(z: torch.Tensor, b, rank: int) -> list[torch.Tensor]:
    """Run the 8 ranks once; return what ``rank``'s all-gathers returned, in order."""
    from testkit.verify_simulate import run_ranks, shard_columns
    from vllm_kimi_ext.verify import VocabShardedVerifier

    shards = shard_columns(z, TP, V)
    got: list[torch.Tensor] = []

    def fn(r, ag):
        def rec(t):
            o = ag(t)
            if r == rank:
                got.append(o.clone())
            return o

        return VocabShardedVerifier(V, TP, r, rec, backend="triton").verify(shards[r], b)

    run_ranks(TP, fn)
    return got


class Replay:
    """An all-gather that returns the recorded bytes of the current input, in order."""

    def __init__(self):
        self.queue: list[torch.Tensor] = []
        self.i = 0

    def load(self, gathers):
        self.queue, self.i = gathers, 0

    def __call__(self, t):
        o = self.queue[self.i]
        self.i += 1
        assert o.shape[1:] == t.shape, (o.shape, t.shape)
        return o


def bench_case(rows: int, temp: float, real: torch.Tensor, rej, topk_topp, apply_temp,
               l2: int, gen: torch.Generator) -> dict:
    from vllm_kimi_ext.verify import VocabShardedVerifier

    S, rank = V // TP, 0
    idx = torch.linspace(0, real.shape[0] - 1, rows).long()
    nbuf = min(8, n_buffers(rows * V * 2, l2))
    inputs = []
    for j in range(nbuf):
        perm = idx[torch.randperm(rows, generator=gen)] if j else idx
        b, z, drafts, seeds = requests_over(kimi_width(real[perm], gen), temp, gen)
        z = z.cuda()
        if j == 0:  # compile at these shapes in this thread before the rank threads run
            VocabShardedVerifier(V, TP, 0, lambda t: t[None].expand(TP, *t.shape).contiguous(),
                                 backend="triton").verify(z[:, :S].contiguous(), b)
        inputs.append((b, z, drafts.cuda(), seeds.cuda(), recorded_gathers(z, b, rank)))
    replay = Replay()
    v = VocabShardedVerifier(V, TP, rank, replay, backend="triton")
    cycle = itertools.cycle(inputs)

    def ours():
        b, z, _, _, g = next(cycle)
        replay.load(g)
        return v.verify(z[:, rank * S:(rank + 1) * S], b)

    rec = {"rows": rows, "temperature": temp, "top_p": TOP_P, "buffers": nbuf,
           "all_gathers_per_input": [len(x[4]) for x in inputs]}
    rec["ours_eager_us"] = time_eager(ours)
    rec["ours_collectives"] = [(c.name, c.rows, c.width) for c in v.last_plan.collectives]
    if rej is not None and topk_topp is not None:
        try:
            rec.update(_time_vllm(inputs, rows, temp, rej, topk_topp, apply_temp))
        except Exception as e:  # noqa: BLE001 - reported
            rec["vllm_error"] = repr(e)[:1000]
        if "vllm_eager_us" in rec:
            rec["ratio_vllm_over_ours_eager"] = rec["vllm_eager_us"] / rec["ours_eager_us"]
            rec["ratio_vllm_graph_over_ours_eager"] = (rec["vllm_graph"]["median_us"]
                                                       / rec["ours_eager_us"])
    return rec


def _time_vllm(inputs, rows, temp, rej, topk_topp, apply_temp) -> dict:
    """Eager and graph medians of vLLM's per-rank top-p verification: float32 copy,
    temperature, ``apply_top_k_top_p`` (Triton), ``rejection_sample``."""
    kw = [vllm_inputs(rows, temp, d, s) for _, _, d, s, _ in inputs]
    p_rows = torch.full((rows,), TOP_P, device="cuda")

    def vllm_call(j):
        z, k = inputs[j][1], kw[j]

        def call():
            x = torch.empty_like(z, dtype=torch.float32).copy_(z)
            apply_temp(x, k["expanded_idx_mapping"], k["temperature"])
            x = topk_topp(x, None, p_rows)
            return rej(x, **k)

        return call

    calls = [vllm_call(j) for j in range(len(inputs))]
    it = itertools.cycle(calls)
    return {"vllm_eager_us": time_eager(lambda: next(it)()), "vllm_graph": time_graph(calls)}


def markdown(report: dict) -> str:
    prov = report["provenance"]
    lines = [
        "# Sharded top-p vs vLLM 0.34.0 top-p + `rejection_sample` (one H200, per rank)",
        "",
        f"GPU: {prov['gpu']} ({prov['sm_count']} SMs); torch {prov['torch']}, Triton "
        f"{prov['triton']}; {prov['date_utc']}. vLLM kernels: {report['vllm_status']}.",
        "",
        "## Exactness on real-model logits (bf16, TP = 8 simulated, Triton backend)", "",
        "| T | requests | identical | certified flips | wider rounds (rank 0) | "
        "vLLM mask vs exact nucleus: rows differing (V=49152) | (V=163840) | "
        "max mass of the difference |",
        "|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for c in report["exactness"]["cases"]:
        e = c["sharded_vs_reference"]
        m1, m2 = c["vllm_mask_real_width"], c["vllm_mask_kimi_width"]
        worst = max(m.get("max_row_mass_of_difference", 0.0) for m in (m1, m2))
        lines.append(
            f"| {c['temperature']:g} | {e['num_reqs']} | {e['identical']} | "
            f"{e['certified_accept_flips'] + e['certified_residual_ties']} | "
            f"{c['escalations_rank0']} | {m1.get('rows_differing', 'n/a')} / {m1.get('rows')} | "
            f"{m2.get('rows_differing', 'n/a')} / {m2.get('rows')} | {worst:.2e} |")
    lines += ["", "## Time per rank at V = 163840, TP = 8 (us, medians)", "",
              "| rows | T | ours (eager) | vLLM (eager) | vLLM (graph) | vLLM eager / ours | "
              "vLLM graph / ours | collectives (ours) |",
              "|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in report["results"]:
        vg = r.get("vllm_graph", {}).get("median_us")
        lines.append(
            f"| {r['rows']} | {r['temperature']:g} | {r['ours_eager_us']:.1f} | "
            f"{r.get('vllm_eager_us', float('nan')):.1f} | "
            f"{float('nan') if vg is None else vg:.1f} | "
            f"{r.get('ratio_vllm_over_ours_eager', float('nan')):.2f} | "
            f"{r.get('ratio_vllm_graph_over_ours_eager', float('nan')):.2f} | "
            + ", ".join(f"{n}[{a}x{w}]" for n, a, w in r["ours_collectives"]) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--logits", type=Path, required=True)
    ap.add_argument("--vllm-src", type=Path, default=None)
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "reports")
    ap.add_argument("--name", default="verify_top_p_vs_vllm_h200")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    real = torch.load(a.logits)["logits_bf16"]
    report: dict = {}
    rej = topk_topp = apply_temp = None
    info: dict = {}
    try:
        rej, info = load_vllm_rejection_sample(a.vllm_src)
        topk_topp, apply_temp, info2 = load_vllm_top_k_top_p(
            a.vllm_src, info["how"] == "installed vllm")
        info["top_k_top_p"] = info2
        report["vllm_status"] = f"ran ({info['how']})"
    except Exception as e:  # noqa: BLE001
        info["error"] = repr(e)
        info["trace"] = traceback.format_exc()[-3000:]
        report["vllm_status"] = f"NOT run: {e!r}"
        print(info["trace"], flush=True)
    report["provenance"] = provenance(info)
    report["exactness"] = exactness(real, topk_topp)
    print(json.dumps(report["exactness"], default=str)[:3000], flush=True)
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 60 << 20) or (60 << 20)
    gen = torch.Generator().manual_seed(0)
    report["results"] = []
    for rows in (ROWS[:2] if a.quick else ROWS):
        for temp in TEMPS:
            r = bench_case(rows, temp, real, rej, topk_topp, apply_temp, l2, gen)
            report["results"].append(r)
            print(json.dumps(r, default=str), flush=True)
            torch.cuda.empty_cache()
    write_report(report, a.out_dir, a.name, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
