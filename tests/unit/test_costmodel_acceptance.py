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
    if not (d.acceptance or {}).get("values"):  # none published (maybe an assumed band)
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


# ---------------------------------------------------------------------------------------------
# The band, field figures, and acceptance from an e2e run
# ---------------------------------------------------------------------------------------------

import json  # noqa: E402

from vllm_kimi_ext.costmodel.acceptance import (  # noqa: E402
    band_for,
    field_figures,
    field_to_card_ratio,
    from_results_json,
    from_spec,
)

ALL = [load_draft(n) for n in list_profiles("drafts")]


def test_field_figures_carry_sources_and_sit_below_the_card():
    mla = load_draft("lightseek-eagle3-mla")
    (field,) = field_figures(mla.acceptance)
    assert field.tau(3) == pytest.approx(1 + 0.645 + 0.393 + 0.240)
    assert field.tau(3) < from_draft_profile(mla.acceptance).tau(3)
    src = mla.acceptance["field"][0]["source"]
    assert src["repo"] and len(src["commit"]) == 40 and src["date"]


def test_ratio_is_measured_not_assumed():
    ratio = field_to_card_ratio(ALL)
    mla = load_draft("lightseek-eagle3-mla")
    card = from_draft_profile(mla.acceptance).tau(3)
    assert ratio == pytest.approx((1 + 0.645 + 0.393 + 0.240 - 1) / (card - 1))
    assert field_to_card_ratio([load_draft("lightseek-eagle3")]) is None


@pytest.mark.parametrize("name", [n for n in list_profiles("drafts")])
def test_band_is_ordered(name):
    d = load_draft(name)
    band = band_for(d, ratio=field_to_card_ratio(ALL))
    if band is None:
        assert not (d.acceptance or {}).get("values") and not (d.acceptance or {}).get("assumed")
        return
    k = int(d.acceptance["k_ref"])
    assert band.low.tau(k) <= band.card.tau(k) <= band.high.tau(k)


def test_band_sources():
    ratio = field_to_card_ratio(ALL)
    mla = band_for(load_draft("lightseek-eagle3-mla"), ratio=ratio)
    assert mla.low.source.startswith("field:")
    eagle = band_for(load_draft("lightseek-eagle3"), ratio=ratio)
    assert "ratio" in eagle.low.source
    assert eagle.low.tau(3) == pytest.approx(1 + (2.69 - 1) * ratio)
    assert eagle.high.tau(3) == pytest.approx(3.29)  # best card dataset (humaneval)
    tli = band_for(load_draft("qwen3-0.6b-tli"))
    assert tli.card_is_assumed and tli.card.source.startswith("assumed")


def test_from_spec_forms():
    assert from_spec({"metric": "per_position", "values": [0.5, 0.25]}).tau(2) == 1.75
    assert (from_spec({"metric": "draft_acceptance_rate", "values": 0.5, "k_ref": 2}).tau(2) ==
        pytest.approx(2.0))
    with pytest.raises(ValueError, match="unknown acceptance metric"):
        from_spec({"metric": "vibes", "values": 1, "k_ref": 3})


def _results(runs):
    return {"schema": "vllm-kimi-ext/e2e-results/1", "runs": runs}


def _run(rid, levels):
    return {"id": rid, "levels": [{"acceptance": {"per_position": p, "num_drafts": n}}
                                  for p, n in levels]}


def test_acceptance_from_results_pools_levels_by_drafts(tmp_path):
    f = tmp_path / "results.json"
    f.write_text(json.dumps(_results([_run("spec", [([0.8, 0.6], 100), ([0.6, 0.2], 300)]),
                                      {"id": "stock", "levels": [{"acceptance": None}]}])))
    acc, rid = from_results_json(f)
    assert rid == "spec"
    assert acc.per_position(2) == pytest.approx([0.65, 0.3])


@pytest.mark.parametrize("doc,words", [
    ("not json", "not valid JSON"),
    (json.dumps({"schema": "other"}), "field 'schema'"),
    (json.dumps(_results([])), "no speculative run"),
    (json.dumps(_results([_run("a", [([0.5], 10)]), _run("b", [([0.5], 10)])])),
     "--acceptance-run"),
    (json.dumps(_results([_run("a", [([1.5], 10)])])), "within [0, 1]"),
])
def test_acceptance_from_bad_results_names_the_field(tmp_path, doc, words):
    f = tmp_path / "results.json"
    f.write_text(doc)
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        from_results_json(f)
    assert str(f) in _message(f)


def _message(f):
    try:
        from_results_json(f)
    except ValueError as exc:
        return str(exc)
    return ""
