"""What ``kimi_tli`` adds per draft step on one GPU: the two id-map seams.

    python bench/kernels/bench_tli_seams.py [--out-dir DIR] [--quick]

``kimi_tli`` (vllm_kimi_ext.drafts.tli_speculator) adds, per draft forward,
(1) ``project_inputs``: a gather of one draft id per target input id, and
(2) the proposal logits: the draft's ``[N, Vd]`` logits placed into a ``[N, Vt]``
row of ``-inf`` at the shared target ids.  Three forms of (2) are timed: the
reference ``scatter_to_target`` (index_put over columns), ``pad + index_select``
(``gather_to_target``'s torch path) and the Triton gather kernel the speculator
uses on CUDA (``gather_to_target``); all three give identical results (checked
here too).  Both are timed at
Kimi-K2.5's target vocabulary (163840) for draft vocabularies of other
families (Qwen-style 151936, Llama-3-style 128256, 32000), for N = 1..256 rows,
inside a CUDA graph (as the speculator runs them) and eagerly, next to one
reference the step already pays: a bf16 ``[N, hidden] x [hidden, Vd]`` LM-head
matmul of a 1024-hidden draft.  No collectives are involved (both seams are
rank-local).  Writes ``tli_seams.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

VT = 163840
DRAFT_VOCABS = {"qwen-style 151936": 151936, "llama3-style 128256": 128256, "32000": 32000}
ROWS = (1, 4, 16, 64, 256)
HIDDEN = 1024


def _graph_time(fn, reps: int = 50) -> float:
    """Median µs per call of ``fn`` replayed in a CUDA graph (10 calls per graph)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / 10)
    return statistics.median(times)


def _eager_time(fn, reps: int = 50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return statistics.median(times)


def run(quick: bool) -> dict:
    from vllm_kimi_ext.drafts.cross_tokenizer import VocabIntersection
    from vllm_kimi_ext.drafts.tli import (
        gather_table,
        gather_to_target,
        project_inputs,
        scatter_to_target,
    )

    dev = "cuda"
    rows = ROWS[:3] if quick else ROWS
    results = []
    g = torch.Generator(device=dev).manual_seed(0)
    for name, vd in DRAFT_VOCABS.items():
        shared = min(vd, VT) * 9 // 10  # 90 % of the draft's ids are shared
        sd = torch.randperm(vd, device=dev, generator=g)[:shared]
        st = torch.randperm(VT, device=dev, generator=g)[:shared]
        table = torch.randint(0, vd, (VT,), device=dev, dtype=torch.int32, generator=g)
        d2t = torch.full((vd,), -1, dtype=torch.int64)
        t2d = torch.full((VT,), -1, dtype=torch.int64)
        d2t[sd.cpu()] = st.cpu()
        t2d[st.cpu()] = sd.cpu()
        gtable = gather_table(VocabIntersection(d2t, t2d)).to(dev)
        w = torch.randn(vd, HIDDEN, device=dev, dtype=torch.bfloat16, generator=g)
        for n in rows:
            logits = torch.randn(n, vd, device=dev, dtype=torch.bfloat16, generator=g)
            ids = torch.randint(0, VT, (n,), device=dev, dtype=torch.int32, generator=g)
            h = torch.randn(n, HIDDEN, device=dev, dtype=torch.bfloat16, generator=g)

            def scatter(logits=logits, sd=sd, st=st):
                return scatter_to_target(logits, sd, st, VT)

            def project(ids=ids, table=table):
                return project_inputs(ids, table)

            def gather_triton(logits=logits, gtable=gtable):
                return gather_to_target(logits, gtable)

            def gather_torch(logits=logits, gtable=gtable):
                padded = torch.nn.functional.pad(logits, (0, 1), value=float("-inf"))
                return padded.index_select(1, gtable.long())

            ref = scatter()
            assert torch.equal(ref, gather_triton()) and torch.equal(ref, gather_torch())

            def lm_head(h=h, w=w):
                return h @ w.t()

            results.append({
                "draft_vocab": name, "rows": n, "shared": shared,
                "scatter_graph_us": _graph_time(scatter),
                "gather_triton_graph_us": _graph_time(gather_triton),
                "gather_torch_graph_us": _graph_time(gather_torch),
                "project_graph_us": _graph_time(project),
                "lm_head_graph_us": _graph_time(lm_head),
                "scatter_eager_us": _eager_time(scatter),
                "project_eager_us": _eager_time(project),
            })
            print(json.dumps(results[-1]), flush=True)
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "target_vocab": VT, "hidden_for_reference": HIDDEN, "results": results}


def markdown(r: dict) -> str:
    lines = [f"# kimi_tli id-map seams on {r['device']} (torch {r['torch']})", "",
             f"Target vocabulary {r['target_vocab']}; per draft forward. Reference: the "
             f"draft's own LM-head matmul at hidden {r['hidden_for_reference']} (bf16). "
             "Times are medians in µs inside a CUDA graph (eager in parentheses).", "",
             "| draft vocab | rows | logits: index_put (ref) | pad+index_select | Triton gather "
             "(used) | project inputs | draft LM head (ref) | used seams / LM head |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for x in r["results"]:
        seams = x["gather_triton_graph_us"] + x["project_graph_us"]
        lines.append(
            f"| {x['draft_vocab']} | {x['rows']} | {x['scatter_graph_us']:.1f} "
            f"({x['scatter_eager_us']:.1f}) | {x['gather_torch_graph_us']:.1f} | "
            f"{x['gather_triton_graph_us']:.1f} | {x['project_graph_us']:.1f} "
            f"({x['project_eager_us']:.1f}) | {x['lm_head_graph_us']:.1f} | "
            f"{seams / x['lm_head_graph_us']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "out")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_tli_seams: no CUDA device; nothing run")
        return 0
    r = run(a.quick)
    dirs = [a.out_dir] + ([Path(os.environ["OUT"])] if os.environ.get("OUT") else [])
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
        (d / "tli_seams.json").write_text(json.dumps(r, indent=1))
        (d / "tli_seams.md").write_text(markdown(r))
    print(markdown(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
