"""What every ``run_all`` section shares: its context, its outcome, where the bench
scripts are."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness.common import ROOT

#: The ``bench/`` directory (kernel scripts, the all-reduce bench, the e2e runner).
BENCH = ROOT / "bench"


@dataclasses.dataclass
class Context:
    out: Path
    caps: dict[str, Any]
    quick: bool = False
    use_git: bool = True
    progress: Callable[[str], None] = print
    e2e_config: Path | None = None
    e2e_model: str | None = None
    e2e_pythons: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Outcome:
    status: str  # ok | partial | skipped | failed
    reason: str | None = None
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    markdown: str = ""
    artifacts: list[str] = dataclasses.field(default_factory=list)
    skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (item, why)


def cuda_devices(caps: dict) -> int:
    return int(caps.get("cuda", {}).get("device_count") or 0)
