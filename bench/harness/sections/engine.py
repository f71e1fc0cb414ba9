"""Section ``engine`` (any machine with the patched vLLM): vLLM 0.34.0's whole engine
(``LLM.generate``) on this machine's CPU, on the engine tier's tiny Kimi-K2.5-shaped target
(MLA + MoE, ``testkit/engine_kimi.py``) at TP 2 over gloo, the plugin on with collectives
counted (``VLLM_KIMI_EXT_COUNT_COLLECTIVES``). Per draft kind, from the engine's own
counters: tokens per step, acceptance length and per-position acceptance (vLLM's
``vllm:spec_decode_*`` metrics), collectives per output token per phase (the plugin's live
counter, read from every rank). The timings are this CPU's (vLLM's GPU kernels run under
Triton's interpreter, the compiled CPU ops are torch stand-ins): labelled as CPU timings,
never a forecast or a GPU number."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from bench.harness.common import fmt, md_table
from bench.harness.sections.base import Context, Outcome

TP = 2
#: draft kinds measured (``--quick``: the first two)
KINDS = ("none", "ngram", "eagle3-mla", "mtp")
RESET = "testkit.engine_probes:reset_collectives"
SUMMARY = "testkit.engine_probes:collective_summary"


def needs_engine(caps: dict, ctx: Context) -> str | None:
    if not caps.get("vllm_importable"):
        return "vLLM not importable (nox -s apply-patches)"
    return None


def engine_row(kind: str, tokens: list[list[int]], metrics: dict, summaries: list[dict],
               seconds: float) -> dict[str, Any]:
    """One kind's numbers from what the engine reported. ``summaries``: the collective
    counter of every rank (:func:`testkit.engine_probes.collective_summary`), which must
    agree (SPMD); its ``steps`` are the model runner's steps (one target forward each)."""
    first = summaries[0]
    for other in summaries[1:]:
        if other["calls"] != first["calls"] or other["steps"] != first["steps"]:
            raise AssertionError(f"ranks counted different collectives: {first} vs {other}")
    out_tokens = sum(len(t) for t in tokens)
    steps = first["steps"]
    by_phase: dict[str, int] = {}
    for (group, phase, _op), n in first["calls"].items():
        if group == "tp":
            by_phase[phase] = by_phase.get(phase, 0) + n
    drafts = metrics.get("num_drafts", 0)
    acc = metrics.get("num_accepted_tokens", 0)
    return {
        "kind": kind, "output_tokens": out_tokens, "steps": steps,
        "tokens_per_step": out_tokens / steps if steps else None,
        "acceptance_length": 1 + acc / drafts if drafts else None,
        "per_position": [a / drafts for a in metrics.get("accepted_per_pos", [])]
        if drafts else [],
        "collectives_per_token": {p: n / out_tokens for p, n in sorted(by_phase.items())},
        "cpu_seconds": seconds, "cpu_tokens_per_s": out_tokens / seconds if seconds else None,
    }


def _measure(kind: str, drafts: dict, target: Path) -> dict[str, Any]:
    import time

    from testkit import engine_kimi as ek
    from testkit.engine import Engine

    model = drafts["mtp-target"] if kind == "mtp" else target
    spec = ek.kimi_spec(model, ek.speculative(kind, drafts), tp=TP, plugin=True,
                        env={"VLLM_KIMI_EXT_COUNT_COLLECTIVES": "100000"})
    with Engine(spec) as eng:
        eng.rpc(RESET)  # start-up (profiling, warm-up) is not a step of the batch
        t0 = time.monotonic()
        outs = eng.generate(ek.PROMPTS, ek.GREEDY)
        seconds = time.monotonic() - t0
        return engine_row(kind, [o.token_ids for o in outs], eng.spec_metrics(),
                          eng.rpc(SUMMARY), seconds)


def run_engine(ctx: Context) -> Outcome:
    from testkit import engine_kimi as ek

    root = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    drafts = {"target": ek.write_kimi_target(root / "target"),
              "mtp-target": ek.write_kimi_target(root / "target-mtp", with_mtp=True),
              "eagle3-mla": ek.write_kimi_eagle3(root / "eagle3-mla", "mla")}
    kinds = KINDS[:2] if ctx.quick else KINDS
    rows, skipped = [], []
    for kind in kinds:
        ctx.progress(f"    engine TP={TP}, plugin on: {kind}")
        try:
            rows.append(_measure(kind, drafts, drafts["target"]))
        except Exception as exc:  # noqa: BLE001 - reported as a skipped item
            skipped.append((f"draft kind {kind}", str(exc).splitlines()[0][:300]))
    if ctx.quick:
        skipped += [(f"draft kind {k}", "--quick") for k in KINDS[2:]]
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    cpu = f"{ctx.caps.get('cpu', '?')}, {ctx.caps.get('cpu_count', '?')} cores"
    status = "ok" if rows and len(rows) == len(kinds) else ("partial" if rows else "failed")
    return Outcome(status, None if rows else "no draft kind ran",
                   data={"tp": TP, "hardware": cpu, "timings": "CPU (not a forecast)",
                         "prompts": len(ek.PROMPTS), "max_tokens": ek.MAX_TOKENS,
                         "k": ek.K, "rows": rows},
                   markdown=_markdown(rows, cpu, len(ek.PROMPTS)), skipped=skipped)


def _markdown(rows: list[dict], cpu: str, requests: int) -> str:
    phases = sorted({p for r in rows for p in r["collectives_per_token"]})
    table = [[r["kind"], r["output_tokens"], r["steps"], fmt(r["tokens_per_step"]),
              fmt(r["acceptance_length"]),
              ", ".join(f"{x:.2f}" for x in r["per_position"]) or "-",
              *[fmt(r["collectives_per_token"].get(p, 0.0)) for p in phases],
              fmt(r["cpu_tokens_per_s"], ".2f")] for r in rows]
    return "\n".join([
        (f"vLLM 0.34.0's engine (`LLM.generate`) on **this machine's CPU** ({cpu}), tiny "
         f"Kimi-K2.5-shaped target (MLA + MoE, 3 layers), TP={TP} over gloo, plugin on, "
         f"{requests} requests (greedy, KV block 16, k = 3). Every "
         "number is read from the engine: tokens per step and collectives from the plugin's "
         "live counter on each rank (`VLLM_KIMI_EXT_COUNT_COLLECTIVES`), acceptance from "
         "vLLM's spec-decode metrics. **Timings are CPU timings** (Triton interpreter, torch "
         "stand-ins for the compiled CPU ops): they say nothing about a GPU and are not a "
         "forecast; the counts are what the engine did."),
        "",
        md_table(["draft", "output tokens", "steps", "tokens/step (batch)",
                  "acceptance length", "accepted per position",
                  *[f"collectives/token: {p}" for p in phases], "CPU tokens/s"], table),
    ])
