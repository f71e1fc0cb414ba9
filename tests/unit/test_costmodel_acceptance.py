"""Acceptance forms convert consistently: per-position rates, tau, draft acceptance rate."""

from __future__ import annotations

import pytest

from vllm_kimi_ext.costmodel.acceptance import (
    Acceptance,
    from_draft_profile,
    rate_from_tau,
    tau_from_constant_rate,
)
from vllm_kimi_ext.costmodel.catalog import list_profiles, load_draft


def test_per_position_rates_give_tau():
    acc = Acceptance.from_per_position([0.7, 0.5, 0.4])
    assert acc.tau(0) == 1.0
    assert acc.tau(3) == pytest.approx(1 + 0.7 + 0.5 + 0.4)
    assert acc.per_position(3) == pytest.approx([0.7, 0.5, 0.4])
    # beyond the data: the last conditional rate (0.4 / 0.5) repeats
    assert acc.per_position(5)[3:] == pytest.approx([0.4 * 0.8, 0.4 * 0.8 * 0.8])
    assert acc.measured_positions == 3


def test_per_position_rates_must_not_increase():
    with pytest.raises(ValueError, match="must not increase"):
        Acceptance.from_per_position([0.5, 0.6])
    with pytest.raises(ValueError):
        Acceptance.from_per_position([1.2])


@pytest.mark.parametrize("k", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("tau_frac", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_tau_round_trip(k, tau_frac):
    tau = 1 + tau_frac * k
    acc = Acceptance.from_tau(tau, k)
    assert acc.tau(k) == pytest.approx(tau, abs=1e-9)
    a = rate_from_tau(tau, k)
    assert tau_from_constant_rate(a, k) == pytest.approx(tau, abs=1e-9)


def test_tau_bounds():
    with pytest.raises(ValueError, match="impossible"):
        Acceptance.from_tau(4.5, 3)
    with pytest.raises(ValueError):
        Acceptance.from_tau(0.9, 3)


def test_draft_acceptance_rate_definition():
    # AQ-MedAI: 52 % of 4 drafted tokens accepted on average -> tau = 1 + 0.52 * 4
    acc = Acceptance.from_draft_acceptance_rate(0.52, 4)
    assert acc.tau(4) == pytest.approx(3.08)
    assert acc.draft_acceptance_rate(4) == pytest.approx(0.52)


def test_tau_monotone_in_k_and_rate():
    for a in (0.0, 0.3, 0.8, 1.0):
        taus = [Acceptance.from_conditional([a]).tau(k) for k in range(8)]
        assert taus == sorted(taus)
    assert Acceptance.from_conditional([1.0]).tau(7) == 8.0
    assert Acceptance.none().tau(7) == 1.0


def test_scaled_lowers_every_position():
    acc = Acceptance.from_tau(2.7, 3)
    low = acc.scaled(0.97)
    for k in range(1, 8):
        assert low.tau(k) < acc.tau(k)


@pytest.mark.parametrize("name", list_profiles("drafts"))
def test_draft_profiles_reproduce_their_reported_figures(name):
    d = load_draft(name)
    if d.acceptance is None:
        assert from_draft_profile(d.acceptance) is None
        return
    a = d.acceptance
    for ds, value in a["values"].items():
        acc = from_draft_profile(a, ds)
        k = a["k_ref"]
        if a["metric"] == "acceptance_length":
            assert acc.tau(k) == pytest.approx(value)
        elif a["metric"] == "draft_acceptance_rate":
            assert acc.draft_acceptance_rate(k) == pytest.approx(value)
    with pytest.raises(KeyError, match="available"):
        from_draft_profile(a, "no-such-dataset")
