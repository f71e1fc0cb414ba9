"""Round 1's merge kernel ordering the candidates by merging the ranks' sorted runs (binary
search, ``verify/_kernels/merge.py``'s ``_sort_runs``) against the same kernel sorting every
key, on Triton's CPU interpreter (``testkit.verify_merge_runs_check``): every output field bit
for bit on tie-heavy and flat rows, every cut mode, 2-8 ranks, runs ending in sentinel keys
(two short ranks) and one payload with a run out of order (the kernel must sort it).

Planted and seen to fail: every run placed at its own index only (no merge: 20 of 21 cases
differ); equal keys of earlier runs not counted ahead (``>`` for every run: the sentinel
places collide, the unwritten place reads the poisoned scratch: 4 cases differ)."""

from __future__ import annotations

import sys

import pytest

from tests.unit.test_verify_escalation_interpreter import _interpret

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="Triton ships Linux wheels only")


def _check(*args: str) -> dict:
    out = _interpret("testkit.verify_merge_runs_check", *args)
    assert out["mismatches"] == [], out["mismatches"]
    assert any(c["case"] == "out-of-order run" for c in out["cases"])
    assert any(c["uncertified"] for c in out["cases"])  # the certificate's inputs reached
    return out


@linux_only
def test_merge_of_runs_equals_sort_quick():
    assert len(_check("--quick")["cases"]) == 5


@linux_only
@pytest.mark.slow
def test_merge_of_runs_equals_sort_every_case():
    assert len(_check()["cases"]) == 25


def test_compare_gives_each_differing_field_and_its_largest_difference():
    """A mismatch names the fields that differ with their largest absolute difference; the
    decision list leaves out mismatches in the sums alone (what a GPU may round differently)."""
    from types import SimpleNamespace

    import torch

    from testkit.verify_merge_runs_check import FIELDS, SUM_FIELDS, _compare

    base = {f: torch.tensor([1.0, 2.0, float("-inf")]) for f in FIELDS}
    a = SimpleNamespace(**base)
    b = SimpleNamespace(**{**base, "lse": torch.tensor([1.0, 2.5, float("-inf")]),
                           "gidx": torch.tensor([1.0, 2.0, 3.0])})
    assert _compare(a, a) == {}
    assert _compare(a, b) == {"gidx": float("inf"), "lse": 0.5}
    assert set(SUM_FIELDS) < set(FIELDS) and "gidx" not in SUM_FIELDS
