"""Collective counts of a target pass and of draft passes, from gloo TP runs on tiny
Kimi-shaped checkpoints (``run_all`` section ``collectives``).

One ``run_tp`` launch runs :func:`bench_rank` on every rank: the target pass of
:func:`testkit.tp_scenarios.target_pass_collectives`, then each draft case of
:mod:`testkit.draft_scenarios` separately, so that a draft that cannot be
loaded on this machine is reported with its reason while the others are still counted.
The rank function also evaluates the same config-derived formulas at Kimi-K2.5's real
dimensions (TP=8), which is what the counts are evidence for.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from typing import Any

from vllm_kimi_ext import facts

#: Kimi-K2.5 dims for the projection (the cost model's model profile, through facts).
_DIMS = facts.target_dims()
KIMI = {"num_hidden_layers": _DIMS.num_layers, "hidden_size": _DIMS.hidden_size,
        "vocab_size": _DIMS.vocab_size}
KIMI_TP = 8


def draft_scenarios_usable() -> tuple[bool, str]:
    """Whether ``testkit.draft_scenarios`` exposes what the section uses."""
    try:
        from testkit import draft_scenarios as ds
    except Exception as exc:  # noqa: BLE001
        return False, f"testkit.draft_scenarios not importable ({exc})"
    need = ("DraftCase", "draft_collectives", "expected_draft_pass", "summarize")
    missing = [n for n in need if not hasattr(ds, n)]
    if missing:
        return False, f"draft_scenarios lacks {', '.join(missing)}"
    params = list(inspect.signature(ds.draft_collectives).parameters)
    if params[:3] != ["rank", "target_dir", "cases"]:
        return False, f"draft_collectives has an unexpected signature {params}"
    fields = {f.name for f in dataclasses.fields(ds.DraftCase)}
    if not {"name", "method", "path", "options", "rows"} <= fields:
        return False, f"DraftCase has unexpected fields {sorted(fields)}"
    return True, ""


def _summary_rows(summary: dict) -> list[list[Any]]:
    return [[g, p, op, n, b] for (g, p, op), (n, b) in sorted(summary.items())]


def bench_rank(rank: int, target_dir: str, rows: int, draft_cases: list,
               placements: dict[str, str]) -> dict[str, Any]:
    """Run on every TP rank; returns plain data (pickled back to the parent)."""
    from vllm.distributed import get_tensor_model_parallel_world_size

    from testkit.tp_scenarios import (
        count_discrepancies,
        expected_target_pass,
        target_pass_collectives,
    )

    tp = get_tensor_model_parallel_world_size()
    t = target_pass_collectives(rank, target_dir, rows)
    out: dict[str, Any] = {
        "tp": tp,
        "rows": rows,
        "target": {
            "summary": _summary_rows(t["clean"]),
            "expected": t["expected"],
            "discrepancies": count_discrepancies(t["clean"], t["expected"]),
            "planted_caught": bool(count_discrepancies(t["planted"], t["expected"])),
            "unwritten": list(t["unwritten"]),
            "local_logits": t.get("local"),
        },
        "drafts": {},
    }
    kimi_cfg = types.SimpleNamespace(**KIMI)
    out["kimi_projection"] = {
        f"target pass + logits, {r} row(s)": expected_target_pass(kimi_cfg, KIMI_TP, r)
        for r in (1, 4)
    }
    if draft_cases:
        from testkit import draft_scenarios as ds

        out["kimi_projection"]["EAGLE-3 draft token (1 layer, full vocab), 1 row"] = (
            ds.expected_draft_pass(num_layers=1, hidden=KIMI["hidden_size"],
                                   draft_vocab=KIMI["vocab_size"], tp=KIMI_TP, rows=1))
    for case in draft_cases:
        try:
            from testkit import draft_scenarios as ds

            r = ds.draft_collectives(rank, target_dir, [case])[case.name]
            placement = placements.get(case.name, "sharded")
            expected = ds.expected_draft_pass(
                num_layers=r["num_layers"], hidden=r["hidden"], draft_vocab=r["draft_vocab"],
                tp=tp, rows=case.rows, placement=placement)
            got = ds.summarize(r["summary"])
            out["drafts"][case.name] = {
                "method": case.method,
                "rows": case.rows,
                "placement": placement,
                "summary": _summary_rows(r["summary"]),
                "counted": got,
                "expected": expected,
                "matches": all(got[k] == expected[k] for k in expected) and not got["other"],
                "unwritten": list(r.get("unwritten", [])),
            }
        except Exception as exc:  # noqa: BLE001 - reported, the next case still runs
            lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
            out["drafts"][case.name] = {
                "method": case.method,
                "error": f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300],
            }
    return out
