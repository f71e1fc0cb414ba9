"""The box-side check of the answer (``bench/e2e/runner.py recommendation``).

One e2e run of two launches, back to back with the same prompts, datasets and sampling:
``answer``, the configuration :func:`vllm_kimi_ext.costmodel.headline.headline` recommends,
and ``measure``, the one to settle beside it (the configuration worth measuring, or the
measured alternative a cleared answer beat). Both are served with the answer's commands
(:func:`~vllm_kimi_ext.costmodel.headline.speculative_config`,
:func:`~vllm_kimi_ext.costmodel.headline.serve_env`, the same ``vllm serve`` arguments) at
concurrency 1, the forecast's batch. Afterwards ``forecast.json`` and ``forecast.md`` put
the measured tokens/s and acceptance length beside the forecast (point and interval) for each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROLES = ("answer", "measure")
#: The forecast is for one stream.
CONCURRENCY = 1


def _value(j: Any, python: str, draft_dirs: dict[str, str]) -> dict[str, Any]:
    from vllm_kimi_ext.costmodel.headline import serve_env, speculative_config

    spec = speculative_config(j.plan)
    if j.plan.draft.name in draft_dirs:
        spec["model"] = draft_dirs[j.plan.draft.name]
    value: dict[str, Any] = {"python": python, "speculative_config": spec}
    env = serve_env(j.plan, j.option.requires)
    if env:
        value["env"] = env
    return value


def pair(h: Any) -> dict[str, Any]:
    """{role: judged configuration} of the answer ``h``: the answer, and the configuration to
    measure beside it when the answer names one."""
    if h.measure_next is None:
        return {"answer": h.choice}
    return {"answer": h.choice, "measure": h.measure_next}


def matrix_config(base: dict[str, Any], h: Any, python: str = "@box",
                  draft_dirs: dict[str, str] | None = None) -> dict[str, Any]:
    """``base`` (a normalized e2e config: model, datasets, requests, sampling, timeouts)
    with its matrix replaced by the two launches and the answer's serve arguments."""
    from vllm_kimi_ext.costmodel.headline import SERVE_ARGS

    cfg = dict(base)
    cfg["matrix"] = {"speculative": {role: _value(j, python, draft_dirs or {})
                                     for role, j in pair(h).items()}}
    cfg["exclude"] = []
    cfg["concurrency"] = [CONCURRENCY]
    args = list(base.get("serve_args") or [])
    for i, flag in enumerate(SERVE_ARGS):
        if flag.startswith("--") and flag not in args:
            nxt = SERVE_ARGS[i + 1] if i + 1 < len(SERVE_ARGS) else None
            args += [flag] + ([nxt] if nxt is not None and not nxt.startswith("--") else [])
    cfg["serve_args"] = args
    return cfg


def _measured(run: dict[str, Any] | None) -> dict[str, Any]:
    """Mean tokens/s over the run's concurrency-1 levels and its pooled acceptance."""
    if run is None or run.get("status") != "ok":
        return {"status": None if run is None else run.get("status"),
                "reason": None if run is None else run.get("reason"),
                "tokens_per_s": None, "acceptance_length": None, "levels": 0}
    levels = [lv for lv in run["levels"] if lv.get("concurrency") == CONCURRENCY
              and lv.get("output_tokens_per_s")]
    tps = (sum(lv["output_tokens_per_s"] for lv in levels) / len(levels)) if levels else None
    drafts = sum((lv.get("acceptance") or {}).get("num_drafts") or 0 for lv in levels)
    accepted = sum((lv.get("acceptance") or {}).get("accepted_tokens") or 0 for lv in levels)
    tau = 1 + accepted / drafts if drafts else None
    return {"status": "ok", "reason": None, "tokens_per_s": tps, "acceptance_length": tau,
            "levels": len(levels)}


def forecast_rows(h: Any, results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per role: the forecast beside what the run measured."""
    from vllm_kimi_ext.costmodel.evidence import WORDS

    runs = {r["axes"].get("speculative"): r for r in results.get("runs", [])}
    rows = []
    for role, j in pair(h).items():
        lo, hi = j.interval
        m = _measured(runs.get(role))
        t = m["tokens_per_s"]
        rows.append({
            "role": role, "draft": j.draft.name, "checkpoint": j.draft.checkpoint,
            "k": j.plan.k, "placement": j.plan.placement, "evidence": WORDS[j.evidence.level],
            "forecast_tokens_per_s": j.tps["point"], "forecast_interval": [lo, hi],
            "forecast_acceptance_length": j.tau["point"],
            "measured_tokens_per_s": t, "measured_acceptance_length": m["acceptance_length"],
            "measured_levels": m["levels"], "status": m["status"], "reason": m["reason"],
            "within_interval": None if t is None else lo <= t <= hi,
            "error": None if t is None else j.tps["point"] / t - 1,
        })
    return rows


def next_steps(rows: list[dict[str, Any]], out: Path | str | None) -> str:
    """The commands that re-rank each measured draft with its measured acceptance (each
    picks its own run of the results file by its draft)."""
    results = f"{out}/results.json" if out is not None else "results.json"
    cmds = [f"`vllm-kimi-ext plan --draft {r['draft']} --acceptance-from {results}`"
            for r in rows if r["measured_acceptance_length"] is not None]
    return ("re-rank with the measured acceptance: " + "; ".join(cmds)) if cmds else ""


def verdict(rows: list[dict[str, Any]], out: Path | str | None = None) -> str:
    nxt = next_steps(rows, out)
    if len(rows) == 1:
        return ("the answer alone (nothing to measure beside it)" + (f"; {nxt}" if nxt
                                                                      else ""))
    a, b = rows
    if a["measured_tokens_per_s"] is None or b["measured_tokens_per_s"] is None:
        return "not settled: a launch did not measure (see report.md)" + (
            f"; {nxt}" if nxt else "")
    faster = a if a["measured_tokens_per_s"] >= b["measured_tokens_per_s"] else b
    return (f"measured faster on this box: {faster['role']} (`{faster['draft']}` k = "
            f"{faster['k']}, {faster['measured_tokens_per_s']:.1f} tok/s); {nxt}")


def arm_lines(h: Any, draft_dirs: dict[str, str]) -> list[str]:
    """One line per launch: what it serves and from where (a draft whose RoPE factor is
    unknown says which arm of that A/B this run is)."""
    from vllm_kimi_ext.costmodel.headline import factor_text, rope_factor, speculative_config

    out = []
    for role, j in pair(h).items():
        spec = speculative_config(j.plan)
        model = draft_dirs.get(j.draft.name, spec["model"])
        line = (f"{role}: `{j.draft.name}` k = {j.plan.k}, draft model {model}")
        rope = rope_factor(j.draft)
        if rope is not None:
            line += (f" (RoPE attention factor unknown: the published config runs at "
                     f"{factor_text(rope['config_factor'])} in vLLM 0.34.0; the "
                     f"{factor_text(rope['other_factor'])} arm: --draft-dir {j.draft.name}=DIR "
                     "after vllm-kimi-ext draft rope-config)"
                     if j.draft.name not in draft_dirs else " (the --draft-dir copy)")
        out.append(line)
    if h.measure_next is None:
        out.append("measure: skipped (the answer names no configuration worth measuring and "
                   "no measured alternative: one launch)")
    return out


def forecast_markdown(rows: list[dict[str, Any]], out: Path | str | None = None) -> str:
    def f(v, spec=".1f"):
        return "-" if v is None else format(v, spec)

    lines = ["# The answer, measured beside the forecast", "",
             "| role | configuration | evidence | forecast tok/s (interval) | measured tok/s | "
             "forecast tau | measured tau | within the interval |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lo, hi = r["forecast_interval"]
        lines.append(
            f"| {r['role']} | `{r['draft']}` k = {r['k']} ({r['placement']}) | {r['evidence']} "
            f"| {r['forecast_tokens_per_s']:.1f} ({lo:.0f}-{hi:.0f}) | "
            f"{f(r['measured_tokens_per_s'])} | {r['forecast_acceptance_length']:.2f} | "
            f"{f(r['measured_acceptance_length'], '.2f')} | "
            f"{'-' if r['within_interval'] is None else ('yes' if r['within_interval'] else 'no')}"
            + (f" ({r['status']}: {r['reason']})" if r["status"] not in ("ok", None) else "")
            + " |")
    lines += ["", verdict(rows, out), ""]
    return "\n".join(lines)


def write_forecast(out: Path, rows: list[dict[str, Any]]) -> list[Path]:
    from bench.harness.common import write_json

    out = Path(out)
    md = out / "forecast.md"
    md.write_text(forecast_markdown(rows, out))
    return [write_json(out / "forecast.json", {"schema": "vllm-kimi-ext/e2e-forecast/1",
                                               "rows": rows, "verdict": verdict(rows, out)}),
            md]
