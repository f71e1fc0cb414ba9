"""Running an e2e matrix: one ``vllm serve`` per launch, every load level against it, and
``results.json`` (schema ``vllm-kimi-ext/e2e-results/1``) plus ``report.md`` rewritten after
every step, so an interrupted run still leaves its results."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness.cli import looks_like_local_path
from bench.harness.common import (
    collect_provenance,
    first_line,
    fmt,
    gpu_env,
    now_iso,
    rel,
    scrub,
    write_json,
)
from bench.harness.e2e.checkpoint import tiny_asset_paths, write_tiny_assets
from bench.harness.e2e.config import TINY, TINY_EAGLE3, ConfigError
from bench.harness.e2e.load import http_get, run_level
from bench.harness.e2e.matrix import (
    ServerConfig,
    check_pythons,
    expand_matrix,
    level_plan,
    serve_command,
)
from bench.harness.e2e.metrics import (
    M_GENERATION_TOKENS,
    acceptance_delta,
    metric_total,
    parse_collective_lines,
    parse_prometheus,
)
from bench.harness.e2e.report import e2e_markdown
from bench.harness.e2e.server import Server, probe_software, served_model_id
from bench.harness.prompts import load_prompts
from bench.harness.schema import E2E_SCHEMA
from testkit.distributed import free_port  # stdlib only

#: Seconds to wait after a level before the final metrics scrape.
SETTLE_S = 1.0
#: What a run writes into its results directory; an earlier run's are never replaced
#: silently (``bench/e2e/runner.py run`` refuses them without ``--overwrite``).
RESULT_NAMES = ("results.json", "report.md", "logs", "forecast.json", "forecast.md")


def _cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


@dataclasses.dataclass
class _Launches:
    """What the server launches of one run share."""

    cfg: dict[str, Any]
    out_dir: Path
    model_path: str
    prompts: dict[str, Any]
    base_env: dict[str, str]
    progress: Callable[[str], None]
    save: Callable[[], None]
    software: dict[str, dict] = dataclasses.field(default_factory=dict)  # python -> probe
    failed_starts: list[str] = dataclasses.field(default_factory=list)


def earlier_results(out_dir: Path) -> list[str]:
    """The names of :data:`RESULT_NAMES` already in ``out_dir`` (an earlier run's)."""
    out_dir = Path(out_dir)
    return [n for n in RESULT_NAMES if (out_dir / n).exists()] if out_dir.is_dir() else []


def clear_earlier_results(out_dir: Path) -> list[str]:
    """Remove an earlier run's :data:`RESULT_NAMES` from ``out_dir`` (``--overwrite``);
    returns what was removed. The ``checkpoints/`` cache stays."""
    removed = earlier_results(out_dir)
    for name in removed:
        p = Path(out_dir) / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    return removed


@dataclasses.dataclass
class Plan:
    """The launches of a run, checked; nothing written yet."""

    servers: list[ServerConfig]
    model_ref: str
    model_path: str
    tiny: bool
    notes: list[str]


def plan_matrix(cfg: dict[str, Any], out_dir: Path, *, model: str | None = None,
                pythons: dict[str, str] | None = None,
                select: dict[str, set[str]] | None = None, launching: bool = True,
                where: str = "config", python_option: str = "--python",
                model_option: str = "--model") -> Plan:
    """Expand and check the matrix without writing anything. With ``launching`` every
    python must be an executable and a model given as a local path must exist; without
    (``--plan-only``) pythons that were not given are placeholders. ``where`` and the
    ``*_option`` names say in errors where a bad value came from."""
    notes: list[str] = []
    model_ref = model or cfg["model"]
    model_at = f"{model_option} {model}" if model else f"{where}: 'model' {model_ref}"
    if model_ref.startswith("@") and model_ref != TINY:
        raise ConfigError(f"{model_at}: unknown placeholder; expected a path, a hub id or "
                          f"{TINY}")
    tiny = model_ref == TINY or any(TINY_EAGLE3 in json.dumps(v) for v in cfg["matrix"].values())
    placeholders = tiny_asset_paths(Path(out_dir) / "checkpoints") if tiny else {}
    if tiny:
        notes.append("model: a tiny Kimi-K2.5-shaped checkpoint written on the fly "
                     "(exercises the pipeline; its speed means nothing)")
    if launching:
        _check_local_models(cfg, model_ref, model_at, where)
    servers = expand_matrix(cfg, pythons=pythons, placeholders=placeholders, select=select,
                            notes=notes, launching=launching, where=where,
                            python_option=python_option)
    if launching:
        check_pythons(servers, pythons or {}, where, python_option)
    return Plan(servers, model_ref, placeholders.get(model_ref, model_ref), tiny, notes)


def _check_local_models(cfg: dict[str, Any], model_ref: str, model_at: str,
                        where: str) -> None:
    """A model or draft written as a local path (``/...``, ``./...``, ``~/...``) exists."""
    refs = [(model_at, model_ref)]
    for axis, values in cfg["matrix"].items():
        for name, spec in values.items():
            draft = (spec.get("speculative_config") or {}).get("model")
            if draft:
                refs.append((f"{where}: matrix {axis}={name}: 'speculative_config': 'model' "
                             f"{draft}", draft))
    for at, ref in refs:
        if looks_like_local_path(ref) and not Path(ref).expanduser().is_dir():
            raise ConfigError(f"{at}: no such directory (expected a checkpoint directory or a "
                              "hub id)")


def run_matrix(cfg: dict[str, Any], out_dir: Path, *, model: str | None = None,
               pythons: dict[str, str] | None = None, select: dict[str, set[str]] | None = None,
               config_file: str | None = None, plan_only: bool = False,
               stop_after_failed_starts: int | None = None, time_budget_s: float | None = None,
               use_git: bool = True, progress=print, plan: Plan | None = None
               ) -> dict[str, Any]:
    """Run the matrix (``plan``: from :func:`plan_matrix`, made here when not given);
    writes ``results.json`` and ``report.md`` under ``out_dir`` after every step and
    returns the results. With ``plan_only`` nothing is written or started: the result
    skeleton (every run ``planned``) is returned."""
    t_start = time.monotonic()
    out_dir = Path(out_dir)
    if plan is None:
        plan = plan_matrix(cfg, out_dir, model=model, pythons=pythons, select=select,
                           launching=not plan_only)
    notes = list(plan.notes)
    prompts = {d: load_prompts(d, cfg["requests_per_level"], cfg["seed"])
               for d in cfg["datasets"]}
    ncuda = _cuda_devices()
    if ncuda == 0:
        notes.append("no CUDA device visible to the runner: vllm serve is expected to fail to "
                      "start here (vLLM on CPU needs its CPU build with triton-cpu)")
    results = _planned_results(cfg, plan.servers, prompts, plan.model_ref,
                               rel(plan.model_path) if plan.tiny else plan.model_path,
                               plan.tiny, config_file, notes, use_git, ncuda)
    if plan_only:
        return results
    out_dir.mkdir(parents=True, exist_ok=True)
    if plan.tiny:
        write_tiny_assets(out_dir / "checkpoints")

    def save() -> None:
        results["duration_s"] = round(time.monotonic() - t_start, 1)
        write_json(out_dir / "results.json", results)
        (out_dir / "report.md").write_text(scrub(e2e_markdown(results)))

    save()
    launches = _Launches(cfg, out_dir, plan.model_path, prompts,
                         gpu_env() if ncuda else dict(os.environ), progress, save)
    for i, (sc, run) in enumerate(zip(plan.servers, results["runs"])):
        why = _why_not_attempted(launches.failed_starts, stop_after_failed_starts,
                                 time.monotonic() - t_start, time_budget_s)
        if why is not None:
            run.update(status="not_started", reason=why)
            continue
        _launch(launches, i, len(plan.servers), sc, run)
    save()
    return results


def _planned_results(cfg: dict[str, Any], servers: list[ServerConfig], prompts: dict,
                     model_ref: str, model_shown: str, tiny: bool, config_file: str | None,
                     notes: list[str], use_git: bool, ncuda: int) -> dict[str, Any]:
    """The result document before any launch: every run ``planned``."""
    results: dict[str, Any] = {
        "schema": E2E_SCHEMA,
        "name": cfg["name"],
        "created": now_iso(),
        "model": {"ref": model_ref, "path": model_shown, "tiny": tiny},
        "config_file": rel(config_file) if config_file else None,
        "config": cfg,
        "matrix": {a: list(v) for a, v in cfg["matrix"].items()},
        "prompts": {d: {"source": p.source, "count": len(p.prompts), "note": p.note}
                    for d, p in prompts.items()},
        "provenance": {**collect_provenance(use_git=use_git), "cuda_devices": ncuda},
        "runs": [],
        "notes": notes,
        "duration_s": None,
    }
    for sc in servers:
        results["runs"].append({
            "id": sc.id, "axes": sc.axes, "python": rel(sc.python), "env": sc.env,
            "serve_args": sc.serve_args, "speculative_config": sc.speculative_config,
            "status": "planned", "reason": None, "startup_s": None, "levels": [],
            "server_log": None, "server_software": None,
        })
    return results


def _why_not_attempted(failed_starts: list[str], stop_after: int | None, elapsed_s: float,
                       budget_s: float | None) -> str | None:
    if stop_after is not None and len(failed_starts) >= stop_after:
        first = f" (first: {failed_starts[0]})" if failed_starts else ""
        return f"not attempted after {len(failed_starts)} failed server start(s){first}"
    if budget_s is not None and elapsed_s > budget_s:
        return f"time budget {budget_s:.0f} s spent"
    return None


def _launch(ctx: _Launches, i: int, n: int, sc: ServerConfig, run: dict[str, Any]) -> None:
    """Start one server, measure every level against it, stop it; the outcome goes into
    ``run`` (a failure is recorded there, and the next launch still runs)."""
    cfg = ctx.cfg
    if sc.python not in ctx.software:
        ctx.software[sc.python] = probe_software(sc.python)
    run["server_software"] = ctx.software[sc.python]
    port = free_port()
    log_path = ctx.out_dir / "logs" / f"{i:02d}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', sc.id)}.log"
    run["server_log"] = rel(log_path)
    server = Server(serve_command(sc, ctx.model_path, port, cfg.get("served_model_name")),
                    {**ctx.base_env, **sc.env}, log_path, port)
    ctx.progress(f"[{i + 1}/{n}] {sc.id}: starting vllm serve")
    t0 = time.monotonic()
    try:
        server.start()
        ready, why = server.wait_ready(cfg["startup_timeout_s"])
        if not ready:
            run.update(status="server_failed", reason=why)
            ctx.failed_starts.append(why or "?")
            ctx.progress(f"    server did not start: {why}")
            return
        run["startup_s"] = round(time.monotonic() - t0, 1)
        api_model = served_model_id(port, cfg.get("served_model_name") or ctx.model_path)
        for ds, temp, conc in level_plan(cfg):
            lv = _measure_level(server, api_model, ctx.prompts[ds], ds, temp, conc, cfg)
            run["levels"].append(lv)
            ctx.progress(f"    {ds} T={temp:g} c={conc}: {lv['completed']}/{lv['requests']} ok, "
                         f"{fmt(lv['output_tokens_per_s'], '.1f')} tok/s, TPOT p50 "
                         f"{fmt(lv['tpot_ms_p50'], '.1f')} ms")
            ctx.save()
        run["status"] = "ok"
    except Exception as exc:  # noqa: BLE001 - recorded; the next config still runs
        run.update(status="failed", reason=first_line(exc))
    finally:
        server.stop()
        ctx.save()


def _measure_level(server: Server, model: str, prompts, ds: str, temp: float, conc: int,
                   cfg: dict[str, Any]) -> dict[str, Any]:
    def scrape() -> dict:
        try:
            status, body = http_get(server.port, "/metrics", timeout=30)
            return parse_prometheus(body.decode("utf-8", "replace")) if status == 200 else {}
        except OSError:
            return {}

    before = scrape()
    log_from = server.log_size()
    stats = run_level(server.port, model, list(prompts.prompts), concurrency=conc,
                      requests=cfg["requests_per_level"], max_tokens=cfg["max_tokens"],
                      temperature=temp, ignore_eos=cfg["ignore_eos"],
                      time_limit_s=cfg["level_time_limit_s"],
                      request_timeout_s=cfg["request_timeout_s"])
    time.sleep(SETTLE_S)  # let the engine publish its last stats
    after = scrape()
    gen = None
    if metric_total(after, M_GENERATION_TOKENS) is not None:
        gen = round((metric_total(after, M_GENERATION_TOKENS) or 0)
                        - (metric_total(before, M_GENERATION_TOKENS) or 0))
    text = server.log_text()[log_from:]
    coll = parse_collective_lines(text)
    per_tok = by_phase = None
    tokens = gen or stats["output_tokens"]
    if coll and tokens:
        per_tok = round(coll["calls"] / tokens, 3)
        by_phase = {p: round(n / tokens, 3) for p, n in sorted(coll["by_phase"].items())}
    return {"dataset": ds, "temperature": temp, "concurrency": conc, **stats,
            "acceptance": acceptance_delta(before, after), "generation_tokens": gen,
            "collectives_per_output_token": per_tok, "collectives_by_phase": by_phase}

