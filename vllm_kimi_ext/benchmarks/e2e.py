"""End-to-end serving benchmark: ``vllm serve`` over a config matrix, a bounded load
generator against the OpenAI-compatible API on localhost, metric scraping and ``compare``.

The CLI is ``bench/e2e/runner.py``; this module holds the logic so tests can import it.

Config (YAML or JSON, see ``bench/configs/``)::

    name: kimi-k25-pcie8
    model: moonshotai/Kimi-K2.5          # "@tiny": a tiny Kimi-shaped checkpoint written on the fly
    serve_args: [--tensor-parallel-size, "8", --trust-remote-code]
    allow_same_python: false             # may "@stock" and "@patched" fall back to this python?
    matrix:                              # axis -> value -> {python, env, serve_args,
      env:                               #                    speculative_config} (or null)
        stock:   {python: "@stock"}
        patched: {python: "@patched", env: {VLLM_KIMI_EXT: "1"}}
      speculative:
        none: null
        eagle3-k3: {speculative_config: {method: eagle3, model: ..., num_speculative_tokens: 3}}
    exclude: [{env: stock, speculative: eagle3-k3}]
    datasets: [mt-bench, humaneval, gsm8k]
    concurrency: [1, 4, 16]
    temperature: 0.0                     # or a list
    requests_per_level: 32
    max_tokens: 256
    level_time_limit_s: 300
    startup_timeout_s: 1800

Every matrix point is one server launch (git patches cannot be toggled at run time, so
"stock" and "patched" are two Python environments, given with ``--python stock=PATH``);
each launch runs every (dataset, temperature, concurrency) level.
"""

from __future__ import annotations

import copy
import dataclasses
import http.client
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from vllm_kimi_ext.benchmarks.common import (
    first_line,
    fmt,
    last_error_line,
    md_table,
    now_iso,
    rel,
    scrub,
)
from vllm_kimi_ext.benchmarks.schema import E2E_SCHEMA
from vllm_kimi_ext.testing.distributed import free_port  # stdlib only

CONFIG_KEYS = {
    "name": str, "model": str, "served_model_name": str, "serve_args": list,
    "allow_same_python": bool, "matrix": dict, "exclude": list, "datasets": list,
    "concurrency": list, "temperature": (int, float, list), "requests_per_level": int,
    "max_tokens": int, "ignore_eos": bool, "level_time_limit_s": (int, float),
    "request_timeout_s": (int, float), "startup_timeout_s": (int, float), "seed": int,
    "description": str,
}
DEFAULTS: dict[str, Any] = {
    "serve_args": [], "allow_same_python": False, "exclude": [],
    "datasets": ["mt-bench", "humaneval", "gsm8k"], "concurrency": [1], "temperature": 0.0,
    "requests_per_level": 16, "max_tokens": 256, "ignore_eos": False,
    "level_time_limit_s": 300.0, "request_timeout_s": 600.0, "startup_timeout_s": 1800.0,
    "seed": 0,
}
VALUE_KEYS = {"python", "env", "serve_args", "speculative_config"}
TINY = "@tiny"
TINY_EAGLE3 = "@tiny-eagle3"

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
#: Seconds to wait after a level before the final metrics scrape.
SETTLE_S = 1.0


class ConfigError(ValueError):
    pass


# ---------------------------------------------------------------------------------------------
# config and matrix
# ---------------------------------------------------------------------------------------------


def load_config(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ConfigError(f"{path}: PyYAML is needed for YAML configs (pip install pyyaml) "
                              "or use the JSON form") from None
        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    return normalize_config(data, str(path))


def normalize_config(data: Any, where: str = "config") -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping at the top level")
    unknown = sorted(set(data) - set(CONFIG_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(CONFIG_KEYS)}")
    for key in ("name", "model", "matrix"):
        if key not in data:
            raise ConfigError(f"{where}: missing {key!r}")
    for key, tp in CONFIG_KEYS.items():
        if key in data and not isinstance(data[key], tp):
            raise ConfigError(f"{where}: {key!r} has type {type(data[key]).__name__}")
    cfg = {**copy.deepcopy(DEFAULTS), **copy.deepcopy(data)}
    if not isinstance(cfg["temperature"], list):
        cfg["temperature"] = [cfg["temperature"]]
    cfg["serve_args"] = [str(a) for a in cfg["serve_args"]]
    if not cfg["matrix"]:
        raise ConfigError(f"{where}: the matrix needs at least one axis")
    for axis, values in cfg["matrix"].items():
        if not isinstance(values, dict) or not values:
            raise ConfigError(f"{where}: matrix axis {axis!r} needs a mapping of values")
        for name, spec in list(values.items()):
            spec = {} if spec is None else spec
            if not isinstance(spec, dict):
                raise ConfigError(f"{where}: {axis}={name} must be a mapping or null")
            bad = sorted(set(spec) - VALUE_KEYS)
            if bad:
                raise ConfigError(f"{where}: {axis}={name} has unknown key(s) {bad}; "
                                  f"known: {sorted(VALUE_KEYS)}")
            values[name] = spec
    for ex in cfg["exclude"]:
        if not isinstance(ex, dict) or not ex:
            raise ConfigError(f"{where}: each exclude entry is a mapping axis -> value")
        for axis, val in ex.items():
            if axis not in cfg["matrix"] or str(val) not in cfg["matrix"][axis]:
                raise ConfigError(f"{where}: exclude names {axis}={val}, not in the matrix")
    from vllm_kimi_ext.benchmarks.prompts import DATASETS

    bad = [d for d in cfg["datasets"] if d not in DATASETS]
    if bad:
        raise ConfigError(f"{where}: unknown dataset(s) {bad}; known: {sorted(DATASETS)}")
    if not cfg["concurrency"] or any(not isinstance(c, int) or c < 1
                                     for c in cfg["concurrency"]):
        raise ConfigError(f"{where}: concurrency must be a list of positive integers")
    return cfg


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    id: str
    axes: dict[str, str]
    python: str
    python_ref: str | None
    env: dict[str, str]
    serve_args: list[str]
    speculative_config: dict[str, Any] | None


def _resolve_python(ref: str | None, pythons: dict[str, str], allow_same: bool,
                    notes: list[str]) -> str:
    if ref is None:
        return sys.executable
    if ref.startswith("@"):
        name = ref[1:]
        if name in pythons:
            return python_path(pythons[name])
        if allow_same:
            msg = (f"python {ref} not given (--python {name}=PATH): using the runner's python "
                   f"({rel(sys.executable)}) for it")
            if msg not in notes:
                notes.append(msg)
            return sys.executable
        raise ConfigError(f"the matrix needs python {ref}: pass --python {name}=PATH (a python "
                          "executable or a virtual environment) - git patches cannot be "
                          "toggled at run time, so each env is its own installation")
    return python_path(ref)


def python_path(path: str) -> str:
    p = Path(path).expanduser()
    if p.is_dir():
        for cand in (p / "bin" / "python", p / "Scripts" / "python.exe"):
            if cand.exists():
                return str(cand)
        raise ConfigError(f"{path}: a directory without bin/python")
    return str(p)


def _substitute(obj: Any, placeholders: dict[str, str]) -> Any:
    if isinstance(obj, str):
        return placeholders.get(obj, obj)
    if isinstance(obj, list):
        return [_substitute(v, placeholders) for v in obj]
    if isinstance(obj, dict):
        return {k: _substitute(v, placeholders) for k, v in obj.items()}
    return obj


def parse_select(items: list[str] | None) -> dict[str, set[str]]:
    """``["speculative=none,eagle3-k3", "env=patched"]`` -> {axis: {values}}."""
    out: dict[str, set[str]] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--select {item!r}: expected AXIS=VALUE[,VALUE...]")
        axis, vals = item.split("=", 1)
        out.setdefault(axis.strip(), set()).update(v.strip() for v in vals.split(",") if v)
    return out


def expand_matrix(cfg: dict[str, Any], *, pythons: dict[str, str] | None = None,
                  placeholders: dict[str, str] | None = None,
                  select: dict[str, set[str]] | None = None,
                  notes: list[str] | None = None) -> list[ServerConfig]:
    """Every server launch of the matrix (cartesian product minus excludes and outside
    ``select``), in axis order with the first axis varying slowest."""
    pythons = pythons or {}
    placeholders = placeholders or {}
    notes = notes if notes is not None else []
    select = select or {}
    for axis, vals in select.items():
        if axis not in cfg["matrix"]:
            raise ConfigError(f"--select {axis}: no such axis (axes: {list(cfg['matrix'])})")
        bad = vals - set(cfg["matrix"][axis])
        if bad:
            raise ConfigError(f"--select {axis}: unknown value(s) {sorted(bad)}")
    axes = list(cfg["matrix"])
    out = []
    for combo in itertools.product(*(list(cfg["matrix"][a]) for a in axes)):
        point = dict(zip(axes, combo))
        if any(all(point.get(a) == str(v) for a, v in ex.items()) for ex in cfg["exclude"]):
            continue
        if any(point[a] not in vals for a, vals in select.items()):
            continue
        python_ref = None
        env: dict[str, str] = {}
        serve_args = list(cfg["serve_args"])
        spec: dict[str, Any] | None = None
        spec_from = None
        for a in axes:
            v = cfg["matrix"][a][point[a]]
            if "python" in v:
                if python_ref is not None and v["python"] != python_ref:
                    raise ConfigError(f"{point}: two axes set python")
                python_ref = str(v["python"])
            for k, val in (v.get("env") or {}).items():
                if k in env and env[k] != str(val):
                    raise ConfigError(f"{point}: env {k} set twice with different values")
                env[k] = str(val)
            serve_args += [str(x) for x in v.get("serve_args") or []]
            if v.get("speculative_config") is not None:
                if spec is not None:
                    raise ConfigError(f"{point}: speculative_config from {spec_from} and {a}")
                spec, spec_from = dict(v["speculative_config"]), a
        out.append(ServerConfig(
            id=",".join(f"{a}={point[a]}" for a in axes),
            axes=point,
            python=_resolve_python(python_ref, pythons, cfg["allow_same_python"], notes),
            python_ref=python_ref,
            env=env,
            serve_args=_substitute(serve_args, placeholders),
            speculative_config=_substitute(spec, placeholders),
        ))
    if not out:
        raise ConfigError("the matrix (after excludes and --select) is empty")
    return out


def level_plan(cfg: dict[str, Any]) -> list[tuple[str, float, int]]:
    """(dataset, temperature, concurrency) of every load level, in run order."""
    return [(d, float(t), int(c)) for d in cfg["datasets"] for t in cfg["temperature"]
            for c in cfg["concurrency"]]


def serve_command(sc: ServerConfig, model: str, port: int,
                  served_model_name: str | None = None) -> list[str]:
    cmd = [sc.python, "-m", "vllm.entrypoints.cli.main", "serve", model,
           "--host", "127.0.0.1", "--port", str(port), *sc.serve_args]
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    if sc.speculative_config is not None:
        cmd += ["--speculative-config", json.dumps(sc.speculative_config, sort_keys=True)]
    return cmd


# ---------------------------------------------------------------------------------------------
# tiny checkpoint
# ---------------------------------------------------------------------------------------------


def write_tiny_assets(directory: str | Path) -> dict[str, str]:
    """A tiny Kimi-K2.5 language model (text form, ``DeepseekV3ForCausalLM`` with the real
    config fields and a Kimi-format tokenizer) and a tiny EAGLE-3 head for it.

    The text form is used because vLLM's ``KimiK25ForConditionalGeneration`` also needs a
    vision preprocessor config to serve; the language model and its collectives are the
    same."""
    from vllm_kimi_ext.testing.checkpoints import (
        TinyKimiSpec,
        write_tiny_deepseek_v3,
        write_tiny_eagle3,
    )
    from vllm_kimi_ext.testing.tokenizers import write_kimi_tokenizer

    directory = Path(directory)
    spec = TinyKimiSpec()
    model = directory / "tiny-kimi-k25-text"
    eagle = directory / "tiny-eagle3"
    if not (model / "model.safetensors").exists():
        write_tiny_deepseek_v3(model, spec)
        write_kimi_tokenizer(model, n_ranks=spec.num_ranks)
    if not (eagle / "model.safetensors").exists():
        write_tiny_eagle3(eagle, spec)
    return {TINY: str(model), TINY_EAGLE3: str(eagle)}


# ---------------------------------------------------------------------------------------------
# metrics
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------------


def http_get(port: int, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    for _ in range(3):  # follow a trailing-slash redirect (/metrics -> /metrics/)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            if resp.status in (301, 302, 307, 308) and resp.getheader("Location"):
                loc = resp.getheader("Location")
                path = re.sub(r"^https?://[^/]+", "", loc)
                continue
            return resp.status, body
        finally:
            conn.close()
    return 599, b"too many redirects"


def one_request(port: int, model: str, prompt: str, *, max_tokens: int, temperature: float,
                ignore_eos: bool, timeout: float) -> dict[str, Any]:
    """One streamed chat completion; returns timings and the output token count."""
    body: dict[str, Any] = {
        "model": model, "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens, "temperature": temperature, "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return {"ok": False, "error": f"HTTP {resp.status}: {resp.read()[:200]!r}"}
        first = last = None
        chunks = 0
        usage = None
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            obj = json.loads(data)
            if obj.get("usage"):
                usage = obj["usage"]
            for ch in obj.get("choices") or []:
                delta = ch.get("delta") or {}
                if any(delta.get(k) for k in ("content", "reasoning_content", "reasoning")):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    chunks += 1
        end = time.perf_counter()
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return {"ok": False, "error": first_line(exc)}
    finally:
        conn.close()
    n_out = int(usage["completion_tokens"]) if usage and "completion_tokens" in usage else chunks
    return {
        "ok": True,
        "output_tokens": n_out,
        "ttft_s": (first - t0) if first else None,
        "tpot_s": ((last - first) / (n_out - 1)) if first and last and n_out > 1 else None,
        "latency_s": end - t0,
    }


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def run_level(port: int, model: str, prompts: list[str], *, concurrency: int, requests: int,
              max_tokens: int, temperature: float, ignore_eos: bool, time_limit_s: float,
              request_timeout_s: float) -> dict[str, Any]:
    """``requests`` requests at ``concurrency`` in flight (bounded by ``time_limit_s``:
    no request starts after it)."""
    lock = threading.Lock()
    state = {"next": 0}
    results: list[dict] = []
    start = time.perf_counter()
    deadline = start + time_limit_s

    def worker() -> None:
        while True:
            with lock:
                i = state["next"]
                if i >= requests or time.perf_counter() > deadline:
                    return
                state["next"] += 1
            r = one_request(port, model, prompts[i % len(prompts)], max_tokens=max_tokens,
                            temperature=temperature, ignore_eos=ignore_eos,
                            timeout=request_timeout_s)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    duration = time.perf_counter() - start
    ok = [r for r in results if r["ok"]]
    out_tokens = sum(r["output_tokens"] for r in ok)
    tpots = [r["tpot_s"] * 1e3 for r in ok if r.get("tpot_s") is not None]
    ttfts = [r["ttft_s"] * 1e3 for r in ok if r.get("ttft_s") is not None]
    lats = [r["latency_s"] for r in ok]

    def rnd(x: float | None, n: int = 3) -> float | None:
        return None if x is None else round(x, n)

    return {
        "requests": len(results),
        "completed": len(ok),
        "errors": len(results) - len(ok),
        "duration_s": round(duration, 3),
        "output_tokens": out_tokens,
        "output_tokens_per_s": rnd(out_tokens / duration if duration > 0 and ok else None),
        "tpot_ms_p50": rnd(_pct(tpots, 0.5)),
        "tpot_ms_p90": rnd(_pct(tpots, 0.9)),
        "ttft_ms_p50": rnd(_pct(ttfts, 0.5)),
        "latency_s_p50": rnd(_pct(lats, 0.5)),
        "stopped_by": "requests" if state["next"] >= requests else "time_limit",
        "error_samples": sorted({r["error"] for r in results if not r["ok"]})[:3],
    }


# ---------------------------------------------------------------------------------------------
# server lifecycle
# ---------------------------------------------------------------------------------------------

SOFTWARE_PROBE = r"""
import importlib.metadata as m, importlib.util, json, pathlib, sys
def v(n):
    try:
        return m.version(n)
    except Exception:
        return None
out = {"python": sys.version.split()[0]}
for n in ("vllm", "torch", "vllm-kimi-ext", "flashinfer-python", "triton"):
    out[n] = v(n)
rec = None
s = importlib.util.find_spec("vllm")
if s is not None and s.origin:
    p = pathlib.Path(s.origin).resolve().parent / "_kimi_ext_series.json"
    if p.is_file():
        rec = [x["name"] for x in json.loads(p.read_text()).get("series", [])]
out["patch_series"] = rec
print(json.dumps(out))
"""


def probe_software(python: str, timeout: float = 60.0) -> dict[str, Any]:
    """Versions and applied patch series of a python environment (without importing vLLM)."""
    try:
        proc = subprocess.run([python, "-c", SOFTWARE_PROBE], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": first_line(exc)}
    if proc.returncode != 0:
        return {"error": last_error_line(proc.stderr) or f"exit {proc.returncode}"}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": "unreadable probe output"}


class Server:
    """A ``vllm serve`` process in its own process group, logging to a file."""

    def __init__(self, cmd: list[str], env: dict[str, str], log_path: Path, port: int):
        self.cmd, self.env, self.log_path, self.port = cmd, env, log_path, port
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self._log.write("$ " + " ".join(self.cmd) + "\n")
        self._log.flush()
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)

    def wait_ready(self, timeout_s: float) -> tuple[bool, str | None]:
        """(ready, reason if not)."""
        deadline = time.monotonic() + timeout_s
        pause = 0.25
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False, (f"vllm serve exited with code {self.proc.returncode}: "
                               f"{last_error_line(self.log_text()) or 'no output'}")
            try:
                status, _ = http_get(self.port, "/health", timeout=5)
                if status == 200:
                    return True, None
            except OSError:
                pass
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
        return False, f"vllm serve not ready within {timeout_s:.0f} s"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def stop(self, grace_s: float = 60.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGTERM, 15.0),
                              (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self._log is not None:
            self._log.close()
            self._log = None


def served_model_id(port: int, fallback: str) -> str:
    try:
        status, body = http_get(port, "/v1/models", timeout=10)
        if status == 200:
            data = json.loads(body).get("data") or []
            if data:
                return data[0]["id"]
    except (OSError, ValueError, KeyError):
        pass
    return fallback


# ---------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------


def _cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


def run_matrix(cfg: dict[str, Any], out_dir: Path, *, model: str | None = None,
               pythons: dict[str, str] | None = None, select: dict[str, set[str]] | None = None,
               config_file: str | None = None, plan_only: bool = False,
               stop_after_failed_starts: int | None = None, time_budget_s: float | None = None,
               use_git: bool = True, progress=print) -> dict[str, Any]:
    """Run (or with ``plan_only`` just lay out) the matrix; writes ``results.json`` and
    ``report.md`` under ``out_dir`` after every step and returns the results."""
    from vllm_kimi_ext.benchmarks.common import collect_provenance, gpu_env, write_json
    from vllm_kimi_ext.benchmarks.prompts import load_prompts

    t_start = time.monotonic()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    model_ref = model or cfg["model"]
    placeholders: dict[str, str] = {}
    tiny = model_ref == TINY or any(TINY_EAGLE3 in json.dumps(v) for v in cfg["matrix"].values())
    if tiny:
        placeholders = write_tiny_assets(out_dir / "checkpoints")
        notes.append("model: a tiny Kimi-K2.5-shaped checkpoint written on the fly "
                     "(exercises the pipeline; its speed means nothing)")
    model_path = placeholders.get(model_ref, model_ref)
    servers = expand_matrix(cfg, pythons=pythons, placeholders=placeholders, select=select,
                            notes=notes)
    prompts = {d: load_prompts(d, cfg["requests_per_level"], cfg["seed"])
               for d in cfg["datasets"]}
    ncuda = _cuda_devices()
    if ncuda == 0:
        notes.append("no CUDA device visible to the runner: vllm serve is expected to fail to "
                      "start here (vLLM on CPU needs its CPU build with triton-cpu)")
    results: dict[str, Any] = {
        "schema": E2E_SCHEMA,
        "name": cfg["name"],
        "created": now_iso(),
        "model": {"ref": model_ref, "path": rel(model_path) if tiny else model_path,
                  "tiny": tiny},
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
    software_cache: dict[str, dict] = {}
    for sc in servers:
        results["runs"].append({
            "id": sc.id, "axes": sc.axes, "python": rel(sc.python), "env": sc.env,
            "serve_args": sc.serve_args, "speculative_config": sc.speculative_config,
            "status": "planned", "reason": None, "startup_s": None, "levels": [],
            "server_log": None, "server_software": None,
        })

    def save() -> None:
        results["duration_s"] = round(time.monotonic() - t_start, 1)
        write_json(out_dir / "results.json", results)
        (out_dir / "report.md").write_text(scrub(e2e_markdown(results)))

    save()
    if plan_only:
        progress(f"planned {len(servers)} server launch(es) x {len(level_plan(cfg))} level(s); "
                 "nothing started (--plan-only)")
        return results
    failed_starts: list[str] = []
    base_env = gpu_env() if ncuda else dict(os.environ)
    for i, (sc, run) in enumerate(zip(servers, results["runs"])):
        if stop_after_failed_starts is not None and len(failed_starts) >= \
                stop_after_failed_starts:
            run.update(status="not_started",
                       reason=f"not attempted after {len(failed_starts)} failed server "
                              f"start(s) (first: {failed_starts[0]})")
            continue
        if time_budget_s is not None and time.monotonic() - t_start > time_budget_s:
            run.update(status="not_started", reason=f"time budget {time_budget_s:.0f} s spent")
            continue
        if sc.python not in software_cache:
            software_cache[sc.python] = probe_software(sc.python)
        run["server_software"] = software_cache[sc.python]
        port = free_port()
        log_path = out_dir / "logs" / f"{i:02d}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', sc.id)}.log"
        run["server_log"] = rel(log_path)
        server = Server(serve_command(sc, model_path, port, cfg.get("served_model_name")),
                        {**base_env, **sc.env}, log_path, port)
        progress(f"[{i + 1}/{len(servers)}] {sc.id}: starting vllm serve")
        t0 = time.monotonic()
        try:
            server.start()
            ready, why = server.wait_ready(cfg["startup_timeout_s"])
            if not ready:
                run.update(status="server_failed", reason=why)
                failed_starts.append(why or "?")
                progress(f"    server did not start: {why}")
                continue
            run["startup_s"] = round(time.monotonic() - t0, 1)
            api_model = served_model_id(port, cfg.get("served_model_name") or model_path)
            for ds, temp, conc in level_plan(cfg):
                run["levels"].append(_measure_level(server, api_model, prompts[ds], ds, temp,
                                                    conc, cfg))
                lv = run["levels"][-1]
                progress(f"    {ds} T={temp:g} c={conc}: {lv['completed']}/{lv['requests']} ok, "
                         f"{fmt(lv['output_tokens_per_s'], '.1f')} tok/s, TPOT p50 "
                         f"{fmt(lv['tpot_ms_p50'], '.1f')} ms")
                save()
            run["status"] = "ok"
        except Exception as exc:  # noqa: BLE001 - recorded; the next config still runs
            run.update(status="failed", reason=first_line(exc))
        finally:
            server.stop()
            save()
    save()
    return results


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


# ---------------------------------------------------------------------------------------------
# reports and compare
# ---------------------------------------------------------------------------------------------


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
