"""The e2e report (``report.md``) and ``compare``: ratio tables B/A of matching levels."""

from __future__ import annotations

import json
from typing import Any

from bench.harness.common import fmt, md_table


def _acc_cells(acc: dict | None) -> tuple[str, str]:
    if not acc:
        return "-", "-"
    per = ", ".join(f"{x:.2f}" for x in acc.get("per_position") or [])
    return fmt(acc.get("mean_acceptance_length")), per or "-"


def e2e_markdown(res: dict[str, Any]) -> str:
    tiny = " (tiny, written on the fly)" if res["model"]["tiny"] else ""
    out = [f"# End-to-end serving: {res['name']}", "",
           (f"Model `{res['model']['ref']}`{tiny}; created {res['created']}; "
            f"{len(res['runs'])} server launch(es)."), ""]
    if res.get("notes"):
        out += [f"- {n}" for n in res["notes"]] + [""]
    out += ["## Prompts", "", md_table(["dataset", "source", "prompts", "note"], [
        [d, p["source"], p["count"], p["note"] or ""] for d, p in res["prompts"].items()]), ""]
    out += ["## Matrix", "", md_table(["run", "status", "startup s", "reason / software"], [
        [r["id"], r["status"], fmt(r["startup_s"], ".0f"),
         r["reason"] or _software_cell(r.get("server_software"))] for r in res["runs"]]), ""]
    rows = []
    for r in res["runs"]:
        for lv in r["levels"]:
            acc_len, per = _acc_cells(lv.get("acceptance"))
            rows.append([r["id"], lv["dataset"], f"{lv['temperature']:g}", lv["concurrency"],
                         f"{lv['completed']}/{lv['requests']}",
                         fmt(lv["output_tokens_per_s"], ".1f"), fmt(lv["tpot_ms_p50"], ".1f"),
                         fmt(lv["tpot_ms_p90"], ".1f"), fmt(lv["ttft_ms_p50"], ".0f"), acc_len,
                         per, fmt(lv["collectives_per_output_token"], ".1f")])
    if rows:
        out += ["## Results", "", md_table(
            ["run", "dataset", "T", "conc", "ok", "out tok/s", "TPOT p50 ms", "TPOT p90 ms",
             "TTFT p50 ms", "accept len", "accept per position", "collectives/token"], rows), "",
            ("Acceptance: deltas of vLLM's `vllm:spec_decode_*` counters over the level "
            "(accept len = 1 + accepted / drafts). Collectives/token: the plugin's "
            "`VLLM_KIMI_EXT_COUNT_COLLECTIVES` log lines of one rank in the level's log "
            "window, over the level's generated tokens (windows of N steps: approximate at "
            "level edges)."), ""]
    else:
        out += ["## Results", "", "No level ran (no server started).", ""]
    return "\n".join(out)


def plan_markdown(res: dict[str, Any], out_dir: str) -> str:
    """What a run would do (``runner.py run --plan-only``): the launches with their
    python, environment, extra arguments and draft, and the load levels of each."""
    cfg = res["config"]
    temps = ", ".join(f"{t:g}" for t in cfg["temperature"])
    n_levels = len(cfg["datasets"]) * len(cfg["temperature"]) * len(cfg["concurrency"])
    model = res["model"]
    path = f" ({model['path']})" if model["path"] != model["ref"] else ""
    out = [f"# Plan: {res['name']} (--plan-only: nothing started, nothing written)", "",
           (f"Config `{res['config_file']}`; model `{model['ref']}`{path}; results would go "
            f"to `{out_dir}`."),
           (f"{len(res['runs'])} server launch(es) x {n_levels} load level(s) each (datasets "
            f"{', '.join(cfg['datasets'])}; temperature {temps}; concurrency "
            f"{', '.join(map(str, cfg['concurrency']))}); {cfg['requests_per_level']} requests "
            f"of up to {cfg['max_tokens']} tokens per level."), ""]
    if res.get("notes"):
        out += [f"- {n}" for n in res["notes"]] + [""]
    out.append(md_table(["run", "python", "env", "serve args", "speculative config"], [
        [r["id"], r["python"], " ".join(f"{k}={v}" for k, v in r["env"].items()) or "-",
         " ".join(r["serve_args"]) or "-",
         json.dumps(r["speculative_config"], sort_keys=True) if r["speculative_config"]
         else "-"] for r in res["runs"]]))
    return "\n".join(out) + "\n"


def _software_cell(sw: dict | None) -> str:
    if not sw:
        return ""
    if "error" in sw:
        return f"probe: {sw['error']}"
    series = sw.get("patch_series")
    return (f"vllm {sw.get('vllm')}, torch {sw.get('torch')}, "
            f"{'patched (' + str(len(series)) + ' patches)' if series else 'no patch series'}")


def _levels(res: dict[str, Any]) -> dict[tuple[str, str, float, int], dict]:
    return {(r["id"], lv["dataset"], float(lv["temperature"]), int(lv["concurrency"])): lv
            for r in res["runs"] for lv in r["levels"]}


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return b / a


def compare_rows(a: dict[str, Any], b: dict[str, Any] | None = None,
                 axis: tuple[str, str, str] | None = None) -> list[dict[str, Any]]:
    """Matched levels of A and B (same run id, dataset, temperature, concurrency), or with
    ``axis=(name, va, vb)`` runs of A whose axes differ only in ``name`` (va vs vb)."""
    pairs: list[tuple[str, dict, dict]] = []
    if axis is not None:
        name, va, vb = axis
        src = b if b is not None else a
        la, lb = _levels(a), _levels(src)
        runs_b = {r["id"]: r for r in src["runs"]}
        for r in a["runs"]:
            if r["axes"].get(name) != va:
                continue
            other = ",".join(f"{k}={vb if k == name else v}" for k, v in r["axes"].items())
            if other not in runs_b:
                continue
            for (rid, ds, t, c), lv in la.items():
                if rid == r["id"] and (other, ds, t, c) in lb:
                    label = ",".join(f"{k}={v}" for k, v in r["axes"].items() if k != name)
                    pairs.append((label or r["id"], lv, lb[(other, ds, t, c)]))
    else:
        if b is None:
            raise ValueError("compare needs two result files, or --axis NAME=A:B")
        la, lb = _levels(a), _levels(b)
        for key, lv in la.items():
            if key in lb:
                pairs.append((key[0], lv, lb[key]))
    rows = []
    for label, x, y in pairs:
        ax, ay = x.get("acceptance") or {}, y.get("acceptance") or {}
        rows.append({
            "run": label, "dataset": x["dataset"], "temperature": x["temperature"],
            "concurrency": x["concurrency"],
            "tok_s_a": x["output_tokens_per_s"], "tok_s_b": y["output_tokens_per_s"],
            "tok_s_ratio": _ratio(x["output_tokens_per_s"], y["output_tokens_per_s"]),
            "tpot_a": x["tpot_ms_p50"], "tpot_b": y["tpot_ms_p50"],
            "tpot_ratio": _ratio(x["tpot_ms_p50"], y["tpot_ms_p50"]),
            "accept_a": ax.get("mean_acceptance_length"),
            "accept_b": ay.get("mean_acceptance_length"),
            "coll_a": x.get("collectives_per_output_token"),
            "coll_b": y.get("collectives_per_output_token"),
            "coll_ratio": _ratio(x.get("collectives_per_output_token"),
                                 y.get("collectives_per_output_token")),
        })
    return rows


def compare_markdown(rows: list[dict[str, Any]], name_a: str, name_b: str) -> str:
    head = ["run", "dataset", "T", "conc", f"tok/s {name_a}", f"tok/s {name_b}", "B/A",
            f"TPOT p50 {name_a}", f"TPOT p50 {name_b}", "B/A", f"accept len {name_a}",
            f"accept len {name_b}", f"coll/tok {name_a}", f"coll/tok {name_b}", "B/A"]
    body = [[r["run"], r["dataset"], f"{r['temperature']:g}", r["concurrency"],
             fmt(r["tok_s_a"], ".1f"), fmt(r["tok_s_b"], ".1f"), fmt(r["tok_s_ratio"], ".3f"),
             fmt(r["tpot_a"], ".2f"), fmt(r["tpot_b"], ".2f"), fmt(r["tpot_ratio"], ".3f"),
             fmt(r["accept_a"]), fmt(r["accept_b"]), fmt(r["coll_a"], ".1f"),
             fmt(r["coll_b"], ".1f"), fmt(r["coll_ratio"], ".3f")] for r in rows]
    text = (f"A = {name_a}, B = {name_b}; B/A > 1 means B is larger (better for tok/s, worse "
            "for TPOT and collectives/token).\n\n")
    return text + (md_table(head, body) if body else "No matching levels.") + "\n"
