"""The e2e config file: its format, and every field checked before anything runs.

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
each launch runs every (dataset, temperature, concurrency) level. Axis and value names are
letters, digits and ``_ . + -`` (they make up run ids, ``--select AXIS=V`` and
``compare --axis NAME=VA:VB``). A bad file, an unknown key, a wrong type, a negative or
NaN number is a :class:`ConfigError` naming the file, the field and what was expected.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness.cli import UsageError, read_text

#: The config ``bench/e2e/runner.py run`` and run_all's e2e section use without one.
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "e2e-tiny.yaml"
TINY = "@tiny"
TINY_EAGLE3 = "@tiny-eagle3"
VALUE_KEYS = {"python", "env", "serve_args", "speculative_config"}
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
NAME_TEXT = "a name of letters, digits and _ . + - (quote it in YAML)"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConfigError(UsageError):
    """The e2e config (or a run argument checked against it) is wrong."""


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _text(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip())


def _scalar(v: Any) -> bool:
    return isinstance(v, str) or _number(v)


def _list_of(check: Callable[[Any], bool], nonempty: bool = False) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and (bool(v) or not nonempty) and all(map(check, v))


def _temperature(v: Any) -> bool:
    return _number(v) and v >= 0


def _seconds(v: Any) -> bool:
    return _number(v) and v > 0


#: key -> (check, what a valid value is); "matrix", "exclude" and "datasets" are checked
#: further in :func:`normalize_config`.
FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "name": (_text, "a non-empty string"),
    "description": (lambda v: isinstance(v, str), "a string"),
    "model": (_text, "a model path, a hub id or @tiny"),
    "served_model_name": (_text, "a non-empty string"),
    "serve_args": (_list_of(_scalar), "a list of strings or numbers"),
    "allow_same_python": (lambda v: isinstance(v, bool), "true or false"),
    "matrix": (lambda v: isinstance(v, dict) and bool(v), "a non-empty mapping axis -> values"),
    "exclude": (_list_of(lambda e: isinstance(e, dict) and bool(e)),
                "a list of mappings axis -> value"),
    "datasets": (_list_of(_text, nonempty=True), "a non-empty list of dataset names"),
    "concurrency": (_list_of(lambda c: _int(c) and c >= 1, nonempty=True),
                    "a non-empty list of positive integers"),
    "temperature": (lambda v: _temperature(v) or _list_of(_temperature, nonempty=True)(v),
                    "a finite number >= 0 or a non-empty list of them"),
    "requests_per_level": (lambda v: _int(v) and v >= 1, "a positive integer"),
    "max_tokens": (lambda v: _int(v) and v >= 1, "a positive integer"),
    "ignore_eos": (lambda v: isinstance(v, bool), "true or false"),
    "level_time_limit_s": (_seconds, "a finite number of seconds > 0"),
    "request_timeout_s": (_seconds, "a finite number of seconds > 0"),
    "startup_timeout_s": (_seconds, "a finite number of seconds > 0"),
    "seed": (lambda v: _int(v) and v >= 0, "an integer >= 0"),
}
CONFIG_KEYS = tuple(FIELDS)
REQUIRED = ("name", "model", "matrix")
DEFAULTS: dict[str, Any] = {
    "serve_args": [], "allow_same_python": False, "exclude": [],
    "datasets": ["mt-bench", "humaneval", "gsm8k"], "concurrency": [1], "temperature": 0.0,
    "requests_per_level": 16, "max_tokens": 256, "ignore_eos": False,
    "level_time_limit_s": 300.0, "request_timeout_s": 600.0, "startup_timeout_s": 1800.0,
    "seed": 0,
}


def shown(v: Any) -> str:
    """``got ...`` text of a bad value: its type and (shortened) value."""
    text = repr(v)
    return f"{type(v).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------


def _no_duplicates(pairs: list[tuple[str, Any]], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ConfigError(f"{where}: key {k!r} appears twice in one mapping")
        out[k] = v
    return out


def _yaml(text: str, where: str) -> Any:
    try:
        import yaml
    except ImportError:
        raise ConfigError(f"{where}: PyYAML is needed for YAML configs (pip install pyyaml), "
                          "or use the JSON form") from None

    class Loader(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict:
        loader.flatten_mapping(node)
        pairs = [(loader.construct_object(k, deep=True), loader.construct_object(v, deep=True))
                 for k, v in node.value]
        try:
            return _no_duplicates(pairs, where)
        except TypeError:  # an unhashable key (a list as key)
            raise ConfigError(f"{where}: a mapping key at line {node.start_mark.line + 1} is "
                              "not a plain value") from None

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        return yaml.load(text, Loader=Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML: {problem}{at}") from None


def _json(text: str, where: str) -> Any:
    def constant(name: str) -> Any:
        raise ConfigError(f"{where}: not valid JSON: {name} is not a JSON number")

    try:
        return json.loads(text, object_pairs_hook=lambda p: _no_duplicates(p, where),
                          parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON: {exc.msg} at line {exc.lineno} column "
                          f"{exc.colno}") from None


def load_config(path: str | Path, option: str = "--config") -> dict[str, Any]:
    """Read and check the config file at ``path`` (``option`` names it in errors)."""
    path = Path(path)
    where = f"{option} {path}" if option else str(path)
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        raise ConfigError(f"{where}: expected a .yaml, .yml or .json file")
    try:
        text = read_text(option, path)
    except UsageError as exc:
        raise ConfigError(str(exc)) from None
    data = _yaml(text, where) if suffix in (".yaml", ".yml") else _json(text, where)
    return normalize_config(data, str(path))


# ---------------------------------------------------------------------------------------------
# checking
# ---------------------------------------------------------------------------------------------


def normalize_config(data: Any, where: str = "config") -> dict[str, Any]:
    """The checked config with defaults filled in (temperature always a list of floats,
    serve_args strings); :class:`ConfigError` for the first problem found."""
    if data is None:
        raise ConfigError(f"{where}: empty, expected a mapping with {', '.join(REQUIRED)}")
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping at the top level, got "
                          f"{type(data).__name__}")
    _refuse_unknown_keys(data, CONFIG_KEYS, where)
    for key in REQUIRED:
        if key not in data:
            raise ConfigError(f"{where}: missing {key!r}, expected {FIELDS[key][1]}")
    for key, value in data.items():
        check, expected = FIELDS[key]
        if not check(value):
            raise ConfigError(f"{where}: {key!r}: expected {expected}, got {shown(value)}")
    if data["model"].startswith("@") and data["model"] != TINY:
        raise ConfigError(f"{where}: 'model': unknown placeholder {data['model']!r}; expected a "
                          f"path, a hub id or {TINY}")
    cfg = {**copy.deepcopy(DEFAULTS), **copy.deepcopy(data)}
    temps = cfg["temperature"]
    cfg["temperature"] = [float(t) for t in (temps if isinstance(temps, list) else [temps])]
    cfg["serve_args"] = [str(a) for a in cfg["serve_args"]]
    _check_matrix(cfg["matrix"], where)
    _check_excludes(cfg["exclude"], cfg["matrix"], where)
    from bench.harness.prompts import DATASETS

    bad = [d for d in cfg["datasets"] if d not in DATASETS]
    if bad:
        raise ConfigError(f"{where}: 'datasets': unknown dataset(s) {', '.join(map(repr, bad))}; "
                          f"expected some of {', '.join(DATASETS)}")
    return cfg


def _refuse_unknown_keys(mapping: dict, known: tuple[str, ...] | list[str], at: str) -> None:
    unknown = sorted(repr(k) for k in mapping if k not in known)
    if unknown:
        raise ConfigError(f"{at}: unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}")


def _check_matrix(matrix: dict[str, Any], where: str) -> None:
    """Names, value keys and their types; null values become ``{}`` (in place)."""
    for axis, values in matrix.items():
        if not isinstance(axis, str) or not NAME.match(axis):
            raise ConfigError(f"{where}: matrix axis {axis!r}: expected {NAME_TEXT}")
        if not isinstance(values, dict) or not values:
            raise ConfigError(f"{where}: matrix axis {axis!r}: expected a non-empty mapping "
                              f"value name -> settings, got {shown(values)}")
        for name in list(values):
            if not isinstance(name, str) or not NAME.match(name):
                raise ConfigError(f"{where}: matrix {axis}: value {name!r}: expected "
                                  f"{NAME_TEXT}")
            spec = {} if values[name] is None else values[name]
            at = f"{where}: matrix {axis}={name}"
            if not isinstance(spec, dict):
                raise ConfigError(f"{at}: expected a mapping of {sorted(VALUE_KEYS)} or null, "
                                  f"got {shown(spec)}")
            _refuse_unknown_keys(spec, sorted(VALUE_KEYS), at)
            _check_value(spec, at)
            values[name] = spec


def _check_value(spec: dict[str, Any], at: str) -> None:
    if "python" in spec:
        py = spec["python"]
        if not _text(py) or (py.startswith("@") and not NAME.match(py[1:])):
            raise ConfigError(f"{at}: 'python': expected @NAME (given with --python NAME=PATH) "
                              f"or a python path, got {shown(py)}")
    env = spec.get("env")
    if env is not None:
        if not isinstance(env, dict):
            raise ConfigError(f"{at}: 'env': expected a mapping NAME -> value, got {shown(env)}")
        for k, v in env.items():
            if not isinstance(k, str) or not ENV_NAME.match(k):
                raise ConfigError(f"{at}: 'env': {k!r}: expected an environment variable name")
            if not _scalar(v):
                raise ConfigError(f"{at}: 'env': {k}: expected a string or number (quote it "
                                  f"in YAML), got {shown(v)}")
    if spec.get("serve_args") is not None and not _list_of(_scalar)(spec["serve_args"]):
        raise ConfigError(f"{at}: 'serve_args': expected a list of strings or numbers, got "
                          f"{shown(spec['serve_args'])}")
    sc = spec.get("speculative_config")
    if sc is not None:
        _check_speculative(sc, f"{at}: 'speculative_config'")


def _check_speculative(sc: Any, at: str) -> None:
    if not isinstance(sc, dict) or not all(isinstance(k, str) for k in sc):
        raise ConfigError(f"{at}: expected a mapping (vLLM's --speculative-config), got "
                          f"{shown(sc)}")
    if "method" in sc and not _text(sc["method"]):
        raise ConfigError(f"{at}: 'method': expected a non-empty string, got "
                          f"{shown(sc['method'])}")
    model = sc.get("model")
    if model is not None:
        if not _text(model):
            raise ConfigError(f"{at}: 'model': expected a path or hub id, got {shown(model)}")
        if model.startswith("@") and model not in (TINY, TINY_EAGLE3):
            raise ConfigError(f"{at}: 'model': unknown placeholder {model!r}; expected a path, "
                              f"a hub id, {TINY} or {TINY_EAGLE3}")
    k = sc.get("num_speculative_tokens")
    if k is not None and not (_int(k) and k >= 1):
        raise ConfigError(f"{at}: 'num_speculative_tokens': expected a positive integer, got "
                          f"{shown(k)}")


def _check_excludes(excludes: list[dict[str, Any]], matrix: dict[str, Any], where: str) -> None:
    for i, ex in enumerate(excludes):
        for axis, val in ex.items():
            if axis not in matrix or str(val) not in matrix[axis]:
                axes = "; ".join(f"{a}: {', '.join(v)}" for a, v in matrix.items())
                raise ConfigError(f"{where}: exclude[{i}] names {axis}={val}, not in the matrix "
                                  f"(axes and values: {axes})")


def python_refs(cfg: dict[str, Any]) -> set[str]:
    """The NAMEs of every ``python: "@NAME"`` in the matrix."""
    return {spec["python"][1:] for values in cfg["matrix"].values() for spec in values.values()
            if str(spec.get("python", "")).startswith("@")}
