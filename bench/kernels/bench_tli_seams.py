"""What ``kimi_tli`` adds per draft step on one GPU: the two id-map seams.

    python bench/kernels/bench_tli_seams.py [--out-dir DIR] [--quick]

``kimi_tli`` (vllm_kimi_ext.integration.tli_speculator) adds, per draft forward,
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
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "kernels"))

import torch  # noqa: E402
from _cuda_timing import time_eager, time_graph  # noqa: E402


def _graph_time(fn) -> float:
    """Median µs per call of ``fn`` replayed 10 times in one CUDA graph."""
    return time_graph([fn] * 10, reps=50)["median_us"]

VT = 163840
DRAFT_VOCABS = {"qwen-style 151936": 151936, "llama3-style 128256": 128256, "32000": 32000}
ROWS = (1, 4, 16, 64, 256)
HIDDEN = 1024


def run(quick: bool) -> dict:
    from vllm_kimi_ext.drafts.tli.cross_tokenizer import VocabIntersection
    from vllm_kimi_ext.drafts.tli.maps import (
        gather_table,
        gather_to_target,
        gather_to_target_torch,
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
        gtable = gather_table(VocabIntersection.from_pairs(sd.cpu(), st.cpu(), vd, VT)).to(dev)
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
                return gather_to_target_torch(logits, gtable)

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
                "scatter_eager_us": time_eager(scatter),
                "project_eager_us": time_eager(project),
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
