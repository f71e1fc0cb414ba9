"""The whole bench run behind ``bench/run_all.py`` (``nox -s bench``): detect what this machine
can run, run the planned sections in order, and write ``results.json`` (schema
``vllm-kimi-ext/bench-results/1``) and ``report.md`` with the skip table."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import sections as S
from bench.harness.cli import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from bench.harness.common import (
    collect_provenance,
    detect_capabilities,
    fmt,
    md_table,
    now_iso,
    rel,
    scrub,
    write_json,
)
from bench.harness.schema import BENCH_SCHEMA, BenchResults, validate

Planned = list[tuple[S.SectionSpec, str | None]]


def skip_table(planned: Planned, outcomes: dict[str, S.Outcome]) -> list[dict[str, str]]:
    """Rows (section, item, why): whole sections skipped, and parts of sections that ran."""
    rows = []
    for spec, why in planned:
        if why is not None:
            rows.append({"section": spec.name, "item": f"whole section ({spec.scope})",
                         "why": why})
            continue
        oc = outcomes.get(spec.name)
        if oc is None:
            continue
        if oc.status == "skipped":
            rows.append({"section": spec.name, "item": "whole section", "why": oc.reason or "?"})
        for item, why2 in oc.skipped:
            rows.append({"section": spec.name, "item": item, "why": why2})
    return rows


def run_suite(args: argparse.Namespace) -> int:
    """Run the sections ``args`` selects (see ``bench/run_all.py --help``) and write the
    results; exit status 0, 1 when a section failed, 2 when the results break their schema
    (a bug of this harness)."""
    t0 = time.monotonic()
    out: Path = args.out
    if (out / "results.json").exists():
        print(f"bench: replacing the results of an earlier run in {rel(out)}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    print("bench: detecting capabilities ...", flush=True)
    caps = detect_capabilities()
    cuda = caps["cuda"]
    print(f"bench: vLLM {'importable' if caps['vllm_importable'] else 'NOT importable'}; "
          f"CUDA devices: {cuda['device_count']}"
          f"{' (' + ', '.join(cuda['devices']) + ')' if cuda['devices'] else ''}; "
          f"NVLink {cuda.get('nvlink')}; P2P {cuda.get('p2p', '-')}; host {caps['hostname']} "
          f"({caps['cpu']})", flush=True)
    ctx = S.Context(out=out, caps=caps, quick=args.quick, use_git=not args.no_git,
                    progress=lambda m: print(m, flush=True), e2e_config=args.e2e_config,
                    e2e_model=args.e2e_model, e2e_pythons=args.e2e_python)
    planned = S.plan(caps, ctx, args.only, args.skip)
    outcomes, durations = _run_sections(planned, ctx)
    res = _results(args, caps, planned, outcomes, durations, time.monotonic() - t0)
    report = report_markdown(res, planned, outcomes, durations)
    res = scrub(res)
    problems = validate(res, BenchResults)
    if problems:  # a bug in this harness, not in what it measured
        print("bench: internal error: results.json does not match its schema:\n  "
              + "\n  ".join(problems), file=sys.stderr)
    write_json(out / "results.json", res)
    (out / "report.md").write_text(report)
    print("\nskipped (why):")
    for r in res["skipped"]:
        print(f"  {r['section']:<12} {r['item']}: {r['why']}")
    print(f"\nbench: wrote {rel(out / 'results.json')} and {rel(out / 'report.md')} "
          f"in {res['duration_s']:.0f} s", flush=True)
    failed = [s["name"] for s in res["sections"] if s["status"] == "failed"]
    if failed:
        print(f"bench: failed section(s): {', '.join(failed)}", file=sys.stderr)
    return EXIT_USAGE if problems else EXIT_FINDINGS if failed else EXIT_OK


def _run_sections(planned: Planned, ctx: S.Context
                  ) -> tuple[dict[str, S.Outcome], dict[str, float]]:
    outcomes: dict[str, S.Outcome] = {}
    durations: dict[str, float] = {}
    n = len(planned)
    for i, (spec, why) in enumerate(planned, 1):
        if why is not None:
            print(f"[{i}/{n}] {spec.name:<12} skipped: {why}", flush=True)
            continue
        print(f"[{i}/{n}] {spec.name:<12} running ...", flush=True)
        oc, dt = S.run_section(spec, ctx)
        outcomes[spec.name] = oc
        durations[spec.name] = dt
        note = f": {oc.reason}" if oc.reason else ""
        print(f"[{i}/{n}] {spec.name:<12} {oc.status} ({dt:.1f} s){note}", flush=True)
    return outcomes, durations


def _results(args: argparse.Namespace, caps: dict, planned: Planned,
             outcomes: dict[str, S.Outcome], durations: dict[str, float],
             duration_s: float) -> dict[str, Any]:
    res: dict[str, Any] = {
        "schema": BENCH_SCHEMA,
        "created": now_iso(),
        "duration_s": round(duration_s, 1),
        "args": {"out": rel(args.out), "only": args.only, "skip": args.skip,
                 "quick": args.quick, "no_git": args.no_git,
                 "e2e_config": rel(args.e2e_config) if args.e2e_config else None},
        "capabilities": caps,
        "provenance": collect_provenance(use_git=not args.no_git),
        "sections": [],
        "skipped": skip_table(planned, outcomes),
    }
    for spec, why in planned:
        oc = outcomes.get(spec.name)
        res["sections"].append({
            "name": spec.name, "title": spec.title,
            "status": oc.status if oc else "skipped",
            "reason": (oc.reason if oc else why),
            "duration_s": round(durations.get(spec.name, 0.0), 2),
            "data": oc.data if oc else {},
            "artifacts": oc.artifacts if oc else [],
        })
    return res


def report_markdown(res: dict, planned: Planned, outcomes: dict[str, S.Outcome],
                    durations: dict[str, float]) -> str:
    caps, prov = res["capabilities"], res["provenance"]
    out = [
        "# Benchmark report",
        "",
        (f"`bench/run_all.py` ({'--quick, ' if res['args'].get('quick') else ''}"
        f"{res['duration_s']:.0f} s). Sections marked *prediction* are the cost model; "
        "everything else was measured on this machine. Nothing here is a measurement of "
        "Kimi-K2.5 on the 8x PCIe box unless the e2e section ran there."),
        "",
        "## Machine and provenance",
        "",
        md_table(["", ""], _machine_rows(res["created"], caps, prov)),
        "",
        "## Sections",
        "",
        md_table(["section", "for", "status", "time s", "note"], [
            [spec.name, spec.scope,
             outcomes[spec.name].status if spec.name in outcomes else "skipped",
             fmt(durations.get(spec.name), ".1f"),
             (outcomes[spec.name].reason if spec.name in outcomes else why) or ""]
            for spec, why in planned]),
        "",
        "## Skipped (why)",
        "",
        md_table(["section", "item", "why"],
                 [[r["section"], r["item"], r["why"]] for r in res["skipped"]])
        if res["skipped"] else "Nothing was skipped.",
    ]
    for spec, _why in planned:
        oc = outcomes.get(spec.name)
        if oc is None or oc.status == "skipped":
            continue
        out += ["", f"## {spec.title}", ""]
        if oc.status in ("failed", "partial") and oc.reason:
            out += [f"**{oc.status}**: {oc.reason}", ""]
        out.append(oc.markdown or "(no output)")
        tb = oc.data.get("traceback") or oc.data.get("output_tail")
        if tb and oc.status == "failed":
            out += ["", "```", tb.strip()[-2000:], "```"]
    return scrub("\n".join(out).rstrip() + "\n")


def _machine_rows(created: str, caps: dict, prov: dict) -> list[list[str]]:
    cuda = caps.get("cuda", {})
    git = prov["git"]
    dirty = {True: "dirty", False: "clean", None: "dirty flag not checked"}[git.get("dirty")]
    pk = prov["packages"]
    gpus = ", ".join(cuda.get("devices") or []) or f"none ({cuda.get('why_not')})"
    return [
        ["commit", (f"`{(git.get('sha') or '?')[:12]}` ({git.get('branch') or 'detached'}, "
                   f"{dirty})")],
        ["created", created],
        ["host", (f"{caps['hostname']}: {caps['cpu']}, {caps['cpu_count']} cores, "
                 f"{caps.get('memory_gb')} GB")],
        ["GPUs", gpus],
        ["NVLink / P2P", f"{cuda.get('nvlink')} / {cuda.get('p2p', '-')}"],
        ["python", prov["python"]],
        ["packages", ", ".join(f"{k} {v}" for k, v in pk.items() if v)],
        ["patch series", _series(prov.get("patch_series"))],
        ["env", ", ".join(f"{k}={v}" for k, v in prov["env"].items()) or "-"],
    ]


def _series(ps: dict | None) -> str:
    if not ps:
        return "-"
    if "error" in ps:
        return f"unknown ({ps['error']})"
    if not ps.get("applied"):
        return "none applied"
    return (f"{len(ps['applied'])} patch(es), "
            f"{'matches' if ps.get('matches_package') else 'DIFFERS from'} this package's series")
