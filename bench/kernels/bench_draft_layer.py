"""Compute cost of one EAGLE-3 draft step at Kimi-K2.5 shapes, by placement.

One draft token = one decoder layer (Llama-style as in lightseekorg/kimi-k2.5-eagle3,
or MLA as in lightseekorg/kimi-k2.5-eagle3-mla) on ``[rows, 7168]`` inputs whose
attention sees ``[embeds ‖ hidden]`` (14336 wide), plus the final norm and the lm_head
(163840 rows, or a 32000-row reduced vocabulary). Measured for:

* ``tp1``: the whole layer and head on one GPU (what a replicated TP=1 draft runs on
  every rank);
* ``tp8-shard``: the 1/8 slice one rank runs when the draft is sharded like the target
  (heads, MLP columns/rows and vocab rows divided by 8). Collectives are *not* timed
  here (one GPU); add them from the all-reduce table: 4 per draft token.

Plain torch (no vLLM): bf16 matmuls, SDPA over a KV cache of ``--ctx`` tokens, each
configuration captured in a CUDA graph and timed with CUDA events (median of many
replays), so Python and launch overhead are excluded as they would be in vLLM's
CUDA-graph decode. Writes JSON + a markdown table into ``--out``.

    python bench/kernels/bench_draft_layer.py --out bench/reports/draft-layer-h200
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cuda_timing import time_graph  # noqa: E402

HIDDEN = 7168
VOCAB = 163840
REDUCED_VOCAB = 32000
LLAMA = {"heads": 64, "kv_heads": 8, "head_dim": 128, "mlp": 12288}
MLA = {"heads": 64, "q_lora": 1536, "kv_lora": 512, "nope": 128, "rope": 64, "v": 128,
       "mlp": 12288}


def _w(*shape, device):
    return torch.randn(*shape, device=device, dtype=torch.bfloat16) * 0.02


def build_llama(tp: int, vocab: int, ctx: int, rows: int, device):
    h, p = HIDDEN, LLAMA
    nh, nkv, hd = p["heads"] // tp, max(1, p["kv_heads"] // tp), p["head_dim"]
    w = {
        "qkv": _w((nh + 2 * nkv) * hd, 2 * h, device=device),
        "o": _w(h, nh * hd, device=device),
        "gate_up": _w(2 * p["mlp"] // tp, h, device=device),
        "down": _w(h, p["mlp"] // tp, device=device),
        "head": _w(vocab // tp, h, device=device),
        "k_cache": _w(1, nkv, ctx, hd, device=device),
        "v_cache": _w(1, nkv, ctx, hd, device=device),
    }
    x = _w(rows, 2 * h, device=device)

    def step():
        qkv = x @ w["qkv"].t()
        q = qkv[:, : nh * hd].view(1, rows, nh, hd).transpose(1, 2)
        k = w["k_cache"].repeat_interleave(nh // nkv, dim=1)
        v = w["v_cache"].repeat_interleave(nh // nkv, dim=1)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(rows, nh * hd)
        y = a @ w["o"].t()
        gu = F.rms_norm(y, (h,)) @ w["gate_up"].t()
        g, u = gu.chunk(2, dim=-1)
        y = y + (F.silu(g) * u) @ w["down"].t()
        return F.rms_norm(y, (h,)) @ w["head"].t()

    return step, sum(t.numel() * 2 for k, t in w.items() if "cache" not in k)


def build_mla(tp: int, vocab: int, ctx: int, rows: int, device):
    """Absorbed MLA decode (what vLLM runs for decode): q through q_a/q_b, the
    latent KV cache (kv_lora + rope) shared by all heads, W_UK/W_UV absorbed."""
    h, p = HIDDEN, MLA
    nh = p["heads"] // tp
    w = {
        "q_a": _w(p["q_lora"], 2 * h, device=device),
        "q_b": _w(nh * (p["nope"] + p["rope"]), p["q_lora"], device=device),
        "kv_a": _w(p["kv_lora"] + p["rope"], 2 * h, device=device),
        "w_uk": _w(nh, p["nope"], p["kv_lora"], device=device),
        "w_uv": _w(nh, p["kv_lora"], p["v"], device=device),
        "o": _w(h, nh * p["v"], device=device),
        "gate_up": _w(2 * p["mlp"] // tp, h, device=device),
        "down": _w(h, p["mlp"] // tp, device=device),
        "head": _w(vocab // tp, h, device=device),
        "latent": _w(1, 1, ctx, p["kv_lora"] + p["rope"], device=device),
    }
    x = _w(rows, 2 * h, device=device)

    def step():
        q = (F.rms_norm(x @ w["q_a"].t(), (p["q_lora"],)) @ w["q_b"].t()).view(
            rows, nh, p["nope"] + p["rope"])
        _ = x @ w["kv_a"].t()  # the new token's latent (written to the cache in vLLM)
        q_lat = torch.einsum("rhn,hnl->rhl", q[..., : p["nope"]], w["w_uk"])
        q_full = torch.cat([q_lat, q[..., p["nope"]:]], dim=-1).transpose(0, 1).unsqueeze(0)
        lat = w["latent"].expand(1, nh, ctx, -1)
        o_lat = F.scaled_dot_product_attention(q_full, lat, lat[..., : p["kv_lora"]])
        o = torch.einsum("hrl,hlv->rhv", o_lat[0], w["w_uv"]).reshape(rows, nh * p["v"])
        y = o @ w["o"].t()
        gu = F.rms_norm(y, (h,)) @ w["gate_up"].t()
        g, u = gu.chunk(2, dim=-1)
        y = y + (F.silu(g) * u) @ w["down"].t()
        return F.rms_norm(y, (h,)) @ w["head"].t()

    return step, sum(t.numel() * 2 for k, t in w.items() if k != "latent")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", default="1,4,16")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 2
    dev = torch.device("cuda")
    rows_list = [int(r) for r in args.rows.split(",")]
    results = []
    t0 = time.time()
    for style, build in (("llama", build_llama), ("mla", build_mla)):
        for vocab in (VOCAB, REDUCED_VOCAB):
            for rows in rows_list:
                row = {"style": style, "vocab": vocab, "rows": rows, "ctx": args.ctx}
                for placement, tp in (("tp1", 1), ("tp8-shard", 8)):
                    torch.cuda.empty_cache()
                    with torch.no_grad():
                        step, nbytes = build(tp, vocab, args.ctx, rows, dev)
                        us = time_graph([step], reps=args.iters)["median_us"]
                    row[f"{placement}_us"] = round(us, 2)
                    row[f"{placement}_weight_MB"] = round(nbytes / 1e6, 1)
                    row[f"{placement}_GBps"] = round(nbytes / (us * 1e-6) / 1e9, 0)
                row["tp1_over_tp8"] = round(row["tp1_us"] / row["tp8-shard_us"], 2)
                results.append(row)
                print(json.dumps(row), flush=True)
    prov = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "seconds": round(time.time() - t0, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "draft_layer.json").write_text(
        json.dumps({"provenance": prov, "results": results}, indent=2) + "\n")
    lines = [
        "# Draft layer + head compute at Kimi-K2.5 EAGLE-3 shapes",
        "",
        f"{prov['gpu']}, torch {prov['torch']} (CUDA {prov['cuda']}), {prov['date']}. "
        f"One decoder layer (attention over a {args.ctx}-token KV cache) + norm + lm_head, "
        "bf16, CUDA-graph replay, median of "
        f"{args.iters}. `tp8-shard` is one rank's 1/8 slice; collectives not included "
        "(4 per draft token when sharded, 0 at TP=1).",
        "",
        "| layer | vocab | rows | TP=1 µs | 1/8 shard µs | TP=1 / shard | TP=1 weights MB | "
        "TP=1 GB/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(f"| {r['style']} | {r['vocab']} | {r['rows']} | {r['tp1_us']} | "
                     f"{r['tp8-shard_us']} | {r['tp1_over_tp8']} | {r['tp1_weight_MB']} | "
                     f"{r['tp1_GBps']:.0f} |")
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
