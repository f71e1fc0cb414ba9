"""Section ``gpu-kernels`` (one GPU): every script in ``bench/kernels/``, its JSON shown as
tables."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.harness.common import gpu_env, last_error_line, md_table, rel, scrub
from bench.harness.sections.base import BENCH, Context, Outcome, cuda_devices


def kernel_scripts() -> list[Path]:
    d = BENCH / "kernels"
    return sorted(p for p in d.glob("*.py") if not p.name.startswith("_")) if d.is_dir() else []


def needs_kernels(caps: dict, ctx: Context) -> str | None:
    if cuda_devices(caps) < 1:
        return "no CUDA device"
    if not kernel_scripts():
        return "no kernel bench scripts in bench/kernels/"
    return None


def _script_args(script: Path, out_dir: Path, quick: bool) -> list[str]:
    """Arguments for a kernel script, from the options its source declares: an output
    directory (``--out-dir``, or ``--out`` used as a directory), else an output file
    (``--out`` / ``--json``); ``--quick`` when asked and supported."""
    src = script.read_text(errors="replace")

    def has(opt: str) -> bool:
        return f'"{opt}"' in src or f"'{opt}'" in src

    args: list[str] = []
    if has("--out-dir"):
        args += ["--out-dir", str(out_dir)]
    elif has("--out"):
        as_dir = re.search(r"\.out\s*/|\.out\.mkdir", src) is not None
        args += ["--out", str(out_dir if as_dir else out_dir / f"{script.stem}.json")]
    elif has("--json"):
        args += ["--json", str(out_dir / f"{script.stem}.json")]
    if quick and has("--quick"):
        args.append("--quick")
    return args


def _json_table(data: Any, limit: int = 30) -> str | None:
    recs = data
    if isinstance(data, dict):
        recs = next((v for v in data.values() if isinstance(v, list) and v
                     and all(isinstance(x, dict) for x in v)), None)
    if not isinstance(recs, list) or not recs or not all(isinstance(r, dict) for r in recs):
        return None
    keys = [k for k, v in recs[0].items() if isinstance(v, (int, float, str, bool)) or v is None]
    rows = [[(f"{r.get(k):.4g}" if isinstance(r.get(k), float) else r.get(k)) for k in keys]
            for r in recs[:limit]]
    more = f"\n\n({len(recs) - limit} more rows in the JSON)" if len(recs) > limit else ""
    return md_table(keys, rows) + more


def run_kernels(ctx: Context) -> Outcome:
    out_dir = ctx.out / "kernels"
    out_dir.mkdir(parents=True, exist_ok=True)
    md, data, skipped = [], {}, []
    failures = 0
    for script in kernel_scripts():
        sdir = out_dir / script.stem
        sdir.mkdir(parents=True, exist_ok=True)
        before = {p: p.stat().st_mtime for p in sdir.rglob("*.json")}
        cmd = [sys.executable, str(script), *_script_args(script, sdir, ctx.quick)]
        ctx.progress(f"    {rel(script)}")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                                  cwd=sdir, env={**gpu_env(),
                                                 "VLLM_KIMI_EXT_BENCH_OUT": str(sdir)},
                                  check=False)
            rc = proc.returncode
            log = proc.stdout + proc.stderr
        except subprocess.TimeoutExpired:
            rc, log = "timeout (900 s)", ""
        new = sorted(p for p in sdir.rglob("*.json") if before.get(p) != p.stat().st_mtime)
        (sdir / f"{script.stem}.log").write_text(scrub(log))
        entry = {"exit": rc, "json": [rel(p) for p in new]}
        data[script.name] = entry
        md += [f"### {script.name}", ""]
        if rc != 0:
            failures += 1
            skipped.append((script.name, f"exited {rc}: {last_error_line(log)}"))
            md += [f"Exited {rc}: `{last_error_line(log)}`", ""]
        for p in new:
            try:
                payload = json.loads(p.read_text())
            except ValueError:
                continue
            entry.setdefault("results", {})[p.name] = payload
            md += [f"`{rel(p)}`:", "", _json_table(payload) or "(see the JSON)", ""]
        if rc == 0 and not new:
            md += ["Ran, wrote no JSON.", ""]
    status = "ok" if failures == 0 else ("partial" if failures < len(data) else "failed")
    return Outcome(status, None if status == "ok" else f"{failures} script(s) failed",
                   data=data, markdown="\n".join(md).strip(), skipped=skipped)
