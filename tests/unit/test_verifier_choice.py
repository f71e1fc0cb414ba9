"""Per-step choice between the sharded verifier and vLLM's batch-sharded sampling when both
are on (vllm_kimi_ext.integration.verifier_choice): the thresholds follow the cost model's
prices from the measured verify report, each step is priced in the right sampling mode, and
the setting overrides them."""

from __future__ import annotations

import pytest

from testkit.runner_stand_ins import stand_in_batch, stand_in_runner
from vllm_kimi_ext.costmodel import verify_cost as vc
from vllm_kimi_ext.costmodel.model import CostModel
from vllm_kimi_ext.costmodel.report import PCIE
from vllm_kimi_ext.integration import verifier_choice
from vllm_kimi_ext.integration.sharded_verify import gate
from vllm_kimi_ext.integration.sharded_verify.sampler import ShardedSampler
from vllm_kimi_ext.integration.verifier_choice import TOP_P_MODES, VerifierChoice, step_mode
from vllm_kimi_ext.verify.protocol import StepPlan, plan_from_params

V, TP = 163840, 8
THINKING = {"temperature": 1.0, "top_p": 0.95}
INSTANT = {"temperature": 0.6, "top_p": 0.95}
GREEDY = {"temperature": 0.0}
TOPK_MINP = {"temperature": 0.8, "top_k": 50, "min_p": 0.05}
MODE_PARAMS = {"top_p_T1": THINKING, "top_p_T0.6": INSTANT, "greedy": GREEDY,
               "topk_minp": TOPK_MINP}


@pytest.fixture(scope="module")
def cm():
    return CostModel.build(PCIE)


@pytest.fixture(scope="module")
def meas():
    m = vc.measurements()
    assert m is not None, "the packaged verify report is missing"
    return m


def _plan(params, k):
    plan = plan_from_params(params, tp_size=TP, vocab_size=V, num_rows=len(params) * (k + 1),
                            max_rows_per_req=k + 1)
    assert isinstance(plan, StepPlan)
    return plan


@pytest.mark.parametrize("params,mode", [
    ([THINKING], "top_p_T1"), ([INSTANT], "top_p_T0.6"), ([GREEDY, GREEDY], "greedy"),
    ([TOPK_MINP], "topk_minp"), ([{"temperature": 0.8}], "topk_minp"),
    ([GREEDY, INSTANT], "top_p_T0.6"), ([INSTANT, THINKING], "top_p_T1"),
    ([{"temperature": 0.8, "top_p": 0.9}], "top_p_T1"),  # midway: the slower one
    ([{"temperature": 0.7, "top_p": 0.9}], "top_p_T0.6"),
    ([{"temperature": 1.3, "min_p": 0.1}], "top_p_T1"),  # min-p alone escalates too
    ([{"temperature": 1.0, "top_p": 0.95, "top_k": 40}], "topk_minp"),  # top-k: no slot
])
def test_each_step_is_priced_in_its_sampling_mode(params, mode):
    assert step_mode(_plan(params, 3), params) == mode


def test_handover_starts_where_batch_sharded_is_priced_faster_for_good(cm, meas):
    """At every measured k and mode, for every priced batch: handed over exactly where
    batch-sharded sampling's priced step is shorter at that batch and every larger one."""
    ks = sorted({c.k for c in meas.cases})
    assert ks, "no measured k"
    seen_both = set()
    for k in ks:
        choice = VerifierChoice.priced(k, vc.handover_table(cm, meas))
        assert "not priced" not in choice.how
        for mode, p in MODE_PARAMS.items():
            wins, priced = vc.winning_batches(cm, meas, k, mode, "batch_sharded", "sharded")
            assert priced, (k, mode)
            for b in priced:
                want = all(x in wins for x in priced if x >= b)
                params = [p] * b
                assert choice.batch_sharded(_plan(params, k), params) is want, (k, mode, b)
                seen_both.add(want)
    assert seen_both == {True, False}  # both answers occur in the shipped report


def test_a_handed_over_batch_is_shorter_batch_sharded_and_the_one_before_is_not(cm, meas):
    for k in sorted({c.k for c in meas.cases}):
        choice = VerifierChoice.priced(k, vc.handover_table(cm, meas))
        for mode in TOP_P_MODES:
            start = choice.from_reqs[mode]
            assert start is not None and start > 1, (k, mode)  # small batches stay sharded
            bs = vc.price(cm, meas, "batch_sharded", start, k, mode).total_us
            sh = vc.price(cm, meas, "sharded", start, k, mode).total_us
            assert bs < sh
            bs = vc.price(cm, meas, "batch_sharded", start - 1, k, mode).total_us
            sh = vc.price(cm, meas, "sharded", start - 1, k, mode).total_us
            assert sh <= bs
        assert choice.from_reqs["greedy"] is None and choice.from_reqs["topk_minp"] is None


def test_a_changed_report_moves_the_threshold(cm, meas):
    """The thresholds come from the report: a sharded step twice as fast moves them."""
    import dataclasses

    faster = dataclasses.replace(meas, cases=tuple(
        dataclasses.replace(c, ours_graph_us=c.ours_graph_us / 2) for c in meas.cases))
    a = VerifierChoice.priced(3, vc.handover_table(cm, meas)).from_reqs["top_p_T1"]
    b = VerifierChoice.priced(3, vc.handover_table(cm, faster)).from_reqs["top_p_T1"]
    assert b is None or b > a


def test_an_unmeasured_k_hands_every_step_over_and_says_why(cm, meas):
    k = max(c.k for c in meas.cases) + 2
    choice = VerifierChoice.priced(k, vc.handover_table(cm, meas))
    assert f"not priced at k={k}" in choice.how
    for p in MODE_PARAMS.values():
        assert choice.batch_sharded(_plan([p], k), [p])
    none = VerifierChoice.priced(3, vc.handover_table(cm, None))
    assert none.batch_sharded(_plan([GREEDY], 3), [GREEDY])


@pytest.mark.parametrize("setting,reqs,params,want", [
    (0, 64, THINKING, False), (0, 1, INSTANT, False),
    (4, 3, THINKING, False), (4, 4, THINKING, True), (4, 64, INSTANT, True),
    (1, 1, THINKING, True), (1, 64, GREEDY, False), (1, 64, TOPK_MINP, False),
])
def test_the_setting_overrides_the_priced_thresholds(setting, reqs, params, want):
    choice = VerifierChoice.from_setting(setting, 3)
    assert choice.batch_sharded(_plan([params] * reqs, 3), [params] * reqs) is want
    assert "VLLM_KIMI_EXT_SHARDED_VERIFY_HANDOFF" in choice.how


def _gate(params, monkeypatch, setting=None, sharder=True):
    if setting is None:
        monkeypatch.delenv("VLLM_KIMI_EXT_SHARDED_VERIFY_HANDOFF", raising=False)
    else:
        monkeypatch.setenv("VLLM_KIMI_EXT_SHARDED_VERIFY_HANDOFF", setting)
    runner = stand_in_runner(params, vocab=V)
    runner.batch_sharder = object() if sharder else None
    return ShardedSampler(runner).plan(stand_in_batch(len(params)), None, TP, V)


def test_the_gate_hands_large_top_p_steps_to_the_batch_sharder(monkeypatch, cm, meas):
    start = VerifierChoice.priced(3, vc.handover_table(cm, meas)).from_reqs["top_p_T1"]
    below = _gate([THINKING] * (start - 1), monkeypatch)
    assert isinstance(below, StepPlan)
    at = _gate([THINKING] * start, monkeypatch)
    assert not isinstance(at, StepPlan) and at.reason == gate.HANDED_OVER
    assert at.reason in gate.NOT_FALLBACKS  # counted as handed over, not a fallback
    assert isinstance(_gate([GREEDY] * 64, monkeypatch), StepPlan)
    # without the batch sharder nothing is handed over
    assert isinstance(_gate([THINKING] * 64, monkeypatch, sharder=False), StepPlan)
    # the setting, read when the runner's choice is made
    assert isinstance(_gate([THINKING] * 64, monkeypatch, setting="off"), StepPlan)
    assert _gate([THINKING] * 2, monkeypatch, setting="2").reason == gate.HANDED_OVER


def test_the_cost_model_prices_both_on_as_the_plugin_runs_it(cm, meas):
    """``verify_cost.price_both`` (the docs' "both on" column) takes, at every priced batch,
    the verifier the plugin's per-step choice runs, and is then never priced slower than
    batch-sharded sampling alone."""
    for k in sorted({c.k for c in meas.cases}):
        choice = VerifierChoice.priced(k, vc.handover_table(cm, meas))
        for mode, p in MODE_PARAMS.items():
            for b in vc.winning_batches(cm, meas, k, mode, "sharded", "batch_sharded")[1]:
                params = [p] * b
                runs = ("batch_sharded" if choice.batch_sharded(_plan(params, k), params)
                    else "sharded")
                both = vc.price_both(cm, meas, b, k, mode)
                assert both.verifier == runs, (k, mode, b)
                assert both.total_us <= vc.price(cm, meas, "batch_sharded", b, k,
                                                 mode).total_us, (k, mode, b)
    rows, behind, _ = vc.both_on_table(cm, meas, 3)
    assert rows and not behind


@pytest.mark.parametrize("text,field", [
    ("{", "unreadable"), ("[]", "k: expected"),
    ('{"k": {"3": {"top_p_T1": {"from": 0, "priced": true}}}}', "k.3.top_p_T1"),
    ('{"k": {"3": {"top_p_T1": {"from": null, "priced": true}}}}', "k.3.top_p_T0.6"),
    ('{"k": {"3": {"top_p_T1": {"from": "2", "priced": true}}}}', "k.3.top_p_T1"),
    ('{"k": {"3": {"top_p_T1": {"from": 2, "priced": 1}}}}', "k.3.top_p_T1"),
])
def test_an_unreadable_handover_file_hands_every_step_over(monkeypatch, tmp_path, text, field):
    bad = tmp_path / "handover.json"
    bad.write_text(text)
    with pytest.raises(verifier_choice.HandoverDataError, match=field):
        verifier_choice.load_handover(bad)
    monkeypatch.setattr(verifier_choice, "HANDOVER_DATA", bad)
    monkeypatch.setattr(verifier_choice.load_handover, "__defaults__", (bad,))
    choice = VerifierChoice.priced(3)
    assert "not priced" in choice.how and field in choice.how
    for p in MODE_PARAMS.values():
        assert choice.batch_sharded(_plan([p], 3), [p])


def test_the_packaged_thresholds_are_the_cost_models(cm, meas):
    """Serving reads ``integration/handover.json``; it holds exactly what the cost model
    prices from the packaged report (``nox -s docs`` writes it, ``--check`` fails stale)."""
    from vllm_kimi_ext.costmodel import verify_report

    assert verifier_choice.HANDOVER_DATA.read_text() == verify_report.handover_json(meas)
    for k in sorted({c.k for c in meas.cases}):
        assert VerifierChoice.priced(k) == VerifierChoice.priced(k, vc.handover_table(cm, meas))


def test_a_stale_handover_copy_fails_the_docs_check(monkeypatch, tmp_path):
    """Planted: a handover file one request off; ``--check-docs`` names it and exits 1."""
    import json

    from vllm_kimi_ext.costmodel import verify_report

    docs = tmp_path / "docs"
    docs.mkdir()
    begin, end = verify_report.markers()
    (docs / "cost-model.md").write_text(verify_report.updated(
        f"{begin}\n{end}\n", verify_report.verify_markdown(vc.measurements())))
    doc = json.loads(verifier_choice.HANDOVER_DATA.read_text())
    stale = tmp_path / "handover.json"
    monkeypatch.setattr(verify_report, "HANDOVER_DATA", stale)
    stale.write_text(verify_report.handover_json(vc.measurements()))
    assert verify_report.main(["--check-docs", str(docs)]) == 0
    doc["k"]["3"]["top_p_T1"]["from"] += 1
    stale.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    assert verify_report.main(["--check-docs", str(docs)]) == 1


def test_the_log_line_names_each_modes_threshold(cm, meas):
    choice = VerifierChoice.priced(3, vc.handover_table(cm, meas))
    text = choice.describe()
    assert text.startswith("k=3; ")
    for mode, start in choice.from_reqs.items():
        assert f"{mode}: " + ("never" if start is None else f"from {start} requests") in text
    assert choice.how in text


def test_plan_verify_cost_and_the_docs_say_what_the_plugin_runs(cm, meas):
    """The verdict table (``vllm-kimi-ext plan --verify-cost`` and docs/cost-model.md) has
    a "both on" column per measured k and mode that names the plugin's own threshold."""
    from vllm_kimi_ext.costmodel import verify_report

    rows = verify_report.verdict_rows(cm, meas)
    assert verify_report.VERDICT_HEADER[-1] == "both on runs (per step)"
    seen = 0
    for k in sorted({c.k for c in meas.cases}):
        choice = VerifierChoice.priced(k, vc.handover_table(cm, meas))
        for mode in vc.MODES:
            row = next(r for r in rows if r[0] == f"{verify_report.MODE_WORDS[mode]}, k = {k}")
            start = choice.from_reqs[mode]
            assert row[-1] == ("sharded at every batch" if start is None else
                               f"sharded below batch {start}, batch-sharded from {start}")
            seen += 1
    assert seen == len(rows)
