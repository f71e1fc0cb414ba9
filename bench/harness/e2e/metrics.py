"""What a level measured on the server side: vLLM's Prometheus counters (spec-decode
acceptance, generated tokens) and the plugin's ``collectives per step`` log lines."""

from __future__ import annotations

import re
from typing import Any

# vLLM 0.34.0 Prometheus names (vllm/v1/spec_decode/metrics.py, vllm/v1/metrics/loggers.py);
# counters are exposed with the _total suffix.
M_DRAFTS = "vllm:spec_decode_num_drafts_total"
M_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
M_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
M_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
M_GENERATION_TOKENS = "vllm:generation_tokens_total"
#: The plugin's StepReporter line (vllm_kimi_ext/comm/accounting.py).
COLLECTIVES_LINE = re.compile(r"collectives per step \(last (\d+) steps\): (.*)$")
COLLECTIVES_ITEM = re.compile(r"([\w-]+): ([\d.]+) calls ([\d,]+) B")

_PROM_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_PROM_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _PROM_LINE.match(line)
        if not m:
            continue
        try:
            val = float(m.group(3))
        except ValueError:
            continue
        labels = dict(_PROM_LABEL.findall(m.group(2) or ""))
        out.setdefault(m.group(1), []).append((labels, val))
    return out


def metric_total(parsed: dict, name: str, **labels: str) -> float | None:
    """Sum of a metric over engines (series matching ``labels``); None when absent."""
    rows = [v for lab, v in parsed.get(name, []) if all(lab.get(k) == x
                                                        for k, x in labels.items())]
    return sum(rows) if rows else None


def acceptance_delta(before: dict, after: dict) -> dict[str, Any] | None:
    """Spec-decode acceptance over a window from two parsed scrapes (None: not speculating)."""
    if metric_total(after, M_DRAFTS) is None:
        return None

    def d(name: str, **lab: str) -> float:
        return (metric_total(after, name, **lab) or 0.0) - (metric_total(before, name, **lab)
                                                            or 0.0)

    drafts = round(d(M_DRAFTS))
    draft_tokens = round(d(M_DRAFT_TOKENS))
    accepted = round(d(M_ACCEPTED))
    positions = sorted({int(lab["position"]) for lab, _ in after.get(M_ACCEPTED_PER_POS, [])
                        if lab.get("position", "").isdigit()})
    per_pos = [round(d(M_ACCEPTED_PER_POS, position=str(p)) / drafts, 4) if drafts else 0.0
               for p in positions]
    return {
        "num_drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "per_position": per_pos,
        "mean_acceptance_length": round(1 + accepted / drafts, 4) if drafts else None,
        "draft_acceptance_rate": round(accepted / draft_tokens, 4) if draft_tokens else None,
    }


def parse_collective_lines(text: str) -> dict[str, Any] | None:
    """Totals over the plugin's ``collectives per step`` log lines in ``text``.

    Each tensor-parallel rank logs the same counts; only the source (log prefix, e.g.
    ``(Worker_TP0 pid=12)``) with the most lines is used. Returns ``{"steps", "calls",
    "bytes", "by_phase": {phase: calls}}`` or None when there is no such line."""
    by_source: dict[str, list[tuple[int, str]]] = {}
    for line in text.splitlines():
        m = COLLECTIVES_LINE.search(line)
        if not m:
            continue
        src = re.match(r"^\s*\(([^)]*)\)", line)
        by_source.setdefault(src.group(1) if src else "", []).append((int(m.group(1)),
                                                                     m.group(2)))
    if not by_source:
        return None
    lines = max(by_source.values(), key=len)
    steps = 0
    calls = 0.0
    nbytes = 0.0
    by_phase: dict[str, float] = {}
    for every, body in lines:
        steps += every
        for phase, n, b in COLLECTIVES_ITEM.findall(body):
            calls += float(n) * every
            nbytes += float(b.replace(",", "")) * every
            by_phase[phase] = by_phase.get(phase, 0.0) + float(n) * every
    return {"steps": steps, "calls": calls, "bytes": nbytes, "by_phase": by_phase}

