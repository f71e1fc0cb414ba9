"""The sections of ``bench/run_all.py``: what each needs, how it runs, what it reports.

Each section is a module with ``run(ctx) -> Outcome`` and its requirement check
(``needs(caps, ctx) -> reason or None``); :data:`SECTIONS` lists them in order. A section
never raises: a failure becomes ``status="failed"`` with the reason, and parts of a section
that could not run become rows of the report's "skipped (why)" table.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from bench.harness.common import first_line, scrub
from bench.harness.sections.allreduce import needs_allreduce, run_allreduce
from bench.harness.sections.base import Context, Outcome
from bench.harness.sections.collectives import needs_collectives, run_collectives
from bench.harness.sections.costmodel import needs_costmodel, run_costmodel
from bench.harness.sections.e2e import needs_e2e, run_e2e
from bench.harness.sections.engine import needs_engine, run_engine
from bench.harness.sections.kernels import needs_kernels, run_kernels
from bench.harness.sections.verify_cpu import needs_verify, run_verify

__all__ = ["SECTIONS", "SECTION_NAMES", "Context", "Outcome", "SectionSpec", "plan",
           "run_section"]

@dataclasses.dataclass(frozen=True)
class SectionSpec:
    name: str
    title: str
    scope: str  # any machine / one GPU / several GPUs / the real box
    needs: Callable[[dict, Context], str | None]
    run: Callable[[Context], Outcome]


SECTIONS: tuple[SectionSpec, ...] = (
    SectionSpec("costmodel", "Cost model (prediction)", "any machine", needs_costmodel,
                run_costmodel),
    SectionSpec("verify-cpu", "Verifier CPU microbenchmark", "any machine", needs_verify,
                run_verify),
    SectionSpec("collectives", "Collectives per pass (gloo, TP=2)", "any machine",
                needs_collectives, run_collectives),
    SectionSpec("engine", "vLLM engine on this CPU (TP=2, Kimi-shaped target)", "any machine",
                needs_engine, run_engine),
    SectionSpec("gpu-kernels", "GPU kernel benchmarks", "one GPU", needs_kernels, run_kernels),
    SectionSpec("allreduce", "All-reduce microbenchmark", "several GPUs", needs_allreduce,
                run_allreduce),
    SectionSpec("e2e", "End-to-end serving", "the real box", needs_e2e, run_e2e),
)
SECTION_NAMES = tuple(s.name for s in SECTIONS)


def plan(caps: dict, ctx: Context, only: list[str] | None = None,
         skip: list[str] | None = None) -> list[tuple[SectionSpec, str | None]]:
    """[(section, None to run / reason to skip)] in order."""
    out = []
    for s in SECTIONS:
        if only and s.name not in only:
            why = f"not selected (--only {','.join(only)})"
        elif skip and s.name in skip:
            why = "--skip"
        else:
            why = s.needs(caps, ctx)
        out.append((s, why))
    return out


def run_section(spec: SectionSpec, ctx: Context) -> tuple[Outcome, float]:
    t0 = time.monotonic()
    try:
        outcome = spec.run(ctx)
    except Exception as exc:  # noqa: BLE001 - a section never takes the run down
        import traceback

        outcome = Outcome("failed", first_line(exc),
                          data={"traceback": scrub(traceback.format_exc())[-4000:]})
    return outcome, time.monotonic() - t0
