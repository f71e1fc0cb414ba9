"""The forecast's interval holds its stated coverage on the project's own held-out runs, and
every range the generated documents print is low..high with its point inside.

Planted bugs this was written against (one at a time):
- ``conformal_half_width`` returning the mean error (the old ±12.5 %):
  ``test_stated_coverage_holds_on_held_out_runs`` fails (leave-one-out coverage 0.5 < 0.8);
- the ranking's band range printed as low-to-high scenario instead of min..max
  (``what_to_run._band_range``): ``test_generated_ranges_are_ordered_with_the_point_inside``
  fails on "+16%..+13%" (high..low) and would on "+84% (+67%..+82% across the band)".
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from vllm_kimi_ext.costmodel import interval
from vllm_kimi_ext.costmodel.calibration import HELD_OUT
from vllm_kimi_ext.costmodel.headline import headline

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def errors():
    return interval.held_out_errors()


def test_stated_coverage_holds_on_held_out_runs(errors):
    c = interval.calibrated()
    assert c.coverage == interval.COVERAGE == 0.8
    unseen, between = errors[HELD_OUT[1]], errors[HELD_OUT[0]]
    assert len(unseen) >= 5 and len(between) >= 10
    # leave-one-out over the runs that calibrate it: each run's error against an interval
    # calibrated on the others
    assert interval.leave_one_out_coverage(unseen, c.coverage) >= c.coverage
    # the other held-out group never calibrated it
    assert interval.covered(between, c.half_width) >= c.coverage
    # and the calibrated half-width covers its own group at the stated rate
    assert interval.covered(unseen, c.half_width) >= c.coverage


def test_a_too_narrow_interval_fails_the_coverage_check(errors):
    """The check above can fail: an interval at the mean error (what the docs printed
    before, ±12.5 %) misses half of the runs it is meant to cover."""
    unseen = errors[HELD_OUT[1]]

    def mean_width(errs, coverage):
        return sum(errs) / len(errs)

    assert interval.leave_one_out_coverage(unseen, half_width=mean_width) < interval.COVERAGE


def test_conformal_rank():
    errs = [0.05, 0.01, 0.2, 0.1]
    # ceil(0.8 * 5) = 4: the 4th smallest
    assert interval.conformal_half_width(errs, 0.8) == 0.2
    assert interval.conformal_half_width(errs, 0.5) == 0.1  # ceil(2.5) = 3: the 3rd smallest
    with pytest.raises(ValueError):
        interval.conformal_half_width([], 0.8)
    with pytest.raises(ValueError):
        interval.conformal_half_width(errs, 1.0)


def test_every_interval_contains_its_point():
    h = headline()
    for _, c, w in h.per_draft:
        for j in (c, w):
            if j is not None:
                lo, hi = j.interval
                assert lo < j.tps["point"] < hi
                assert math.log(hi / j.tps["point"]) == pytest.approx(h.calib.half_width)
    lo, hi = h.no_spec_interval
    assert lo < h.no_spec_tps < hi


NUM = r"[+-]?\d+(?:\.\d+)?"
#: "X (A..B" with optional % signs: a point followed by its range
POINT_RANGE = re.compile(rf"(?<![\w.])(?<!batch )(?P<x>{NUM})%?\*{{0,2}} \((?P<a>{NUM})%?\.\."
                         rf"(?P<b>{NUM})%?")
#: the what-if ranking: "X at batch 1 (A..B across the band)"
LEVER_RANGE = re.compile(rf"(?P<x>{NUM})% at batch 1 \((?P<a>{NUM})%\.\.(?P<b>{NUM})%")
RANGE = re.compile(rf"(?<![\w.])(?P<a>{NUM})%?\.\.(?P<b>{NUM})%?")
GENERATED = ("README.md", "docs/what-to-run.md", "docs/choosing-a-draft.md",
             "docs/cost-model.md")


def test_generated_ranges_are_ordered_with_the_point_inside():
    found = 0
    for rel in GENERATED:
        text = (ROOT / rel).read_text()
        for m in RANGE.finditer(text):
            assert float(m["a"]) <= float(m["b"]), f"{rel}: range {m[0]!r} is high..low"
        for m in [*POINT_RANGE.finditer(text), *LEVER_RANGE.finditer(text)]:
            found += 1
            x, a, b = float(m["x"]), float(m["a"]), float(m["b"])
            assert a <= x <= b, f"{rel}: point outside its range: {m[0]!r}"
        # the old spelling, whose point could sit outside its range: gone
        assert not re.search(rf"{NUM}%? to {NUM}%? across the band", text), rel
    assert found > 20
