"""How much stands behind a configuration: measured in public, or only modelled.

Three levels, best first (:data:`LEVELS`):

* :data:`MEASURED` - a public run of this configuration (draft kind, ``k``, placement,
  vocabulary, verifier, all-reduce backend) on this class of box with stock (upstream) vLLM;
* :data:`ELSEWHERE` - public runs at this ``k`` exist, but only on vLLM forks or on other
  hardware;
* :data:`MODELLED` - no public run: the number exists only in the cost model.

The runs are the ``public_runs`` of a draft profile, each with its source. A run of a
sibling checkpoint (the same publisher's head of the same kind, retrained for another Kimi
version) counts for the configuration and is named as such (``same_kind``): its speed is the
configuration's, its acceptance is not the draft's (the point estimate uses the draft's own
field or card acceptance, :func:`~.acceptance.point_for`).
"""

from __future__ import annotations

import dataclasses

from vllm_kimi_ext.costmodel.model import Plan

MEASURED = "measured"
ELSEWHERE = "measured elsewhere"
MODELLED = "modelled only"
LEVELS = (MEASURED, ELSEWHERE, MODELLED)
WORDS = {
    MEASURED: "measured publicly on this box class with stock vLLM",
    ELSEWHERE: "measured only on vLLM forks or other hardware",
    MODELLED: "modelled only (no public run)",
}
#: The class of box the cost model is calibrated on (a run's ``box`` field).
BOX_CLASS = "8x RTX PRO 6000"


@dataclasses.dataclass(frozen=True)
class Evidence:
    level: str
    runs: tuple[dict, ...] = ()

    @property
    def measured(self) -> bool:
        return self.level == MEASURED

    def short(self) -> str:
        """The level in words with the sources of its runs (one line, a table cell)."""
        srcs = "; ".join(dict.fromkeys(source_text(r["source"]) for r in self.runs))
        return WORDS[self.level] + (f" ({srcs})" if srcs else "")

    def text(self) -> str:
        """The level in words, with each run behind it and its source."""
        out = f"**{WORDS[self.level]}**"
        if self.runs:
            out += ": " + "; ".join(run_text(r) for r in self.runs)
        return out


def source_text(src: dict) -> str:
    return f"{src.get('repo', '?')} {src.get('file', '?')} @ {str(src.get('commit', '?'))[:10]}"


def run_text(r: dict) -> str:
    kind = f" ({r['same_kind']})" if r.get("same_kind") else ""
    return (f"`{r['checkpoint']}`{kind} k = {r['k']} on {r['target']}, {r['engine']}, "
            f"{r.get('box', 'box not recorded')} ({r['settings']}): {r['result']} "
            f"({source_text(r['source'])})")


def _same_configuration(run: dict, plan: Plan) -> bool:
    return (run.get("k") == plan.k and run.get("placement", "tp8") == plan.placement
            and run.get("vocab", "full") == plan.vocab
            and run.get("verifier", "gather") == plan.verifier
            and run.get("backend", "nccl") == plan.backend)


def evidence(plan: Plan) -> Evidence:
    """The evidence level of ``plan`` and the public runs behind it. A plan without
    speculation is :data:`MEASURED` on the stock backend (the calibration runs of the
    hardware profile, ``plan --validate``)."""
    if not plan.speculative:
        return Evidence(MEASURED if plan.backend == "nccl" else MODELLED)
    runs = [r for r in plan.draft.raw.get("public_runs", []) if isinstance(r, dict)]
    here = tuple(r for r in runs if _same_configuration(r, plan) and r.get("stock_vllm")
                 and r.get("box") == BOX_CLASS)
    if here:
        return Evidence(MEASURED, here)
    elsewhere = tuple(r for r in runs if r.get("k") == plan.k)
    if elsewhere:
        return Evidence(ELSEWHERE, elsewhere)
    return Evidence(MODELLED)
