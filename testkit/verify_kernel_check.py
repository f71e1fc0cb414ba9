"""Check the Triton shard-statistics kernel against the fused-torch implementation.

Usable on a GPU (``--device cuda``) and on CPU through Triton's interpreter
(``TRITON_INTERPRET=1 python -m testkit.verify_kernel_check --device cpu``).

Criteria (float transcendental functions may differ by a few ulps between
backends; the integer hash may not differ at all):

* ``gval``/``lse``/``s_x``: equal within ``rtol = atol = 2e-5`` (same ``-inf`` pattern);
* ``gidx``: equal, or a certified near-tie: the torch scores of the two
  candidate tokens differ by less than ``1e-5 * max(1, |score|)``;
* the raw 32-bit noise hashes of both backends are compared bit for bit by
  :func:`check_hash_bits` (Triton side through a tiny kernel);
* the merge+decide kernel gives the same ``(sampled, num_sampled)`` as the torch
  path (:func:`check_decide`);
* rows whose own draft token dominates the row (with exclusion on, the
  Gumbel-max must skip it) and cuts with a tie column (ties at the threshold
  kept only up to a column);
* the whole sharded verifier on the Triton backend (top-p, TP = 2) equals the
  full-vocabulary reference (:func:`check_sharded`).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from vllm_kimi_ext.verify.hashing import DOMAIN_GUMBEL, gumbel_noise, row_keys
from vllm_kimi_ext.verify.shard_stats import (
    masked_scaled_shard,
    shard_local_stats_torch,
    shard_local_stats_triton,
)

NEG_INF = float("-inf")


def _case(R, S, V, col_offset, dtype, device, seed, thr=False, scale=4.0, dominant=False):
    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(R, S, generator=g) * scale).round(decimals=1).to(dtype)  # ties
    temps = torch.tensor([[0.0, 1.0, 0.7, 1.9, 0.3][i % 5] for i in range(R)])
    threshold = None
    if thr:
        threshold = torch.where(torch.rand(R, generator=g) < 0.5,
                                torch.randn(R, generator=g) * scale, torch.tensor(NEG_INF))
        threshold = torch.where(temps == 0, torch.tensor(NEG_INF), threshold)
    # drafts: owned by this shard, owned by another, padding ids, placeholders
    draft = torch.randint(max(col_offset - S, 0), col_offset + 2 * S, (R,), generator=g)
    draft = torch.where(torch.rand(R, generator=g) < 0.15, torch.tensor(-1), draft)
    if dominant:  # owned drafts that win their row by far: only the exclusion hides them
        n_valid = max(1, min(S, V - col_offset))
        col = torch.randint(0, n_valid, (R,), generator=g)
        z[torch.arange(R), col] = (z.float().max(dim=1).values + 40 * scale).to(dtype)
        draft = col + col_offset
    seeds = torch.randint(-(2**62), 2**62, (R,), generator=g)
    pos = torch.randint(0, 2**20, (R,), generator=g)
    args = [z, temps, threshold, draft, seeds, pos]
    return [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]


def _tie_cols(threshold, S, seed):
    """A tie column per row (-1 .. S): ties at the threshold kept only up to it."""
    if threshold is None:
        return None
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-1, S + 1, (threshold.shape[0],), generator=g).to(threshold.device)


def compare_stats(a: torch.Tensor, b: torch.Tensor, args, col_offset: int, vocab_size: int,
                  exclude: bool, tol: float = 2e-5, tie_col=None) -> dict:
    """Compare torch stats ``a`` with Triton stats ``b``; raise AssertionError if off."""
    a = a.cpu()
    b = b.cpu()
    for slot in (0, 2, 3)[: 1 if a.shape[1] == 2 else 3]:
        x, y = a[:, slot], b[:, slot]
        assert torch.equal(torch.isinf(x), torch.isinf(y)), f"slot {slot}: inf pattern differs"
        fin = ~torch.isinf(x)
        if fin.any():
            assert torch.allclose(x[fin], y[fin], rtol=tol, atol=tol), (
                f"slot {slot}: max abs diff {(x[fin] - y[fin]).abs().max():.3g}")
    ties = 0
    diff = (a[:, 1] != b[:, 1]).nonzero().squeeze(1).tolist()
    if diff:
        z, temps, thr, _draft, seeds, pos = [x.cpu() if isinstance(x, torch.Tensor) else x
                                            for x in args]
        s = masked_scaled_shard(z, temps, thr, col_offset, vocab_size,
                                None if tie_col is None else tie_col.cpu())
        gid = torch.arange(z.shape[1]) + col_offset
        for r in diff:
            ia, ib = int(a[r, 1]) - col_offset, int(b[r, 1]) - col_offset
            sc = s[r].clone()
            if temps[r] != 0:
                h1, h2 = row_keys(seeds[r:r + 1], pos[r:r + 1], DOMAIN_GUMBEL)
                sc = sc + gumbel_noise(h1, h2, gid)[0]
            gap = abs(float(sc[ia]) - float(sc[ib]))
            assert gap < 1e-5 * max(1.0, abs(float(sc[ia]))), (
                f"row {r}: argmax {ia} vs {ib}, score gap {gap:.3g}")
            ties += 1
    return {"rows": a.shape[0], "near_ties": ties}


def check_hash_bits(device: str, n_rows: int = 7, n_cols: int = 4099) -> int:
    """Bit-compare the 32-bit noise hash of the torch and Triton implementations."""
    import triton

    from vllm_kimi_ext.verify._kernels.common import hash_bits_kernel
    from vllm_kimi_ext.verify.hashing import element_hash

    g = torch.Generator().manual_seed(0)
    seeds = torch.randint(-(2**62), 2**62, (n_rows,), generator=g)
    pos = torch.randint(0, 2**40, (n_rows,), generator=g)
    h1, h2 = row_keys(seeds, pos, DOMAIN_GUMBEL)
    want = element_hash(h1[:, None], h2[:, None], torch.arange(n_cols)[None, :])
    out = torch.empty((n_rows, n_cols), dtype=torch.int64, device=device)
    hash_bits_kernel[(n_rows, triton.cdiv(n_cols, 1024))](
        out, seeds.to(device), pos.to(device), n_cols, BLOCK=1024)
    got = out.cpu() & 0xFFFFFFFF
    assert torch.equal(got, want), f"{int((got != want).sum())} hash words differ"
    return n_rows * n_cols


def _decide_both(gathered: torch.Tensor, L, V: int, tp: int):
    """The stats-only step's decision from gathered statistics: torch (merge + decide) and
    the Triton decide kernel; each ``(sampled, num_sampled, decision_row, margin)``."""
    from vllm_kimi_ext.verify._kernels import decide as kd
    from vllm_kimi_ext.verify.decide import decide_merged_torch, merge_stats_torch
    from vllm_kimi_ext.verify.protocol import plan_step
    from vllm_kimi_ext.verify.step_io import StepInputs

    inp = StepInputs.from_layout(L, V)
    plan = plan_step(tp_size=tp, shard_width=-(-V // tp), num_rows=L.num_rows,
                     num_reqs=L.num_reqs, max_rows_per_req=L.max_rows_per_req,
                     all_greedy=gathered.shape[-1] == 2, any_cut=False)
    no = torch.zeros(L.num_rows, dtype=torch.bool, device=gathered.device)
    a = decide_merged_torch(merge_stats_torch(gathered, plan), no, inp, plan, V)[:4]
    dev = gathered.device
    t = (torch.empty((L.num_reqs, L.max_rows_per_req), dtype=torch.int64, device=dev),
         torch.empty((L.num_reqs,), dtype=torch.int32, device=dev),
         torch.empty((L.num_reqs,), dtype=torch.int64, device=dev),
         torch.empty((L.num_rows,), dtype=torch.float32, device=dev))
    kd.launch_decide(gathered.float().contiguous(), L.cu_num_rows, L.draft, L.temperature,
                     L.seeds, L.positions, *t, V)
    return a, t


def check_decide(device: str, tp: int = 8, num_reqs: int = 64, V: int = 1000,
                 all_greedy: bool = False) -> dict:
    """Triton decide kernel vs the torch merge + decision on random gathered statistics."""
    from vllm_kimi_ext.verify.batch import VerifyBatch

    g = torch.Generator().manual_seed(5)
    k = 3
    drafts = torch.randint(-1, V, (num_reqs, k), generator=g)
    temps = torch.where(torch.rand(num_reqs, generator=g) < 0.3, 0.0, 1.0)
    if all_greedy:
        temps = torch.zeros(num_reqs)
    seeds = torch.randint(-(2**62), 2**62, (num_reqs,), generator=g)
    lists = drafts.tolist()
    if num_reqs % 2:  # odd counts: ragged k (0..3 drafts per request)
        lists = [r[: i % (k + 1)] for i, r in enumerate(lists)]
    b = VerifyBatch.from_draft_tokens(lists, temps, seeds, device=device)
    L = b.layout()
    rows = L.num_rows
    gathered = torch.empty(tp, rows, 4)
    gathered[..., 0] = torch.randint(0, 3, (tp, rows), generator=g).float()  # ties
    gathered[..., 1] = torch.randint(0, V, (tp, rows), generator=g).float()
    gathered[..., 2] = torch.randn(tp, rows, generator=g) + 5
    gathered[..., 3] = torch.where(torch.rand(tp, rows, generator=g) < 1 / tp,
                                   torch.randn(tp, rows, generator=g) + 5, NEG_INF)
    # make some drafts the merged argmax (accepted under greedy)
    gathered[0, ::2, 0] = 10.0
    gathered[0, ::2, 1] = L.draft[::2].float().cpu().clamp(min=0)
    gathered = gathered.to(device)
    if all_greedy:
        gathered = gathered[..., :2].contiguous()
    a, t = _decide_both(gathered, L, V, tp)
    assert torch.equal(a[1].cpu(), t[1].cpu()), "num_sampled differs"
    assert torch.equal(a[0].cpu(), t[0].cpu()), "sampled differs"
    ma, mt = a[3].cpu(), t[3].cpu()
    assert torch.equal(torch.isnan(ma), torch.isnan(mt))
    fin = ~torch.isnan(ma) & ~torch.isinf(ma)
    assert torch.allclose(ma[fin], mt[fin], rtol=1e-5, atol=1e-5)
    return {"reqs": num_reqs, "tp": tp, "all_greedy": all_greedy,
            "mean_num_sampled": float(a[1].float().mean())}


def check_sharded(device: str, tp: int = 2, V: int = 300, num_reqs: int = 12,
                  cand_split: int | None = None) -> dict:
    """The sharded step on the Triton backend vs the full-vocabulary reference: top-p
    (4 candidates per rank, so the escalation round runs too), top-k, bf16 ties.

    ``cand_split``: columns per program of the round-1 candidate kernel (``stats.TUNE``,
    default 2048) for this call only. The interpreter run (``--quick``) passes the shard
    width rounded up to a power of two (150 -> 256): the same one program per row as the
    default, with an 8x shorter ``tl.topk`` sort, which is most of the interpreter's time
    (~140 s of ~155 s at 2048 on a 2-core machine, ~26 s at 256)."""
    from vllm_kimi_ext.verify import stats

    saved = dict(stats.TUNE)
    if cand_split is not None:
        stats.TUNE.update(split_small=cand_split, split_large=cand_split)
    try:
        return _check_sharded(device, tp, V, num_reqs)
    finally:
        stats.TUNE.clear()
        stats.TUNE.update(saved)


def _check_sharded(device: str, tp: int, V: int, num_reqs: int) -> dict:
    from testkit.verify_equivalence import assert_equivalent
    from testkit.verify_simulate import simulate_sharded_verify
    from vllm_kimi_ext.verify.batch import VerifyBatch
    from vllm_kimi_ext.verify.reference import ReferenceVerifier

    g = torch.Generator().manual_seed(3)
    drafts = torch.randint(0, V, (num_reqs, 3), generator=g)
    temps = torch.where(torch.rand(num_reqs, generator=g) < 0.25, 0.0, 1.0)
    b = VerifyBatch.from_draft_tokens(drafts, temps, torch.arange(num_reqs), device=device,
                                      top_p=[0.9] * num_reqs, top_k=[0, 5] * (num_reqs // 2))
    z = (torch.randn(b.num_rows, V, generator=g) * 2).to(torch.bfloat16).to(device)
    out, group, outs = simulate_sharded_verify(z, b, tp, V, backend="triton", candidates=4)
    assert all(torch.equal(o.sampled, out.sampled) for o in outs[1:])
    ref = ReferenceVerifier(V).verify(z, b)
    rep = assert_equivalent(ref, out, b, logits=z, vocab_size=V, allow_score_ties=True)
    return rep.__dict__ | {"collectives": [shape for shape, _ in group.calls[0]]}


def run_checks(device: str = "cuda", quick: bool = False) -> dict:
    """Run every configuration; returns a summary (raises on mismatch)."""
    cases = [
        # R, S, V, col_offset, dtype, threshold, splits, block, dominant drafts
        (6, 300, 1000, 800, torch.bfloat16, True, 1, 64, False),
        (6, 300, 1000, 800, torch.float32, False, 3, 64, False),
        (9, 257, 600, 257, torch.float16, True, None, 64, False),
        (5, 100, 50, 0, torch.float32, True, 2, 32, False),  # mostly padding
        (4, 64, 100, 128, torch.float32, False, 1, 32, False),  # all padding
        (8, 300, 1000, 300, torch.bfloat16, False, 3, 64, True),
        (7, 200, 1000, 0, torch.float32, True, 1, 64, True),
    ]
    if not quick:
        cases += [
            (16, 20480, 163840, 7 * 20480, torch.bfloat16, False, None, 1024, False),
            (64, 20480, 163840, 3 * 20480, torch.bfloat16, True, None, 1024, False),
            (4, 20480, 163840, 0, torch.float32, False, 1, 1024, False),
            (32, 20480, 163840, 5 * 20480, torch.bfloat16, True, None, 1024, True),
        ]
    summary = {"device": device, "cases": [], "hash_words_checked": check_hash_bits(device),
               "decide": [check_decide(device), check_decide(device, tp=3, num_reqs=33),
                          check_decide(device, tp=8, num_reqs=10, all_greedy=True)]}
    for i, (R, S, V, off, dtype, thr, splits, block, dominant) in enumerate(cases):
        args = _case(R, S, V, off, dtype, device, seed=100 + i, thr=thr, dominant=dominant)
        exclude = dominant or i % 2 == 0
        tie = _tie_cols(args[2], S, seed=200 + i)
        a = shard_local_stats_torch(*args, off, V, exclude, tie_col=tie)
        b = shard_local_stats_triton(*args, off, V, exclude, tie_col=tie, block=block,
                                     splits=splits)
        res = compare_stats(a, b, args, off, V, exclude, tie_col=tie)
        if dominant:  # the excluded draft must never be the reported Gumbel-max
            sampling, draft = args[1].cpu() != 0, args[3].cpu()
            assert not bool(((b[:, 1].cpu().long() == draft) & sampling).any()), (
                "Triton statistics report the excluded draft as the Gumbel-max")
        res.update(R=R, S=S, V=V, dtype=str(dtype), threshold=thr, splits=splits,
                   exclude=exclude, dominant_drafts=dominant)
        summary["cases"].append(res)
        a2 = shard_local_stats_torch(*args, off, V, exclude, 2, tie_col=tie)
        b2 = shard_local_stats_triton(*args, off, V, exclude, 2, tie_col=tie, block=block,
                                      splits=splits)
        assert b2.shape == (R, 2)
        compare_stats(a2, b2, args, off, V, exclude, tie_col=tie)
    # quick: the interpreter; one candidate program per row either way (shard width 150)
    summary["sharded"] = check_sharded(device, cand_split=256 if quick else None)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    print(json.dumps(run_checks(a.device, a.quick), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
