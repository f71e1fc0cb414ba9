"""The matrix of ``vllm serve`` launches an e2e config expands to (the config format and its
checks: :mod:`bench.harness.e2e.config`), and the python environments they run in.

``expand_matrix`` resolves every ``@NAME`` python to the path given with ``--python NAME=PATH``
(one not given is an error, or with ``launching=False``, for ``--plan-only``, a placeholder);
``check_pythons`` refuses one that is not an executable (a run calls it, a plan does not).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

from bench.harness.cli import name_eq_value
from bench.harness.common import rel
from bench.harness.e2e.config import (  # noqa: F401 - re-exported for older imports
    CONFIG_KEYS,
    DEFAULTS,
    TINY,
    TINY_EAGLE3,
    VALUE_KEYS,
    ConfigError,
    load_config,
    normalize_config,
    python_refs,
)


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    id: str
    axes: dict[str, str]
    python: str
    python_ref: str | None
    env: dict[str, str]
    serve_args: list[str]
    speculative_config: dict[str, Any] | None


# ---------------------------------------------------------------------------------------------
# python environments
# ---------------------------------------------------------------------------------------------


def parse_pythons(items: list[str], option: str = "--python") -> dict[str, str]:
    """``["stock=/opt/venv", ...]`` -> {"stock": "/opt/venv"} (a leading ``@`` is dropped);
    a malformed item or one NAME given two different PATHs is a :class:`ConfigError`."""
    out: dict[str, str] = {}
    for item in items:
        try:
            name, path = name_eq_value(option, item)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if name in out and out[name] != path:
            raise ConfigError(f"{option} {name}: given twice ({out[name]!r} and {path!r}); "
                              "expected one PATH per NAME")
        out[name] = path
    return out


def check_python_names(cfg: dict[str, Any], pythons: dict[str, str], where: str,
                       option: str = "--python") -> None:
    """Every NAME of ``--python NAME=PATH`` is a ``@NAME`` the config's matrix uses (a typo
    would otherwise silently run the wrong environment)."""
    used = python_refs(cfg)
    for name in pythons:
        if name not in used:
            have = ", ".join(f"@{n}" for n in sorted(used)) or "no @NAME python"
            raise ConfigError(f"{option} {name}={pythons[name]}: {where} uses no @{name} "
                              f"(its matrix uses {have})")


def python_path(path: str, where: str = "python", check: bool = True) -> str:
    """The interpreter of ``path`` (an executable, or a virtual environment directory with
    ``bin/python``); with ``check`` it must exist and be executable, else a ConfigError
    that starts with ``where`` (which names the path)."""
    p = Path(path).expanduser()
    if p.is_dir():
        for cand in (p / "bin" / "python", p / "Scripts" / "python.exe"):
            if cand.exists():
                p = cand
                break
        else:
            if check:
                raise ConfigError(f"{where}: a directory without bin/python (expected a python "
                                  "executable or a virtual environment)")
            return str(p)
    if check and not (p.is_file() and os.access(p, os.X_OK)):
        why = "no such file" if not p.exists() else "not an executable file"
        raise ConfigError(f"{where}: {why} (expected a python executable or a virtual "
                          "environment directory)")
    return str(p)


def _resolve_python(ref: str | None, pythons: dict[str, str], allow_same: bool,
                    notes: list[str], *, launching: bool, option: str) -> str:
    """The interpreter of a launch (not checked: see :func:`check_pythons`)."""
    if ref is None:
        return sys.executable
    if not ref.startswith("@"):
        return python_path(ref, check=False)
    name = ref[1:]
    if name in pythons:
        return python_path(pythons[name], check=False)
    if allow_same:
        msg = (f"python {ref} not given ({option} {name}=PATH): using the runner's python "
               f"({rel(sys.executable)}) for it")
        if msg not in notes:
            notes.append(msg)
        return sys.executable
    if not launching:
        msg = f"python {ref} not given: a run needs {option} {name}=PATH"
        if msg not in notes:
            notes.append(msg)
        return f"{ref} (not given)"
    raise ConfigError(f"the matrix needs python {ref}: pass {option} {name}=PATH (a python "
                      "executable or a virtual environment) - git patches cannot be "
                      "toggled at run time, so each env is its own installation")


def check_pythons(servers: list[ServerConfig], pythons: dict[str, str], where: str,
                  option: str = "--python") -> None:
    """Every launch's python is an executable (a run needs them; a plan does not); the
    error names the ``--python NAME=PATH`` or the config's ``python:`` it came from."""
    seen = set()
    for sc in servers:
        ref = sc.python_ref
        if ref is None or ref in seen:
            continue
        seen.add(ref)
        if ref.startswith("@"):
            name = ref[1:]
            if name in pythons:
                python_path(pythons[name], f"{option} {name}={pythons[name]}")
        else:
            python_path(ref, f"{where}: matrix value of {sc.id}: 'python' {ref}")


# ---------------------------------------------------------------------------------------------
# the matrix
# ---------------------------------------------------------------------------------------------


def _substitute(obj: Any, placeholders: dict[str, str]) -> Any:
    if isinstance(obj, str):
        return placeholders.get(obj, obj)
    if isinstance(obj, list):
        return [_substitute(v, placeholders) for v in obj]
    if isinstance(obj, dict):
        return {k: _substitute(v, placeholders) for k, v in obj.items()}
    return obj


def parse_select(items: list[str] | None, option: str = "--select") -> dict[str, set[str]]:
    """``["speculative=none,eagle3-k3", "env=patched"]`` -> {axis: {values}}."""
    out: dict[str, set[str]] = {}
    for item in items or []:
        axis, sep, vals = item.partition("=")
        values = {v.strip() for v in vals.split(",")}
        if not sep or not axis.strip() or "" in values:
            raise ConfigError(f"{option} {item!r}: expected AXIS=VALUE[,VALUE...]")
        out.setdefault(axis.strip(), set()).update(values)
    return out


def _check_select(cfg: dict[str, Any], select: dict[str, set[str]], option: str) -> None:
    for axis, vals in select.items():
        if axis not in cfg["matrix"]:
            raise ConfigError(f"{option} {axis}: no such axis (axes: "
                              f"{', '.join(cfg['matrix'])})")
        bad = vals - set(cfg["matrix"][axis])
        if bad:
            raise ConfigError(f"{option} {axis}: unknown value(s) {', '.join(sorted(bad))} "
                              f"(values: {', '.join(cfg['matrix'][axis])})")


def _point_settings(cfg: dict[str, Any], point: dict[str, str], where: str
                    ) -> tuple[str | None, dict[str, str], list[str], dict[str, Any] | None]:
    """(python ref, env, serve args, speculative config) of one matrix point; two axes
    setting the same thing differently is a ConfigError."""
    python: str | None = None
    python_from = None
    env: dict[str, str] = {}
    serve_args = list(cfg["serve_args"])
    spec: dict[str, Any] | None = None
    spec_from = None
    at = ",".join(f"{a}={v}" for a, v in point.items())
    for a, value in point.items():
        v = cfg["matrix"][a][value]
        if "python" in v:
            if python is not None and v["python"] != python:
                raise ConfigError(f"{where}: {at}: two axes set python ({python_from} and "
                                  f"{a}={value}); expected at most one")
            python, python_from = str(v["python"]), f"{a}={value}"
        for k, val in (v.get("env") or {}).items():
            if k in env and env[k] != str(val):
                raise ConfigError(f"{where}: {at}: env {k} set twice with different values")
            env[k] = str(val)
        serve_args += [str(x) for x in v.get("serve_args") or []]
        if v.get("speculative_config") is not None:
            if spec is not None:
                raise ConfigError(f"{where}: {at}: speculative_config from {spec_from} and "
                                  f"{a}; expected at most one")
            spec, spec_from = dict(v["speculative_config"]), a
    return python, env, serve_args, spec


def expand_matrix(cfg: dict[str, Any], *, pythons: dict[str, str] | None = None,
                  placeholders: dict[str, str] | None = None,
                  select: dict[str, set[str]] | None = None,
                  notes: list[str] | None = None, launching: bool = True,
                  where: str = "config", python_option: str = "--python",
                  select_option: str = "--select") -> list[ServerConfig]:
    """Every server launch of the matrix (cartesian product minus excludes and outside
    ``select``), in axis order with the first axis varying slowest. ``where`` names the
    config file in errors; ``launching`` see the module docstring."""
    pythons = pythons or {}
    placeholders = placeholders or {}
    notes = notes if notes is not None else []
    select = select or {}
    _check_select(cfg, select, select_option)
    axes = list(cfg["matrix"])
    out = []
    for combo in itertools.product(*(list(cfg["matrix"][a]) for a in axes)):
        point = dict(zip(axes, combo))
        if any(all(point.get(a) == str(v) for a, v in ex.items()) for ex in cfg["exclude"]):
            continue
        if any(point[a] not in vals for a, vals in select.items()):
            continue
        python, env, serve_args, spec = _point_settings(cfg, point, where)
        out.append(ServerConfig(
            id=",".join(f"{a}={point[a]}" for a in axes),
            axes=point,
            python=_resolve_python(python, pythons, cfg["allow_same_python"],
                                   notes, launching=launching, option=python_option),
            python_ref=python,
            env=env,
            serve_args=_substitute(serve_args, placeholders),
            speculative_config=_substitute(spec, placeholders),
        ))
    if not out:
        raise ConfigError(f"{where}: the matrix (after excludes and {select_option}) is empty")
    return out


def level_plan(cfg: dict[str, Any]) -> list[tuple[str, float, int]]:
    """(dataset, temperature, concurrency) of every load level, in run order."""
    return [(d, float(t), int(c)) for d in cfg["datasets"] for t in cfg["temperature"]
            for c in cfg["concurrency"]]


def serve_command(sc: ServerConfig, model: str, port: int | str,
                  served_model_name: str | None = None) -> list[str]:
    cmd = [sc.python, "-m", "vllm.entrypoints.cli.main", "serve", model,
           "--host", "127.0.0.1", "--port", str(port), *sc.serve_args]
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    if sc.speculative_config is not None:
        cmd += ["--speculative-config", json.dumps(sc.speculative_config, sort_keys=True)]
    return cmd
