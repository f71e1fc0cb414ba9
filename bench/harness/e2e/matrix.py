"""The e2e config and its matrix of ``vllm serve`` launches.

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
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from bench.harness.common import rel

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



class ConfigError(ValueError):
    pass



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
    from bench.harness.prompts import DATASETS

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

