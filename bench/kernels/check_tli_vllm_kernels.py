"""Cross-tokenizer (``kimi_tli``) drafting through vLLM 0.34.0's own GPU kernels.

    python bench/kernels/check_tli_vllm_kernels.py [--vllm-src DIR] [--draws N] [--out-dir DIR]

What the ``kimi_tli`` speculator does in a server, on one GPU, with vLLM's real
Triton kernels (no vLLM package needed: the same source-file loader as
``_vllm_kernels.py``):

1. proposal logits over the *target* vocabulary from a draft with another
   vocabulary: ``vllm_kimi_ext.drafts.tli.maps.scatter_to_target`` (the function the
   speculator calls), ``-inf`` off the intersection;
2. vLLM's ``gumbel_sample`` draws the draft token *and writes the draft-logits
   cache* (the path Triton's CPU interpreter cannot run);
3. vLLM's ``rejection_sample`` verifies it against the target logits with that
   cache (probabilistic verification) -- or without a cache (greedy drafts).

Checks, over ``--draws`` independent requests that share one target / draft
row (fixed seeds): the emitted token's histogram matches the target
distribution (chi-square, significance 1e-3); the acceptance rate matches
``sum(min(p, q))``; every draft token is a shared token.  A planted bug -- the
cache filled with the draft's logits scattered with ``0`` instead of ``-inf``
off the intersection, so the verifier's q is not the proposal's -- must fail
the same test.  Writes ``tli_vllm_kernels.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "kernels"))

import torch  # noqa: E402

VT, VD, SHARED = 4096, 3000, 2400
ALPHA = 1e-3


def _case(device: str, seed: int = 0):
    from vllm_kimi_ext.drafts.tli.cross_tokenizer import build_intersection

    g = torch.Generator().manual_seed(seed)
    t_ids = torch.randperm(VT, generator=g)[:SHARED]
    d_ids = torch.randperm(VD, generator=g)[:SHARED]
    d_keys: list = [None] * VD
    t_keys: list = [None] * VT
    for i, (t, d) in enumerate(zip(t_ids.tolist(), d_ids.tolist())):
        t_keys[t] = d_keys[d] = f"tok{i}".encode()
    for t in range(VT):
        t_keys[t] = t_keys[t] or f"target-only{t}".encode()
    for d in range(VD):
        d_keys[d] = d_keys[d] or f"draft-only{d}".encode()
    inter = build_intersection(d_keys, t_keys)
    target = torch.randn(VT, generator=g) * 2.5
    draft = torch.randn(VD, generator=g) * 2.5
    # correlate the draft with the target on shared tokens (a plausible draft)
    sd, st = inter.shared_draft_ids, inter.shared_target_ids
    draft[sd] = 0.7 * target[st] + 0.5 * draft[sd]
    return inter, target.to(device), draft.to(device)


def _binned_chi_square(counts: torch.Tensor, probs: torch.Tensor, n: int):
    """Pearson chi-square of ``n`` draws against ``probs``, the tail (expected count < 5)
    pooled into one bin: (statistic, p-value, degrees of freedom)."""
    from testkit.verify_equivalence import chi_square

    order = torch.argsort(probs, descending=True)
    keep = order[probs[order] * n >= 5]
    rest = torch.ones(probs.numel(), dtype=torch.bool)
    rest[keep] = False
    return chi_square(torch.cat([counts[keep], counts[rest].sum().view(1)]),
                      torch.cat([probs[keep], probs[rest].sum().view(1)]))


def run(draws: int, temperature: float, vllm_src: Path | None) -> dict:
    from _vllm_kernels import load_vllm_rejection_sample

    from vllm_kimi_ext.drafts.tli.maps import scatter_to_target

    rejection_sample, info = load_vllm_rejection_sample(vllm_src)
    gumbel_sample = sys.modules["vllm.v1.worker.gpu.sample.gumbel"].gumbel_sample
    dev = "cuda"
    inter, target, draft = _case(dev)
    sd, st = inter.shared_draft_ids.to(dev), inter.shared_target_ids.to(dev)
    n = draws
    p = torch.softmax(target.double() / temperature, -1)
    q = torch.softmax(scatter_to_target(draft[None].double(), sd, st, VT) / temperature, -1)[0]
    expected_accept = float(torch.minimum(p, q).sum())

    idx = torch.arange(n, dtype=torch.int32, device=dev)
    temp = torch.full((n,), temperature, dtype=torch.float32, device=dev)
    seeds = torch.arange(n, dtype=torch.int64, device=dev) * 7919 + 13
    pos = torch.full((n,), 1000, dtype=torch.int64, device=dev)
    target_rows = target.float()[None].expand(2 * n, VT).contiguous()  # verify row + bonus row
    kw = {
        "cu_num_logits": torch.arange(0, 2 * n + 1, 2, dtype=torch.int32, device=dev),
        "pos": torch.tensor([1000, 1001], device=dev).repeat(n),
        "idx_mapping": idx,
        "expanded_idx_mapping": idx.repeat_interleave(2),
        "expanded_local_pos": torch.arange(2, dtype=torch.int32, device=dev).repeat(n),
        "temperature": temp, "seed": seeds, "num_speculative_steps": 1,
    }
    results = {}
    for mode in ("probabilistic", "greedy", "planted_bug_zero_fill"):
        t0 = time.time()
        proposal = scatter_to_target(draft.float()[None].expand(n, VD).contiguous(), sd, st, VT)
        if mode == "greedy":
            x = proposal.argmax(-1)
            cache = None
        else:
            cache = SimpleNamespace(values=torch.zeros(n, 1, VT, device=dev), row_mapping=None)
            x = gumbel_sample(proposal, idx, temp, seeds, pos + 1, apply_temperature=True,
                              is_drafting=True, logits_cache=cache.values,
                              logits_cache_col=torch.zeros((), dtype=torch.int64, device=dev))
            if mode == "planted_bug_zero_fill":
                wrong = torch.zeros(n, VT, device=dev)
                wrong[:, st] = draft.float()[sd]
                cache.values[:, 0] = wrong
        draft_sampled = torch.stack([torch.full_like(x, 7), x], 1).reshape(-1).contiguous()
        sampled, num_sampled = rejection_sample(target_rows, cache, draft_sampled, **kw)
        torch.cuda.synchronize()
        first = sampled[:, 0].long()
        counts = torch.bincount(first, minlength=VT).double().cpu()
        stat, pval, dof = _binned_chi_square(counts, p.cpu(), n)
        accepted = (num_sampled == 2).double().mean().item()
        shared_mask = torch.zeros(VT, dtype=torch.bool, device=dev)
        shared_mask[st] = True
        results[mode] = {
            "chi2": stat, "p_value": pval, "dof": dof,
            "acceptance": accepted,
            "all_drafts_shared": bool(shared_mask[x].all()),
            "seconds": round(time.time() - t0, 2),
        }
    greedy_accept = float(p[int(q.argmax())])
    results["greedy"]["expected_acceptance"] = greedy_accept
    results["probabilistic"]["expected_acceptance"] = expected_accept
    ok = (results["probabilistic"]["p_value"] > ALPHA and results["greedy"]["p_value"] > ALPHA
          and results["planted_bug_zero_fill"]["p_value"] < 1e-12
          and results["probabilistic"]["all_drafts_shared"]
          and abs(results["probabilistic"]["acceptance"] - expected_accept) < 5 / n ** 0.5
          and abs(results["greedy"]["acceptance"] - greedy_accept) < 5 / n ** 0.5)
    return {
        "ok": ok, "draws": n, "temperature": temperature,
        "target_vocab": VT, "draft_vocab": VD, "shared": SHARED, "alpha": ALPHA,
        "results": results,
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "vllm": {k: v for k, v in info.items() if k != "trace"},
    }


def markdown(r: dict) -> str:
    lines = [f"# kimi_tli through vLLM 0.34.0's GPU kernels ({r['device']})", "",
             f"{r['draws']} requests, one draft token each, temperature {r['temperature']}; "
             f"target vocab {r['target_vocab']}, draft vocab {r['draft_vocab']}, "
             f"{r['shared']} shared. torch {r['torch']}, Triton {r['triton']}, "
             f"vLLM {r['vllm'].get('version')} ({r['vllm'].get('how')}).", "",
             "| mode | chi-square p-value | acceptance | expected | drafts all shared |",
             "|---|---|---|---|---|"]
    for mode, m in r["results"].items():
        lines.append(f"| {mode} | {m['p_value']:.3g} | {m['acceptance']:.4f} | "
                     f"{m.get('expected_acceptance', float('nan')):.4f} | "
                     f"{m['all_drafts_shared']} |")
    lines += ["", f"Verdict: {'PASS' if r['ok'] else 'FAIL'} (lossless modes p > {r['alpha']}, "
              "planted bug p < 1e-12, acceptance within 5 standard errors)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-src", type=Path, default=None)
    ap.add_argument("--draws", type=int, default=200_000)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "out")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("check_tli_vllm_kernels: no CUDA device; nothing run")
        return 0
    src = a.vllm_src or next((p for p in (ROOT / ".vllm_src", ROOT / "build" / "vllm-0.34.0")
                              if (p / "vllm").is_dir()), None)
    r = run(a.draws, a.temperature, src)
    dirs = [a.out_dir] + ([Path(os.environ["OUT"])] if os.environ.get("OUT") else [])
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
        (d / "tli_vllm_kernels.json").write_text(json.dumps(r, indent=1, default=str))
        (d / "tli_vllm_kernels.md").write_text(markdown(r))
    print(markdown(r))
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
