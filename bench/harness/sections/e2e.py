"""Section ``e2e`` (the real box): ``bench/e2e/runner.py run``; elsewhere the pipeline on a
tiny checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench.harness.common import gpu_env, last_error_line, rel, scrub
from bench.harness.sections.base import BENCH, Context, Outcome, cuda_devices

RUNNER = BENCH / "e2e" / "runner.py"


def needs_e2e(caps: dict, ctx: Context) -> str | None:
    if not caps.get("vllm_importable") and not ctx.e2e_pythons:
        return "vLLM not importable in this environment (give --e2e-python NAME=PATH)"
    return None


def run_e2e(ctx: Context) -> Outcome:
    from bench.harness.schema import E2EResults, validate

    out_dir = ctx.out / "e2e"
    gpu = cuda_devices(ctx.caps) > 0
    # this run's --out is replaced as a whole (see run_all.py), its e2e/ part included
    cmd = [sys.executable, str(RUNNER), "run", "--out", str(out_dir), "--overwrite"]
    if ctx.e2e_config:
        cmd += ["--config", str(ctx.e2e_config)]
    if ctx.e2e_model:
        cmd += ["--model", ctx.e2e_model]
    for p in ctx.e2e_pythons:
        cmd += ["--python", p]
    if not ctx.use_git:
        cmd.append("--no-git")
    if not gpu:
        cmd += ["--stop-after-failed-starts", "1", "--startup-timeout", "180"]
    if ctx.quick:
        cmd += ["--requests", "4", "--concurrency", "1", "--time-budget", "600"]
    ctx.progress("    bench/e2e/runner.py run" + ("" if ctx.e2e_config else
                                                    " (tiny Kimi-shaped checkpoint)"))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              timeout=None if ctx.e2e_config else 2400,
                              env=gpu_env() if gpu else dict(os.environ), check=False)
    except subprocess.TimeoutExpired:
        return Outcome("failed", "e2e runner exceeded its time limit")
    (ctx.out / "e2e.log").write_text(scrub(proc.stdout + proc.stderr))
    res_file = out_dir / "results.json"
    if proc.returncode not in (0, 1) or not res_file.is_file():  # 1: some launch did not run
        return Outcome("failed", f"runner exited {proc.returncode}: "
                                 f"{last_error_line(proc.stdout + proc.stderr)}")
    res = json.loads(res_file.read_text())
    problems = validate(res, E2EResults)
    runs = res["runs"]
    measured = [r for r in runs if r["status"] == "ok"]
    skipped = []
    for d, p in res["prompts"].items():
        if p["source"] == "builtin":
            skipped.append((f"prompts {d}", p["note"] or "built-in prompts used"))
    not_run = [r for r in runs if r["status"] != "ok"]
    if not_run:
        reasons = (sorted({r["reason"] or r["status"] for r in not_run if
                          r["status"] == "server_failed"}) or
            sorted({r["reason"] or r["status"] for r in not_run}))
        skipped.append((f"serving ({len(not_run)} of {len(runs)} launches)",
                        "; ".join(reasons)))
    e2e_md = (out_dir / "report.md").read_text() if (out_dir / "report.md").is_file() else ""
    body = e2e_md.split("\n", 1)[1].strip() if e2e_md else ""
    body = body.replace("\n## ", "\n### ")
    validity = "valid" if not problems else "INVALID: " + "; ".join(problems[:3])
    md = [("The end-to-end pipeline (`bench/e2e/runner.py run`, config "
           f"`{res['config_file']}`): server launch and readiness, prompts, load levels, "
           f"metric scraping and the result schema (`{res['schema']}`: {validity}). "
           "Full result: [e2e/results.json](e2e/results.json)."), "", body]
    if problems:
        status = "failed"
    elif measured and not not_run:
        status = "ok"
    else:
        status = "partial"
    reason = None if status == "ok" else (
        "results do not match the schema" if problems else
        f"{len(measured)} of {len(runs)} launches measured")
    return Outcome(status, reason, data={"results_file": rel(res_file),
                                         "runs": [{k: r[k] for k in ("id", "status", "reason")}
                                                  for r in runs],
                                         "schema_problems": problems},
                   markdown="\n".join(md), skipped=skipped,
                   artifacts=["e2e/results.json", "e2e/report.md"])
