"""How much stands behind a configuration: what was measured in public, and of which checkpoint.

Three levels, best first (:data:`LEVELS`), each meaning one thing:

* :data:`EXACT` - a public run of **this checkpoint** (on the target it was trained for) in
  this configuration (draft length, placement, vocabulary, verifier, all-reduce backend) on
  this class of box;
* :data:`SIBLING` - the same, but of a **sibling checkpoint** only (the same publisher's head
  of the same kind retrained for another Kimi version, a quantized copy, or a copy run on
  another target): its speed speaks for the configuration, its acceptance is not the
  draft's (the point estimate uses the draft's own field or card acceptance);
* :data:`MODELLED` - no public run of this configuration on this class of box: the number
  exists only in the cost model.

Every measured level names the **stack** of its runs (:data:`STACKS`: stock vLLM 0.34.0,
vLLM upstream main, or a fork / custom image). A configuration ranks as measured in the
answer's rule only when a run on stock 0.34.0 or upstream main stands behind it
(:attr:`Evidence.ranks_as_measured`): a fork-only run needs code this project does not ship.
A run that is also one of the cost model's calibration runs (the same source file and commit
as a ``calibration.sources`` entry of the hardware profile) is flagged
(:attr:`Evidence.calibration`): the forecast agrees with it partly by construction.

The runs are the ``public_runs`` of a draft profile, each with its source and commit;
``profiles/public-runs.json`` records the search for runs of each draft's exact checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from importlib import resources

from vllm_kimi_ext.costmodel.model import Plan

EXACT = "this checkpoint measured"
SIBLING = "sibling checkpoint measured"
MODELLED = "modelled only"
LEVELS = (EXACT, SIBLING, MODELLED)
WORDS = {
    EXACT: "measured: this checkpoint on this box class",
    SIBLING: "measured: a sibling checkpoint only, on this box class",
    MODELLED: "modelled only (no public run of this configuration on this box class)",
}
#: A run's ``stack`` field.
STOCK, UPSTREAM_MAIN, FORK = "stock vLLM 0.34.0", "vLLM upstream main", "fork"
STACKS = (STOCK, UPSTREAM_MAIN, FORK)
#: The class of box the cost model is calibrated on (a run's ``box`` field).
BOX_CLASS = "8x RTX PRO 6000"
CALIBRATION_NOTE = ("also one of the cost model's calibration runs, so the forecast agrees "
                    "with it partly by construction")


@dataclasses.dataclass(frozen=True)
class Evidence:
    level: str
    runs: tuple[dict, ...] = ()
    calibration: bool = False  # a run behind it is also a calibration run of the model

    @property
    def stacks(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.get("stack", "stack not recorded") for r in self.runs))

    @property
    def measured(self) -> bool:
        """Whether a public run of this configuration exists (any stack)."""
        return self.level != MODELLED

    @property
    def ranks_as_measured(self) -> bool:
        """Whether the answer's rule treats it as measured: a run on stock vLLM 0.34.0 or
        upstream main (a fork-only run needs code this project does not ship)."""
        return self.measured and any(s != FORK for s in self.stacks)

    def label(self) -> str:
        """The level in words with the stack of its runs (no sources)."""
        if not self.runs:
            return WORDS[self.level]
        return f"{WORDS[self.level]} ({', '.join(self.stacks)})"

    def short(self) -> str:
        """The level, its stack and the sources of its runs (one line, a table cell)."""
        srcs = "; ".join(dict.fromkeys(source_text(r["source"]) for r in self.runs))
        out = (f"{WORDS[self.level]} ({', '.join(self.stacks)}; {srcs})" if self.runs
               else WORDS[self.level])
        return out + (f"; {CALIBRATION_NOTE}" if self.calibration and self.runs else "")

    def text(self) -> str:
        """The level in words, with each run behind it and its source."""
        out = f"**{self.label()}**"
        if self.runs:
            out += ": " + "; ".join(run_text(r) for r in self.runs)
        if self.calibration:
            out += f" ({CALIBRATION_NOTE})"
        return out

    def to_dict(self) -> dict:
        return {"level": self.level, "words": WORDS[self.level], "stacks": list(self.stacks),
                "ranks_as_measured": self.ranks_as_measured,
                "calibration_run": self.calibration,
                "runs": [{"checkpoint": r.get("checkpoint"), "target": r.get("target"),
                          "stack": r.get("stack"), "source": r.get("source")}
                         for r in self.runs]}


def source_text(src: dict) -> str:
    return f"{src.get('repo', '?')} {src.get('file', '?')} @ {str(src.get('commit', '?'))[:10]}"


def run_text(r: dict) -> str:
    kind = f" ({r['same_kind']})" if r.get("same_kind") else ""
    return (f"`{r['checkpoint']}`{kind} k = {r['k']} on {r['target']}, {r['engine']} "
            f"[{r.get('stack', 'stack not recorded')}], {r.get('box', 'box not recorded')} "
            f"({r['settings']}): {r['result']} ({source_text(r['source'])})")


def _same_configuration(run: dict, plan: Plan) -> bool:
    """Whether ``run`` ran ``plan``'s configuration. The cost model prices decode context
    parallel size 1 only, so a run at DCP > 1 is never the plan's configuration."""
    return (run.get("k") == plan.k and run.get("dcp", 1) == 1
            and run.get("placement", "tp8") == plan.placement
            and run.get("vocab", "full") == plan.vocab
            and run.get("verifier", "gather") == plan.verifier
            and run.get("backend", "nccl") == plan.backend)


def is_exact(run: dict, draft) -> bool:
    """Whether ``run`` ran ``draft``'s own checkpoint on the target it was trained for."""
    return (run.get("checkpoint") == draft.checkpoint
            and run.get("target") == draft.raw.get("trained_for", "Kimi-K2.5"))


@lru_cache(maxsize=1)
def calibration_sources(hardware: str = "rtx-pro-6000-pcie-x8") -> frozenset:
    """(repo, file, commit) of every calibration source of the hardware profile."""
    from vllm_kimi_ext.costmodel.catalog import load_hardware

    srcs = load_hardware(hardware).calibration.get("sources", {})
    return frozenset((s.get("repo"), s.get("file"), s.get("commit")) for s in srcs.values())


def is_calibration_run(run: dict) -> bool:
    s = run.get("source") or {}
    return (s.get("repo"), s.get("file"), s.get("commit")) in calibration_sources()


def evidence(plan: Plan) -> Evidence:
    """The evidence level of ``plan`` and the public runs behind it. A plan without
    speculation is measured on the stock backend (the hardware profile's calibration runs,
    ``plan --validate``)."""
    if not plan.speculative:
        if plan.backend != "nccl":
            return Evidence(MODELLED)
        return Evidence(EXACT, calibration=True)
    runs = [r for r in public_runs(plan.draft) if isinstance(r, dict)]
    here = tuple(r for r in runs if _same_configuration(r, plan) and r.get("box") == BOX_CLASS)
    if not here:
        return Evidence(MODELLED)
    exact = tuple(r for r in here if is_exact(r, plan.draft))
    level, behind = (EXACT, exact) if exact else (SIBLING, here)
    return Evidence(level, behind, any(is_calibration_run(r) for r in behind))


def public_runs(draft) -> list:
    """The draft profile's ``public_runs`` and the runs of the search record
    (``profiles/public-runs.json``): this checkpoint on its own target
    (``exact_checkpoint_runs``) and on another Kimi version (``other_target_runs``, a sibling
    level by :func:`is_exact`)."""
    found = search_record().get("drafts", {}).get(draft.name, {})
    return [*draft.raw.get("public_runs", []), *found.get("exact_checkpoint_runs", []),
            *found.get("other_target_runs", [])]


@lru_cache(maxsize=1)
def search_record() -> dict:
    """``profiles/public-runs.json``: the search for public runs of each draft's exact
    checkpoint on 8-GPU PCIe boxes."""
    text = resources.files("vllm_kimi_ext.costmodel").joinpath(
        "profiles", "public-runs.json").read_text(encoding="utf-8")
    return json.loads(text)
