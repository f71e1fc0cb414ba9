"""Result-file schemas as dataclasses, with a validator for their JSON form.

``validate(data, Cls)`` returns a list of problems (empty when ``data`` — parsed JSON — has
exactly the fields of ``Cls`` with the right types, recursively); ``check(data, Cls)`` raises
:class:`SchemaError` with all of them. Supported annotations: ``str``, ``int``, ``float``
(ints accepted), ``bool``, ``Any``, ``None``, ``X | None``, ``list[X]``, ``dict[str, X]``,
``Literal[...]`` and nested dataclasses. Fields with a default may be absent.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal

E2E_SCHEMA = "vllm-kimi-ext/e2e-results/1"
BENCH_SCHEMA = "vllm-kimi-ext/bench-results/1"


class SchemaError(ValueError):
    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems[:20]) + (" ..." if len(problems) > 20 else ""))
        self.problems = problems


def _type_ok(value: Any, tp: Any, path: str, problems: list[str]) -> None:
    if tp is Any:
        return
    if tp is None or tp is type(None):
        if value is not None:
            problems.append(f"{path}: expected null, got {type(value).__name__}")
        return
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if value is None:
            if len(non_none) < len(args):
                return
            problems.append(f"{path}: null not allowed")
            return
        best: list[str] | None = None
        for a in non_none:
            sub: list[str] = []
            _type_ok(value, a, path, sub)
            if not sub:
                return
            if best is None or len(sub) < len(best):
                best = sub
        problems.extend(best or [])  # the closest alternative's problems
        return
    if origin is Literal:
        if value not in args:
            problems.append(f"{path}: expected one of {list(args)}, got {value!r}")
        return
    if origin is list:
        if not isinstance(value, list):
            problems.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        for i, v in enumerate(value):
            _type_ok(v, args[0] if args else Any, f"{path}[{i}]", problems)
        return
    if origin is dict:
        if not isinstance(value, dict):
            problems.append(f"{path}: expected an object, got {type(value).__name__}")
            return
        for k, v in value.items():
            if not isinstance(k, str):
                problems.append(f"{path}: key {k!r} is not a string")
            _type_ok(v, args[1] if len(args) == 2 else Any, f"{path}.{k}", problems)
        return
    if dataclasses.is_dataclass(tp):
        problems.extend(validate(value, tp, path))
        return
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{path}: expected a number, got {type(value).__name__}")
        return
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{path}: expected an integer, got {type(value).__name__}")
        return
    if tp in (str, bool):
        if not isinstance(value, tp):
            problems.append(f"{path}: expected {tp.__name__}, got {type(value).__name__}")
        return
    raise TypeError(f"unsupported annotation {tp!r} at {path}")


def validate(data: Any, cls: type, path: str = "$") -> list[str]:
    """Problems of ``data`` against dataclass ``cls`` (empty list: valid)."""
    if not isinstance(data, dict):
        return [f"{path}: expected an object for {cls.__name__}, got {type(data).__name__}"]
    hints = typing.get_type_hints(cls)
    problems: list[str] = []
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                problems.append(f"{path}.{name}: missing")
            continue
        _type_ok(data[name], hints[name], f"{path}.{name}", problems)
    for key in data:
        if key not in fields:
            problems.append(f"{path}.{key}: unknown field")
    return problems


def check(data: Any, cls: type) -> None:
    problems = validate(data, cls)
    if problems:
        raise SchemaError(problems)


# ---------------------------------------------------------------------------------------------
# end-to-end results (bench/e2e/runner.py run)
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Acceptance:
    """Deltas of vLLM's spec-decode counters over one load level."""

    num_drafts: int
    draft_tokens: int
    accepted_tokens: int
    per_position: list[float]  # accepted at position i / drafts
    mean_acceptance_length: float | None  # 1 + accepted / drafts (bonus token included)
    draft_acceptance_rate: float | None  # accepted / draft tokens


@dataclasses.dataclass
class LevelResult:
    dataset: str
    temperature: float
    concurrency: int
    requests: int  # sent
    completed: int
    errors: int
    duration_s: float
    output_tokens: int
    output_tokens_per_s: float | None
    tpot_ms_p50: float | None
    tpot_ms_p90: float | None
    ttft_ms_p50: float | None
    latency_s_p50: float | None
    acceptance: Acceptance | None
    generation_tokens: int | None  # vllm:generation_tokens delta
    collectives_per_output_token: float | None
    collectives_by_phase: dict[str, float] | None  # calls per output token, by phase
    stopped_by: Literal["requests", "time_limit"]
    error_samples: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class RunResult:
    """One server launch: one point of the config matrix."""

    id: str
    axes: dict[str, str]
    python: str
    env: dict[str, str]
    serve_args: list[str]
    speculative_config: dict[str, Any] | None
    status: Literal["ok", "server_failed", "not_started", "failed", "planned"]
    reason: str | None
    startup_s: float | None
    levels: list[LevelResult]
    server_log: str | None
    server_software: dict[str, Any] | None


@dataclasses.dataclass
class PromptSource:
    source: str  # "package:<dist>" or "builtin"
    count: int
    note: str | None


@dataclasses.dataclass
class E2EResults:
    schema: str
    name: str
    created: str
    model: dict[str, Any]
    config_file: str | None
    config: dict[str, Any]
    matrix: dict[str, list[str]]
    prompts: dict[str, PromptSource]
    provenance: dict[str, Any]
    runs: list[RunResult]
    notes: list[str]
    duration_s: float | None = None


# ---------------------------------------------------------------------------------------------
# run_all results
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class SkipRow:
    section: str
    item: str
    why: str


@dataclasses.dataclass
class SectionRecord:
    name: str
    title: str
    status: Literal["ok", "partial", "skipped", "failed"]
    reason: str | None
    duration_s: float
    data: dict[str, Any]
    artifacts: list[str]


@dataclasses.dataclass
class BenchResults:
    schema: str
    created: str
    duration_s: float
    args: dict[str, Any]
    capabilities: dict[str, Any]
    provenance: dict[str, Any]
    sections: list[SectionRecord]
    skipped: list[SkipRow]
