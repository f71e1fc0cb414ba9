"""The verify step of three verifiers, priced from measured per-rank step times and bytes.

Verifiers (TP ranks ``t``, vocabulary ``V``, ``n = B (k + 1)`` verified rows):

* ``stock`` - vLLM 0.34.0 as shipped: one all-gather of the ``[n, V]`` bf16 logits, then
  top-p and ``rejection_sample`` over the full vocabulary on every rank;
* ``sharded`` - this project's vocabulary-sharded verifier (``VLLM_KIMI_EXT_SHARDED_VERIFY=1``):
  each rank verifies over its own shard; ``rounds`` all-gathers of a fixed payload per row;
* ``batch_sharded`` - vLLM 0.34.0's ``--enable-batch-sharded-sampling``
  (``v1/worker/gpu/sample/batch_shard.py``): requests are owned round-robin by the ranks
  (``shard_owners``: batch position mod ``t``); one all-to-all sends every rank's vocabulary
  shard of each row to the row's owner, which samples and verifies its own requests on the
  full vocabulary, then one all-gather of the packed sampler output (int64: ``k + 1`` token
  ids, ``num_sampled``, ``num_rejected`` per request).

**Compute** is the per-rank time of each verify step captured in a CUDA graph on one H200
(communication excluded), read from the measured report
``bench/reports/verify_graph_vs_vllm_h200.json`` (:func:`load_report`; the package reads its
copy under ``profiles/verify/``). It is an H200
measurement used as a forecast input for the RTX PRO 6000 tables, not a claim about that
card. Row counts between two measured ones are interpolated linearly; outside the measured
range, or without the report, a price is ``None`` ("not measured: not priced"), never an
assumed number. ``batch_sharded`` runs vLLM's own kernels on the rows its busiest rank owns,
so its compute is the report's ``batch_sharded_us`` at the batch's ``B (k + 1)`` rows (the
busiest rank's graph-captured shard plan, permute, verify on the ``ceil(B / t) (k + 1)`` rows
it owns and packed output) where the report has that column, else the measured
``vllm_graph_us`` at ``ceil(B / t) (k + 1)`` rows, without the shard plan and pack kernels
(a lower bound, and the description says so).

**Communication** uses the cost model's PCIe collective model (the hardware profile's
latency table, all of whose points are published measurements, plus the fitted in-situ
overhead per collective), once per round, on NCCL. The latency table has no all-to-all
curve, so ``batch_sharded``'s all-to-all is priced as the NCCL all-gather in which every rank
receives as many bytes as the busiest rank of the all-to-all (``ceil(B / t) (k + 1)`` full
rows): a modelling rule, not a measurement.

``payload_bytes_per_row_per_rank`` is read as what one rank contributes per row **in each**
all-gather round (the verifier's rounds have a fixed size); a report whose rounds differ in
size prices the step at its largest round.
"""

from __future__ import annotations

import dataclasses
import math

from vllm_kimi_ext.costmodel.verify_measured import (
    KIMI_MODES,
    MODES,
    REPORT_NAME,
    VerifyMeasurements,
    measurements,
)
from vllm_kimi_ext.verify import protocol

VERIFIERS = ("stock", "sharded", "batch_sharded")
VERIFIER_LABEL = {
    "stock": "stock vLLM 0.34.0 (logits all-gather)",
    "sharded": "vocabulary-sharded (VLLM_KIMI_EXT_SHARDED_VERIFY=1)",
    "batch_sharded": "vLLM 0.34.0 --enable-batch-sharded-sampling",
}
#: The verifiers' names in tables and legends.
VERIFIER_SHORT = {"stock": "stock", "sharded": "sharded", "batch_sharded": "batch-sharded"}
NOT_PRICED = "not measured: not priced"
#: int64 columns of vLLM's packed sampler output per request beyond the k + 1 token ids
#: (``num_sampled``, ``num_rejected``; ``gather_sampler_output``).
BATCH_SHARD_EXTRA_COLUMNS = 2
INT64_BYTES = 8


# ---------------------------------------------------------------------------------------------
# Pricing
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class VerifyPrice:
    """One verifier's verify step per rank at one batch: measured compute + priced comm."""

    verifier: str
    batch: int
    k: int
    mode: str
    rows: int  # B (k + 1)
    compute_rows: float  # rows whose measured compute is used (the busiest rank's)
    compute_us: float | None  # H200, CUDA graph, per rank; None = not measured
    comm_us: float
    collectives: int
    sent_bytes_per_rank: float  # the busiest rank
    received_bytes_per_rank: float  # the busiest rank
    note: str = ""

    @property
    def priced(self) -> bool:
        return self.compute_us is not None

    @property
    def total_us(self) -> float | None:
        return None if self.compute_us is None else self.compute_us + self.comm_us


def _allgather_us(cm, total_bytes: float) -> float:
    return cm.collective_us("allgather", total_bytes, "nccl")


def price_stock(cm, meas: VerifyMeasurements | None, batch: int, k: int,
                mode: str) -> VerifyPrice:
    tp, v, b = cm.tp, cm.model.vocab_size, cm.model.dtype_bytes
    rows = batch * (k + 1)
    gathers = int(cm.model.collectives.get("logits_allgather", 1))
    total = rows * v * b
    compute = None if meas is None else meas.at(k, mode, rows, "vllm_graph_us")
    return VerifyPrice("stock", batch, k, mode, rows, rows, compute,
                       gathers * _allgather_us(cm, total), gathers,
                       gathers * total / tp, gathers * total * (tp - 1) / tp,
                       f"{gathers} NCCL all-gather of [{rows}, {v}] bf16")


def price_sharded(cm, meas: VerifyMeasurements | None, batch: int, k: int,
                  mode: str) -> VerifyPrice:
    tp = cm.tp
    rows = batch * (k + 1)
    comm = None if meas is None else meas.sharded_comm(k, mode, rows)
    if comm is None:
        return VerifyPrice("sharded", batch, k, mode, rows, rows, None, 0.0, 0, 0.0, 0.0,
                           NOT_PRICED)
    payload, rounds = comm
    per_rank = rows * payload
    return VerifyPrice("sharded", batch, k, mode, rows, rows,
                       meas.at(k, mode, rows, "ours_graph_us"),
                       rounds * _allgather_us(cm, per_rank * tp), rounds,
                       rounds * per_rank, rounds * per_rank * (tp - 1),
                       f"{rounds} NCCL all-gather(s) of {payload:g} B per row per rank")


def price_batch_sharded(cm, meas: VerifyMeasurements | None, batch: int, k: int,
                        mode: str) -> VerifyPrice:
    tp, v, b = cm.tp, cm.model.vocab_size, cm.model.dtype_bytes
    rows = batch * (k + 1)
    owned_reqs = math.ceil(batch / tp)  # shard_owners: batch position mod tp
    owned_rows = owned_reqs * (k + 1)
    shard_row = v / tp * b  # what one rank sends of one row it does not own
    # all-to-all: the busiest rank receives its owned rows' shards from the tp - 1 others,
    # as much as every rank receives in an all-gather of [owned_rows, V]
    a2a_us = _allgather_us(cm, owned_rows * v * b)
    packed = owned_reqs * (k + 1 + BATCH_SHARD_EXTRA_COLUMNS) * INT64_BYTES
    out_us = _allgather_us(cm, packed * tp)
    # measured: the busiest rank's whole batch-sharded work at these rows (the report's
    # batch_sharded_us); else vLLM's verify alone on the owned rows, a lower bound
    measured = None if meas is None else meas.at(k, mode, rows, "batch_sharded_us")
    if measured is not None:
        compute, how = measured, "shard plan, permute, verify and pack measured"
    else:
        compute = None if meas is None else meas.at(k, mode, owned_rows, "vllm_graph_us")
        how = "shard plan and pack kernels not priced (lower bound)"
    # the rank owning fewest requests sends the most; the one owning most receives the most
    sent = (rows - (batch // tp) * (k + 1)) * shard_row + packed
    received = owned_rows * (tp - 1) * shard_row + packed * (tp - 1)
    return VerifyPrice("batch_sharded", batch, k, mode, rows, owned_rows, compute,
                       a2a_us + out_us, 2, sent, received,
                       f"1 all-to-all ({owned_rows} full rows to the busiest rank) + 1 "
                       f"all-gather of {packed} B per rank; {how}")


#: The sampling mode the cost model's sharded-verifier row is priced in (Kimi's thinking
#: mode, T = 1.0 / top_p 0.95: what Kimi's API serves by default).
DEFAULT_MODE = "top_p_T1"
#: The constant the sharded-verifier row falls back to where the report has no measurement
#: (one all-gather of the stats-only step's float32 columns per row per rank, no cut).
FALLBACK_BYTES_PER_ROW_PER_RANK = protocol.STATS_ONLY_COLUMNS * protocol.FLOAT_BYTES


def sharded_terms(cm, rows: float, k: int | None, mode: str = DEFAULT_MODE,
                  meas: VerifyMeasurements | None = None) -> list | None:
    """The cost model's verify terms of the sharded verifier at ``rows = B (k + 1)``, priced
    from the measured report: the measured per-rank step (compute) and its all-gather
    rounds of the measured payload on the PCIe collective model. None where the report has
    no measurement (no report, ``k`` unknown or outside the measured rows): the caller then
    falls back to :data:`FALLBACK_BYTES_PER_ROW_PER_RANK` and says so."""
    from vllm_kimi_ext.costmodel.terms import Term

    meas = meas if meas is not None else measurements()
    if meas is None or k is None:
        return None
    us = meas.at(k, mode, rows, "ours_graph_us")
    comm = meas.sharded_comm(k, mode, rows)
    if us is None or comm is None:
        return None
    payload, rounds = comm
    per_rank = rows * payload
    gathers = int(cm.model.collectives.get("logits_allgather", 1))
    return [
        cm.collective("verify", f"sharded verifier: {rounds} all-gather(s) of {payload:g} B "
                      f"per row per rank (measured payload, {mode})", "allgather",
                      gathers * rounds, per_rank * cm.tp, "nccl", per_rank_bytes=per_rank),
        Term("verify", f"sharded verify step per rank (measured: {meas.hardware_text()}, "
             f"CUDA graph, {mode}, {REPORT_NAME})", time_s=gathers * us * 1e-6),
    ]


PRICERS = {"stock": price_stock, "sharded": price_sharded, "batch_sharded": price_batch_sharded}


def price(cm, meas: VerifyMeasurements | None, verifier: str, batch: int, k: int,
          mode: str) -> VerifyPrice:
    if verifier not in PRICERS:
        raise ValueError(f"verifier must be one of {VERIFIERS}, not {verifier!r}")
    return PRICERS[verifier](cm, meas, batch, k, mode)


# ---------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EndToEnd:
    """One configuration's decode step with each verifier's priced verify step in place of
    the cost model's own verify terms (the target pass, draft and overheads unchanged;
    every verifier is lossless, so tokens per step are the same)."""

    batch: int
    mode: str
    rest_s: float  # the step without its verify phase
    tokens_per_step: float
    prices: dict[str, VerifyPrice]

    def step_s(self, verifier: str) -> float | None:
        t = self.prices[verifier].total_us
        return None if t is None else self.rest_s + t * 1e-6

    def tokens_per_s(self, verifier: str) -> float | None:
        s = self.step_s(verifier)
        return None if s is None else self.tokens_per_step / s

    def gain(self, verifier: str, over: str = "stock") -> float | None:
        a, b = self.tokens_per_s(verifier), self.tokens_per_s(over)
        return None if a is None or b is None else a / b - 1.0


def end_to_end(cm, plan, acceptance, meas: VerifyMeasurements | None,
               mode: str) -> EndToEnd:
    """``plan`` (its verifier ignored) at its batch, each verifier priced from ``meas``."""
    base = cm.estimate(dataclasses.replace(plan, verifier="gather"), acceptance)
    rest = base.step_s - sum(t.time_s for t in base.terms if t.phase == "verify")
    prices = {v: price(cm, meas, v, plan.batch, plan.k, mode) for v in VERIFIERS}
    return EndToEnd(plan.batch, mode, rest, base.tokens_per_step, prices)


def winning_batches(cm, meas: VerifyMeasurements | None, k: int, mode: str,
                    verifier: str = "sharded", over: str = "stock",
                    max_batch: int = 64) -> tuple[list[int], list[int]]:
    """(batches 1..max_batch where ``verifier``'s priced verify step is shorter than
    ``over``'s, batches where both are priced). Everything else in a step is the same for
    both, so a shorter verify step is a win end to end."""
    wins, priced = [], []
    for b in range(1, max_batch + 1):
        a, o = price(cm, meas, verifier, b, k, mode), price(cm, meas, over, b, k, mode)
        if a.priced and o.priced:
            priced.append(b)
            if a.total_us < o.total_us:
                wins.append(b)
    return wins, priced


def _ranges(xs: list[int]) -> str:
    out, start = [], None
    for i, x in enumerate(xs):
        if start is None:
            start = x
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            out.append(f"{start}" if start == x else f"{start}-{x}")
            start = None
    return ", ".join(out)


def verdict(cm, meas: VerifyMeasurements | None, k: int, mode: str,
            verifier: str = "sharded", over: str = "stock", max_batch: int = 64) -> str:
    """One sentence: from which batch ``verifier`` beats ``over`` end to end, per the model."""
    wins, priced = winning_batches(cm, meas, k, mode, verifier, over, max_batch)
    if not priced:
        return f"{NOT_PRICED} (k={k}, {mode})"
    span = f"batches {priced[0]}-{priced[-1]} priced"
    if not wins:
        return f"loses at every priced batch ({span})"
    # the smallest batch from which it wins at every larger priced batch
    start = next((b for b in priced if all(x in wins for x in priced if x >= b)), None)
    if start == priced[0]:
        return f"wins at every priced batch ({span})"
    if start is not None:
        return f"wins from batch {start} on ({span})"
    return f"wins at batches {_ranges(wins)} only ({span})"


def sharded_recommendable(cm, batch: int, k: int, meas: VerifyMeasurements | None = None
                          ) -> tuple[bool, str]:
    """Whether the measurements price the sharded verifier below stock at this batch and
    ``k`` under both of Kimi's sampling settings (the recommender offers it only then), and
    why not."""
    meas = meas if meas is not None else measurements()
    if meas is None:
        return False, f"its verify step is not measured ({REPORT_NAME} missing): not priced"
    for mode in KIMI_MODES:
        s, g = price_sharded(cm, meas, batch, k, mode), price_stock(cm, meas, batch, k, mode)
        if not (s.priced and g.priced):
            return False, (f"its verify step is not measured at {batch * (k + 1)} rows, k={k} "
                           f"({mode}): not priced")
        if s.total_us >= g.total_us:
            return False, (f"slower than stock under Kimi's sampling ({mode}: "
                           f"{s.total_us:.0f} us vs {g.total_us:.0f} us per verify step, "
                           f"measured compute on {meas.hardware_text()} + PCIe comm model)")
    return True, ""


def crossover(cm, meas: VerifyMeasurements | None, k: int, mode: str,
              max_batch: int = 64) -> int | None | str:
    """The smallest batch from which ``--enable-batch-sharded-sampling``'s priced verify
    step is shorter than the sharded verifier's at every larger priced batch; ``"never"``
    when the sharded verifier is shorter at the largest priced batch; None when nothing is
    priced."""
    wins, priced = winning_batches(cm, meas, k, mode, "batch_sharded", "sharded", max_batch)
    if not priced:
        return None
    start = next((b for b in priced if all(x in wins for x in priced if x >= b)), None)
    return "never" if start is None else start


def handover(cm, meas: VerifyMeasurements | None, k: int, mode: str) -> tuple[int | None, bool]:
    """Both on (``VLLM_KIMI_EXT_SHARDED_VERIFY=1`` and ``--enable-batch-sharded-sampling``):
    ``(start, priced)``, the smallest batch whose steps go to batch-sharded sampling (every
    larger one too; None: every step stays sharded) and whether anything is priced at ``k``
    in ``mode``. ``start`` is :func:`crossover`'s batch, and 1 where nothing is priced. The
    rule ``integration.verifier_choice`` applies per step and :func:`price_both` prices."""
    c = crossover(cm, meas, k, mode)
    if c is None:
        return 1, False
    return (None if c == "never" else int(c)), True


def handover_table(cm, meas: VerifyMeasurements | None) -> dict:
    """:func:`handover` for every measured k and every mode, as the serving side reads it
    (``integration/handover.json``, written by ``nox -s docs``; the plugin never builds a
    cost model): per k and mode the first batch handed over (None: never) and whether it
    was priced."""
    ks = sorted({c.k for c in meas.cases}) if meas is not None else []
    return {
        "source": f"{REPORT_NAME} ({'no report' if meas is None else meas.date}) priced on "
                  f"the {cm.hw.name} collective model (costmodel/verify_cost.py)",
        "k": {str(k): {mode: dict(zip(("from", "priced"), handover(cm, meas, k, mode)))
                       for mode in MODES} for k in ks},
    }


def handover_words(cm, meas: VerifyMeasurements | None, k: int, mode: str) -> str:
    """:func:`handover` in words: what both on runs at which batch."""
    start, priced = handover(cm, meas, k, mode)
    if not priced:
        return f"batch-sharded at every batch ({NOT_PRICED})"
    if start is None:
        return "sharded at every batch"
    return ("batch-sharded at every batch" if start == 1 else
        f"sharded below batch {start}, batch-sharded from {start}")


def price_both(cm, meas: VerifyMeasurements | None, batch: int, k: int,
               mode: str) -> VerifyPrice:
    """Both on: the verifier :func:`handover` picks at ``batch``, priced."""
    start, _ = handover(cm, meas, k, mode)
    handed = start is not None and batch >= start
    chosen = price(cm, meas, "batch_sharded" if handed else "sharded", batch, k, mode)
    return dataclasses.replace(chosen, note=f"both on, {chosen.verifier} chosen: {chosen.note}")


#: Batches the "both on" table of :func:`crossover_markdown` shows.
BOTH_BATCHES = (1, 2, 3, 4, 8, 16, 32, 64)


def both_on_table(cm, meas: VerifyMeasurements, k: int, modes=KIMI_MODES,
                  batches=BOTH_BATCHES) -> tuple[list[str], list[str], list[str]]:
    """(markdown rows, "mode batch" cells where both on is priced slower than batch-sharded
    sampling alone, cells where stock is priced fastest) at ``k``."""
    rows, behind, stock_best = [], [], []
    for mode in modes:
        for b in batches:
            ps = {v: price(cm, meas, v, b, k, mode) for v in VERIFIERS}
            both = price_both(cm, meas, b, k, mode)
            if not (both.priced and all(p.priced for p in ps.values())):
                continue
            best = min(VERIFIERS, key=lambda v: ps[v].total_us)
            if both.total_us > ps["batch_sharded"].total_us:
                behind.append(f"{mode} batch {b}")
            if best == "stock":
                stock_best.append(f"{CROSSOVER_MODE_WORDS[mode].split(' (')[0]} batch {b}: "
                                  f"{ps['stock'].total_us:.0f} µs stock against "
                                  f"{both.total_us:.0f} µs")
            rows.append(f"| {CROSSOVER_MODE_WORDS[mode]} | {b} | "
                        + " | ".join(f"{ps[v].total_us:.0f}" for v in VERIFIERS)
                        + f" | {both.total_us:.0f} ({VERIFIER_SHORT[both.verifier]}) |")
    return rows, behind, stock_best


CROSSOVER_MODE_WORDS = {"top_p_T1": "T = 1.0, top_p 0.95 (Kimi thinking)",
                        "top_p_T0.6": "T = 0.6, top_p 0.95 (Kimi instant)",
                        "greedy": "greedy", "topk_minp": "top-k + min-p"}


def crossover_markdown(cm, meas: VerifyMeasurements | None = None) -> list[str]:
    """The block ``docs/what-to-run.md`` shows: per sampling mode and measured ``k``, from
    which batch vLLM's batch-sharded sampling beats the sharded verifier (both priced from
    the measured report, the communication from the PCIe model)."""
    meas = meas if meas is not None else measurements()
    out = ["## Verifier: sharded verification or batch-sharded sampling", ""]
    if meas is None:
        return out + [f"{NOT_PRICED}: no measured verify-step report ({REPORT_NAME}).", ""]
    rows = []
    for k in sorted({c.k for c in meas.cases}):
        for mode in MODES:
            c = crossover(cm, meas, k, mode)
            if c is None:
                continue
            priced = winning_batches(cm, meas, k, mode, "sharded", "stock")[1]
            rows.append(f"| {CROSSOVER_MODE_WORDS[mode]} | {k} | "
                        + ("sharded faster at every priced batch" if c == "never"
                           else "batch-sharded faster at every priced batch" if c == priced[0]
                           else f"batch {c}")
                        + f" | {priced[0]}-{priced[-1]} |")
    return out + [
        "A forecast from measured inputs: each verifier's verify step per rank is the time "
        f"measured on {meas.hardware_text()} (CUDA graph, {REPORT_NAME}, {meas.date}) plus its "
        "collectives priced by the PCIe model; batch-sharded sampling needs git patch "
        "logits-local (`compute_logits_local` for Kimi-K2.5). From the batch below on, vLLM's "
        "`--enable-batch-sharded-sampling` is the faster verifier; below it, "
        "`VLLM_KIMI_EXT_SHARDED_VERIFY=1`.", "",
        "| sampling | k | batch-sharded sampling faster from | batches priced |",
        "|---|---:|---|---|", *rows, "",
        *_both_on_markdown(cm, meas)]


def _both_on_markdown(cm, meas: VerifyMeasurements, k: int = 3) -> list[str]:
    rows, behind, stock_best = both_on_table(cm, meas, k)
    if not rows:
        return []
    return [
        "**Turn both on.** With `VLLM_KIMI_EXT_SHARDED_VERIFY=1` and "
        "`--enable-batch-sharded-sampling` together, the plugin picks per step by the "
        "batches above (`VLLM_KIMI_EXT_SHARDED_VERIFY_HANDOFF=auto`): a step from its "
        "sampling mode's crossover batch on runs vLLM's batch-sharded sampling, every other "
        "step is verified over vocabulary shards (greedy and top-k + min-p steps at every "
        "batch); both are exact, so only the time changes. Per rank, µs per verify step "
        f"under Kimi's top-p at k = {k} (the same forecast):", "",
        "| sampling | batch | stock | sharded | batch-sharded | both on (runs) |",
        "|---|---:|---:|---:|---:|---|", *rows, "",
        ("Both on is priced no slower than batch-sharded sampling alone at every batch "
         "shown" if not behind else
         "Both on is priced slower than batch-sharded sampling alone at " + ", ".join(behind))
        + ("." if not stock_best else
           "; stock (one logits all-gather, no extra collective) is priced fastest at "
           + "; ".join(stock_best) + ", where both on still verifies over shards."), ""]
