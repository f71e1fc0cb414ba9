"""Acceptance of drafted tokens, and consistent conversions between its usual forms.

Three forms are in use, and this module converts between them:

* **per-position rates** ``r_i`` (what vLLM logs as "per-position acceptance rate"): the
  fraction of steps in which draft position ``i`` was accepted. Acceptance stops at the
  first rejection, so ``r_1 >= r_2 >= ...``.
* **conditional rates** ``a_i = r_i / r_{i-1}`` (``r_0 = 1``): the probability that position
  ``i`` is accepted given that all before it were. The internal representation.
* **acceptance length** ``tau(k) = 1 + sum_{i<=k} r_i``: tokens emitted per step with ``k``
  draft tokens, the bonus token included (``1 <= tau <= k + 1``).
* **draft acceptance rate** ``(tau(k) - 1) / k`` (vLLM's "draft acceptance rate").

When only ``tau`` at one ``k`` is known, a constant conditional rate ``a`` is solved from
``tau = (1 - a^(k+1)) / (1 - a)``. Positions beyond the data repeat the last conditional
rate (a geometric tail); :attr:`Acceptance.measured_positions` says where data ends.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def tau_from_constant_rate(a: float, k: int) -> float:
    """Acceptance length for constant conditional rate ``a`` and ``k`` draft tokens."""
    if k < 0:
        raise ValueError("k must be >= 0")
    return float(sum(a**i for i in range(k + 1)))


def rate_from_tau(tau: float, k: int) -> float:
    """The constant conditional rate that gives acceptance length ``tau`` at ``k``."""
    if k < 1:
        raise ValueError("k must be >= 1 to infer a rate from an acceptance length")
    if not 1.0 <= tau <= k + 1.0:
        raise ValueError(f"acceptance length {tau} impossible with {k} draft tokens "
                         f"(must be within [1, {k + 1}])")
    lo, hi = 0.0, 1.0
    for _ in range(80):  # tau is increasing in a: bisection to machine precision
        mid = 0.5 * (lo + hi)
        if tau_from_constant_rate(mid, k) < tau:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@dataclasses.dataclass(frozen=True)
class Acceptance:
    """Conditional per-position acceptance rates with a geometric tail."""

    conditional: tuple[float, ...]
    source: str = ""

    def __post_init__(self) -> None:
        if not self.conditional:
            raise ValueError("need at least one acceptance rate")
        for a in self.conditional:
            if not 0.0 <= a <= 1.0:
                raise ValueError(f"acceptance rates must be within [0, 1], got {a}")

    # -- constructors ---------------------------------------------------------------------
    @classmethod
    def from_per_position(cls, rates: Sequence[float], source: str = "") -> Acceptance:
        """From vLLM-style per-position rates ``r_i`` (non-increasing)."""
        rates = [float(r) for r in rates]
        if not rates:
            raise ValueError("need at least one per-position rate")
        prev = 1.0
        cond = []
        for i, r in enumerate(rates, start=1):
            if not 0.0 <= r <= 1.0:
                raise ValueError(f"per-position rate {r} outside [0, 1]")
            if r > prev + 1e-12:
                raise ValueError(
                    f"per-position rates must not increase (position {i}: {r} > {prev}); "
                    "position i can only be accepted when position i-1 was"
                )
            cond.append(r / prev if prev > 0 else 0.0)
            prev = r
        return cls(tuple(cond), source or "per-position rates")

    @classmethod
    def from_conditional(cls, rates: Sequence[float], source: str = "") -> Acceptance:
        return cls(tuple(float(a) for a in rates), source or "conditional rates")

    @classmethod
    def from_tau(cls, tau: float, k: int, source: str = "") -> Acceptance:
        """From a mean acceptance length measured with ``k`` draft tokens."""
        a = rate_from_tau(tau, k)
        return cls((a,) * k, source or f"acceptance length {tau:g} at k={k}")

    @classmethod
    def from_draft_acceptance_rate(cls, rate: float, k: int, source: str = "") -> Acceptance:
        """From accepted draft tokens / drafted tokens measured with ``k`` draft tokens."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError("draft acceptance rate must be within [0, 1]")
        return cls.from_tau(1.0 + rate * k, k, source or f"draft acceptance rate {rate:g} at k={k}")

    @classmethod
    def none(cls) -> Acceptance:
        """A draft that is never accepted."""
        return cls((0.0,), "never accepted")

    # -- views ------------------------------------------------------------------------------
    @property
    def measured_positions(self) -> int:
        return len(self.conditional)

    def conditional_at(self, i: int) -> float:
        """Conditional rate of position ``i`` (1-based); the tail repeats the last one."""
        if i < 1:
            raise ValueError("positions are 1-based")
        return self.conditional[min(i, len(self.conditional)) - 1]

    def per_position(self, k: int) -> list[float]:
        out, prod = [], 1.0
        for i in range(1, k + 1):
            prod *= self.conditional_at(i)
            out.append(prod)
        return out

    def tau(self, k: int) -> float:
        """Expected tokens emitted per step with ``k`` draft tokens (bonus included)."""
        if k < 0:
            raise ValueError("k must be >= 0")
        return 1.0 + sum(self.per_position(k))

    def draft_acceptance_rate(self, k: int) -> float:
        return (self.tau(k) - 1.0) / k if k else 0.0

    def scaled(self, factor: float, source_note: str = "") -> Acceptance:
        """Every conditional rate multiplied by ``factor`` (e.g. reduced-vocab coverage)."""
        if not 0.0 <= factor <= 1.0:
            raise ValueError("scale factor must be within [0, 1]")
        src = f"{self.source} x {factor:g}" + (f" ({source_note})" if source_note else "")
        return Acceptance(tuple(a * factor for a in self.conditional), src)


def from_spec(spec: dict[str, Any], source: str = "") -> Acceptance:
    """From ``{"metric": ..., "k_ref": k, "values": v}`` (the shape of a draft card
    entry, a field figure and a calibration run's acceptance)."""
    metric, k_ref, value = spec.get("metric"), spec.get("k_ref"), spec.get("values",
                                                                            spec.get("value"))
    if metric == "per_position":
        return Acceptance.from_per_position(value, source)
    if not isinstance(k_ref, int) or k_ref < 1:
        raise ValueError(f"acceptance k_ref must be an integer >= 1, got {k_ref!r}")
    if metric == "acceptance_length":
        return Acceptance.from_tau(float(value), k_ref, source)
    if metric == "draft_acceptance_rate":
        return Acceptance.from_draft_acceptance_rate(float(value), k_ref, source)
    raise ValueError(f"unknown acceptance metric {metric!r} (expected per_position, "
                     "acceptance_length or draft_acceptance_rate)")


def from_draft_profile(acceptance: dict | None, dataset: str | None = None) -> Acceptance | None:
    """The reported (model-card) acceptance of a draft profile (``None`` when it publishes
    none)."""
    if not acceptance:
        return None
    values = acceptance.get("values", {})
    if not values:
        return None
    ds = dataset or acceptance.get("default_dataset") or sorted(values)[0]
    if ds not in values:
        raise KeyError(f"no reported acceptance for dataset {ds!r}; available: "
                       f"{', '.join(sorted(values))}")
    source = f"{ds}: {acceptance.get('source', '')}".strip()
    return from_spec({**acceptance, "values": values[ds]}, source)


# ---------------------------------------------------------------------------------------------
# The acceptance band
# ---------------------------------------------------------------------------------------------

SCENARIOS = ("low", "card", "high")


@dataclasses.dataclass(frozen=True)
class AcceptanceBand:
    """Low / card / high acceptance of one draft, each with where it comes from."""

    low: Acceptance
    card: Acceptance
    high: Acceptance
    card_is_assumed: bool = False  # no card figure: the middle of an assumed band

    def scenarios(self) -> dict[str, Acceptance]:
        return {"low": self.low, "card": self.card, "high": self.high}


def field_figures(acceptance: dict | None) -> list[Acceptance]:
    """Acceptance measured in public runs (``acceptance.field``), as Acceptance objects."""
    out = []
    for f in (acceptance or {}).get("field", []):
        where = f.get("source", {})
        label = f.get("label") or (f"{where.get('file', '?')}" if isinstance(where, dict)
                                   else str(where))
        out.append(from_spec(f, f"field: {label}"))
    return out


def field_to_card_ratios(drafts: list) -> list[float]:
    """(field tau - 1) / (card tau - 1) for every field figure of a draft that also publishes
    a card, at the card's k: how much of a card's gain survived each public run."""
    ratios = []
    for d in drafts:
        card = from_draft_profile(d.acceptance)
        k = int((d.acceptance or {}).get("k_ref", 3))
        for f in field_figures(d.acceptance):
            if card is not None and card.tau(k) > 1:
                ratios.append((f.tau(k) - 1) / (card.tau(k) - 1))
    return ratios


def field_to_card_ratio(drafts: list) -> float | None:
    """The smallest of :func:`field_to_card_ratios` (the band's low end); None without a
    draft that publishes both."""
    ratios = field_to_card_ratios(drafts)
    return min(ratios) if ratios else None


def mean_field_to_card_ratio(drafts: list) -> float | None:
    """The mean of :func:`field_to_card_ratios` (the point estimate's shrink); None without
    a draft that publishes both."""
    ratios = field_to_card_ratios(drafts)
    return sum(ratios) / len(ratios) if ratios else None


def point_for(draft, dataset: str | None = None, ratio: float | None = None
              ) -> Acceptance | None:
    """The point estimate of a draft's acceptance: its public field figure where any exists
    (the median by acceptance length at the card's k), else its card (``dataset`` or the
    default) shrunk by ``ratio`` (:func:`mean_field_to_card_ratio`), else the card; a draft
    without a card uses the middle of its assumed band. None when it has neither."""
    acc = draft.acceptance or {}
    k = int(acc.get("k_ref", 3))
    fields = sorted(field_figures(acc), key=lambda a: a.tau(k))
    if fields:
        return fields[(len(fields) - 1) // 2]
    card = from_draft_profile(acc, dataset if dataset in draft.datasets() else None)
    if card is None:
        band = band_for(draft, dataset, ratio)
        return band.card if band is not None else None
    if ratio is None:
        return card
    t = 1 + (card.tau(k) - 1) * ratio
    return Acceptance.from_tau(t, k, f"{card.source} x field/card ratio {ratio:.2f} (mean "
                               "over the public field figures of Kimi drafts; this draft has "
                               "none)")


def band_for(draft, dataset: str | None = None, ratio: float | None = None
             ) -> AcceptanceBand | None:
    """The band of a draft: card (``dataset`` or the default), low = the lowest field figure,
    else the card shrunk by ``ratio`` (see :func:`field_to_card_ratio`), high = the best of
    the card's datasets and field figures. A draft without a card uses its
    ``acceptance.assumed`` low/mid/high (acceptance lengths at ``k_ref``). None when neither
    exists."""
    acc = draft.acceptance or {}
    k = int(acc.get("k_ref", 3))
    card = from_draft_profile(acc, dataset if dataset in draft.datasets() else None)
    fields = field_figures(acc)
    if card is None:
        assumed = acc.get("assumed")
        if not assumed:
            return None
        why = assumed.get("source", "no published figure")
        low, mid, high = (Acceptance.from_tau(float(assumed[key]), k, f"assumed {key}: {why}")
                          for key in ("low", "mid", "high"))
        return AcceptanceBand(low, mid, high, card_is_assumed=True)
    candidates_high = [from_draft_profile(acc, ds) for ds in draft.datasets()] + fields
    high = max(candidates_high, key=lambda a: a.tau(k))
    if fields:
        low = min(fields, key=lambda a: a.tau(k))
    elif ratio is not None:
        t = 1 + (card.tau(k) - 1) * ratio
        low = Acceptance.from_tau(t, k, f"card x field/card ratio {ratio:.2f} (no field figure)")
    else:
        low = card
    if low.tau(k) > card.tau(k):
        low = card
    return AcceptanceBand(low, card, high)


# ---------------------------------------------------------------------------------------------
# Per-position acceptance from an e2e run (bench/e2e/runner.py results.json)
# ---------------------------------------------------------------------------------------------

E2E_SCHEMA = "vllm-kimi-ext/e2e-results/1"


def from_results_json(path, run_id: str | None = None,
                      checkpoints: list[str] | None = None) -> tuple[Acceptance, str]:
    """Pooled per-position acceptance of a speculative run of the e2e runner's
    ``results.json`` (levels weighted by their number of drafts), and the run's id.
    Without ``run_id``, a file with several speculative runs is narrowed to the runs whose
    draft model is one of ``checkpoints`` (the ``--draft`` given). ``ValueError`` names the
    file and the field on anything unusable."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read ({exc.__class__.__name__})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(doc, dict) or doc.get("schema") != E2E_SCHEMA:
        raise ValueError(f"{path}: field 'schema' must be {E2E_SCHEMA!r} (a results.json "
                         "written by bench/e2e/runner.py)")
    runs = [r for r in doc.get("runs") or [] if isinstance(r, dict) and any(
        isinstance(lv, dict) and (lv.get("acceptance") or {}).get("per_position")
        for lv in r.get("levels") or [])]
    if run_id is not None:
        runs = [r for r in runs if r.get("id") == run_id]
    elif len(runs) > 1 and checkpoints:
        mine = [r for r in runs if any(same_draft(_run_model(r), c) for c in checkpoints)]
        runs = mine or runs
    if not runs:
        raise ValueError(f"{path}: field 'runs': no speculative run with per-position "
                         "acceptance" + (f" and id {run_id!r}" if run_id else ""))
    if len(runs) > 1:
        raise ValueError(f"{path}: field 'runs': {len(runs)} speculative runs; pick one with "
                         "--acceptance-run (" + ", ".join(
                             f"{r.get('id')}: draft {_run_model(r) or 'not recorded'}"
                             for r in runs) + ")")
    run = runs[0]
    sums: list[float] = []
    drafts = 0
    where = f"{path}: field 'runs[{run.get('id')}].levels.acceptance"
    for lv in run["levels"]:
        acc = (lv or {}).get("acceptance") or {}
        per, n = acc.get("per_position") or [], acc.get("num_drafts")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            raise ValueError(f"{where}.num_drafts' must be a count (an integer >= 0), got "
                             f"{n!r}")
        if not per or not n:
            continue
        if not isinstance(per, list) or any(
                isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r <= 1
                for r in per):
            raise ValueError(f"{where}.per_position' must hold rates within [0, 1] (numbers, "
                             f"not true/false), got {per!r}")
        sums += [0.0] * (len(per) - len(sums))
        for i, r in enumerate(per):
            sums[i] += r * n
        drafts += n
    if not drafts:
        raise ValueError(f"{path}: field 'runs[{run.get('id')}].levels': no drafts counted")
    rates = [x / drafts for x in sums]
    return (Acceptance.from_per_position(rates, f"{path.name}: run {run.get('id')}, "
                                         f"{drafts} drafts"), str(run.get("id")))


def _run_model(run: dict) -> str:
    spec = run.get("speculative_config")
    model = spec.get("model") if isinstance(spec, dict) else None
    return model if isinstance(model, str) else ""


def results_draft(path, run_id: str) -> str | None:
    """The draft model (``speculative_config.model``) the run ``run_id`` of an e2e
    ``results.json`` measured, or None when it records none. Call after
    :func:`from_results_json` has accepted the file."""
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    for r in doc.get("runs") or []:
        if isinstance(r, dict) and str(r.get("id")) == run_id:
            spec = r.get("speculative_config")
            model = spec.get("model") if isinstance(spec, dict) else None
            return model if isinstance(model, str) and model else None
    return None


def same_draft(measured: str, checkpoint: str) -> bool:
    """Whether a run's draft model (a hub id or a local path) is the profile's checkpoint."""
    m, c = measured.rstrip("/"), checkpoint.rstrip("/")
    return bool(c) and bool(m) and (m == c or m.endswith("/" + c) or m.lower() == c.lower())
