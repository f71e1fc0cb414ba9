"""The verify step priced from measured per-rank times and bytes (``costmodel/verify_cost.py``):
the report's schema check, the pricing against an independent computation, "not measured:
not priced" without the report, and that nothing recommends the sharded verifier where the
measured numbers say it loses.

``tests/unit/fixtures/verify_graph_fixture.json`` is a FIXTURE (round invented numbers shaped
like the measured report), not a measurement."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import pytest

from vllm_kimi_ext.costmodel import verify_cost as vc
from vllm_kimi_ext.costmodel import verify_measured as vm
from vllm_kimi_ext.costmodel.acceptance import from_draft_profile
from vllm_kimi_ext.costmodel.catalog import load_draft
from vllm_kimi_ext.costmodel.model import CostModel, Plan
from vllm_kimi_ext.costmodel.recommend import recommend
from vllm_kimi_ext.costmodel.verify_report import verify_markdown

REPO = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "verify_graph_fixture.json"
V = 163840


@pytest.fixture(scope="module")
def cm():
    return CostModel.build("rtx-pro-6000-pcie-x8")


@pytest.fixture()
def doc():
    return json.loads(FIXTURE.read_text())


def _write(tmp_path: Path, doc, name: str = "report.json") -> Path:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


# ---------------------------------------------------------------------------------------------
# the schema check
# ---------------------------------------------------------------------------------------------


def test_fixture_loads_and_is_labelled_a_fixture():
    m = vm.load_report(FIXTURE)
    assert len(m.cases) == 18 and "FIXTURE" in m.hardware_text()
    assert {c.mode for c in m.cases} == set(vc.MODES) and {c.k for c in m.cases} == {3, 7}


def _case0(field, value):
    def edit(d):
        if value is _DROP:
            del d["cases"][0][field]
        else:
            d["cases"][0][field] = value
    return edit


def _top(field, value):
    def edit(d):
        if value is _DROP:
            del d[field]
        else:
            d[field] = value
    return edit


_DROP = object()

BAD = [
    ("not json", lambda d: "{cases: [", "not valid JSON"),
    ("top-level list", lambda d: [d], "expected a JSON object"),
    ("cases missing", _top("cases", _DROP), "'cases' is missing"),
    ("cases empty", _top("cases", []), "'cases' must be a non-empty list"),
    ("cases not a list", _top("cases", {"rows": 4}), "'cases' must be"),
    ("hardware missing", _top("hardware", _DROP), "'hardware' is missing"),
    ("hardware empty", _top("hardware", ""), "'hardware' must be"),
    ("versions a number", _top("versions", 34), "'versions' must be"),
    ("date missing", _top("date", _DROP), "'date' is missing"),
    ("case not an object", lambda d: {**d, "cases": [4]}, "cases[0]: expected a JSON object"),
    ("rows zero", _case0("rows", 0), "cases[0]: field 'rows' must be a positive integer"),
    ("rows a string", _case0("rows", "4"), "cases[0]: field 'rows' must be"),
    ("rows a bool", _case0("rows", True), "cases[0]: field 'rows' must be"),
    ("rows fractional", _case0("rows", 4.5), "cases[0]: field 'rows' must be"),
    ("k missing", _case0("k", _DROP), "cases[0]: field 'k' is missing"),
    ("mode unknown", _case0("mode", "top_p"), "cases[0]: field 'mode' must be one of"),
    ("ours negative", _case0("ours_graph_us", -3.0), "cases[0]: field 'ours_graph_us'"),
    ("vllm NaN", _case0("vllm_graph_us", float("nan")), "cases[0]: field 'vllm_graph_us'"),
    ("payload missing", _case0("payload_bytes_per_row_per_rank", _DROP),
     "cases[0]: field 'payload_bytes_per_row_per_rank' is missing"),
    ("rounds zero", _case0("rounds", 0), "cases[0]: field 'rounds' must be a positive"),
    ("temperature of another mode", _case0("temperature", 0.6),
     "cases[0]: mode 'top_p_T1' needs temperature 1"),
    ("top-p mode without top_p", _case0("top_p", None), "cases[0]: mode 'top_p_T1' needs a top_p"),
    ("top_p above 1", _case0("top_p", 1.5), "cases[0]: field 'top_p' must be in (0, 1]"),
    ("top_p missing", _case0("top_p", _DROP), "cases[0]: field 'top_p' is missing"),
    ("duplicate case", lambda d: {**d, "cases": d["cases"] + d["cases"][:1]},
     "repeats k=3, mode 'top_p_T1', rows=4"),
]


@pytest.mark.parametrize("name,edit,expected", BAD, ids=[b[0] for b in BAD])
def test_a_bad_report_is_one_line_naming_file_and_field(tmp_path, doc, name, edit, expected):
    d = copy.deepcopy(doc)
    out = edit(d)
    path = _write(tmp_path, d if out is None else out)
    with pytest.raises(vm.VerifyReportError) as err:
        vm.load_report(path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and expected in msg, msg


def test_missing_report_is_not_priced_and_a_named_missing_file_is_an_error(tmp_path):
    assert vc.measurements(tmp_path / "absent.json") is None
    with pytest.raises(vm.VerifyReportError, match="no such verify-step report"):
        vm.load_report(tmp_path / "absent.json")
    bad = _write(tmp_path, "[]")
    with pytest.raises(vm.VerifyReportError):  # present but malformed: never silently unpriced
        vc.measurements(bad)


def test_generator_refuses_a_bad_report_with_exit_2(tmp_path, capsys):
    from vllm_kimi_ext.costmodel.verify_report import main

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "cost-model.md").write_text((REPO / "docs" / "cost-model.md").read_text())
    before = (docs / "cost-model.md").read_text()
    rc = main(["--write-docs", str(docs), "--report", str(_write(tmp_path, "{"))])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "not valid JSON" in err
    assert (docs / "cost-model.md").read_text() == before  # left as it was


# ---------------------------------------------------------------------------------------------
# pricing: an independent computation on a small fixed case
# ---------------------------------------------------------------------------------------------


def _small(tmp_path: Path) -> vc.VerifyMeasurements:
    cases = [dict(rows=r, k=3, mode="top_p_T1", temperature=1.0, top_p=0.95, ours_graph_us=o,
                  vllm_graph_us=s, payload_bytes_per_row_per_rank=64, rounds=2)
             for r, o, s in ((4, 50.0, 100.0), (16, 80.0, 160.0))]
    return vm.load_report(_write(tmp_path, dict(hardware="FIXTURE", versions="FIXTURE",
                                                date="FIXTURE", cases=cases)))


def _ag_us(cm, total_bytes):
    """An NCCL all-gather of ``total_bytes``: the latency table's all-reduce of half the
    bytes (a ring all-gather moves half an all-reduce's traffic) + the fitted overhead."""
    return (cm.latency.latency_us("allreduce", total_bytes / 2, "nccl") +
        cm.params.collective_overhead_us)


def test_pricing_equals_an_independent_computation(cm, tmp_path):
    m = _small(tmp_path)
    # batch 2, k = 3: 8 rows, a third of the way from the measured 4 rows to 16
    stock = vc.price_stock(cm, m, 2, 3, "top_p_T1")
    assert stock.rows == 8 and stock.compute_us == pytest.approx(100 + 60 * 4 / 12)
    assert stock.comm_us == pytest.approx(_ag_us(cm, 8 * V * 2))
    assert stock.received_bytes_per_rank == 8 * V * 2 * 7 / 8 == 2_293_760
    ours = vc.price_sharded(cm, m, 2, 3, "top_p_T1")
    assert ours.compute_us == pytest.approx(50 + 30 * 4 / 12)
    # two rounds, each rank 8 rows x 64 B, gathered from 8 ranks: 4096 B per round
    assert ours.comm_us == pytest.approx(2 * _ag_us(cm, 4096))
    assert (ours.collectives, ours.sent_bytes_per_rank) == (2, 2 * 512)
    # batch-sharded at batch 9: the busiest rank owns 2 requests = 8 full rows
    bs = vc.price_batch_sharded(cm, m, 9, 3, "top_p_T1")
    assert bs.compute_rows == 8 and bs.compute_us == pytest.approx(100 + 60 * 4 / 12)
    packed = 2 * (3 + 1 + 2) * 8  # int64: k + 1 ids, num_sampled, num_rejected per request
    assert bs.comm_us == pytest.approx(_ag_us(cm, 8 * V * 2) + _ag_us(cm, 8 * packed))
    assert bs.received_bytes_per_rank == 8 * 7 * (V // 8) * 2 + 7 * packed
    # at batch 1 the one request has one owner: the other ranks send it all its logits
    one = vc.price_batch_sharded(cm, m, 1, 3, "top_p_T1")
    assert one.compute_rows == 4 and one.sent_bytes_per_rank == 4 * (V // 8) * 2 + 6 * 8


def test_batch_sharded_uses_its_measured_column_where_the_report_has_it(cm, tmp_path):
    """With ``batch_sharded_us`` in the report, batch-sharded sampling's compute is that
    column at the batch's rows (not vLLM's verify on the owned rows), and its description
    stops calling it a lower bound; a case without the column keeps the lower bound."""
    cases = [dict(rows=r, k=3, mode="top_p_T1", temperature=1.0, top_p=0.95, ours_graph_us=o,
                  vllm_graph_us=s, payload_bytes_per_row_per_rank=64, rounds=2,
                  batch_sharded_us=b)
             for r, o, s, b in ((4, 50.0, 100.0, 130.0), (16, 80.0, 160.0, None),
                                (64, 90.0, 400.0, 190.0))]
    m = vm.load_report(_write(tmp_path, dict(hardware="FIXTURE", versions="FIXTURE",
                                             date="FIXTURE", cases=cases)))
    one = vc.price_batch_sharded(cm, m, 1, 3, "top_p_T1")  # 4 rows: measured 130
    assert one.compute_us == pytest.approx(130.0) and "lower bound" not in one.note
    # 16 rows (batch 4) has no column: interpolated between the measured 4 and 64 rows
    four = vc.price_batch_sharded(cm, m, 4, 3, "top_p_T1")
    assert four.compute_us == pytest.approx(130 + 60 * 12 / 60)
    del cases[0]["batch_sharded_us"], cases[2]["batch_sharded_us"]
    m = vm.load_report(_write(tmp_path, dict(hardware="FIXTURE", versions="FIXTURE",
                                             date="FIXTURE", cases=cases), "old.json"))
    old = vc.price_batch_sharded(cm, m, 1, 3, "top_p_T1")
    assert old.compute_us == pytest.approx(100.0) and "lower bound" in old.note
    cases[0]["batch_sharded_us"] = -1.0
    with pytest.raises(vm.VerifyReportError, match=r"cases\[0\].*batch_sharded_us"):
        vm.load_report(_write(tmp_path, dict(hardware="FIXTURE", versions="FIXTURE",
                                             date="FIXTURE", cases=cases), "bad.json"))


def test_outside_the_measured_rows_and_without_a_report_nothing_is_priced(cm, tmp_path,
                                                                        monkeypatch):
    m = _small(tmp_path)
    for v in vc.VERIFIERS:
        assert vc.price(cm, m, v, 64, 3, "top_p_T1").total_us is None  # 256 rows
        assert vc.price(cm, m, v, 1, 3, "top_p_T0.6").total_us is None  # mode not measured
        assert vc.price(cm, None, v, 1, 3, "top_p_T1").total_us is None
    assert vc.verdict(cm, None, 3, "top_p_T1") == f"{vc.NOT_PRICED} (k=3, top_p_T1)"
    monkeypatch.setattr(vm, "DEFAULT_REPORT", tmp_path / "absent.json")
    ok, why = vc.sharded_recommendable(cm, 8, 3)
    assert not ok and "not measured" in why and "not priced" in why


def test_end_to_end_swaps_only_the_verify_phase(cm, tmp_path):
    m = _small(tmp_path)
    d = load_draft("lightseek-eagle3-mla")
    acc = from_draft_profile(d.acceptance)
    plan = Plan(k=3, draft=d, batch=2)
    e = vc.end_to_end(cm, plan, acc, m, "top_p_T1")
    base = cm.estimate(plan, acc)
    verify_s = sum(t.time_s for t in base.terms if t.phase == "verify")
    assert e.rest_s == pytest.approx(base.step_s - verify_s)
    assert e.step_s("stock") == pytest.approx(e.rest_s + e.prices["stock"].total_us * 1e-6)
    assert e.tokens_per_step == pytest.approx(2 * acc.tau(3))
    faster = e.prices["sharded"].total_us < e.prices["stock"].total_us
    assert (e.gain("sharded") > 0) == faster


def test_verdict_names_the_batch_from_which_it_wins(cm):
    m = vm.load_report(FIXTURE)  # fixture: ours loses at 4 rows, wins from 16 rows on
    wins, priced = vc.winning_batches(cm, m, 3, "top_p_T1")
    assert priced == list(range(1, 65)) and 1 not in wins
    start = min(b for b in priced if all(x in wins for x in priced if x >= b))
    assert vc.verdict(cm, m, 3, "top_p_T1") == f"wins from batch {start} on (batches 1-64 priced)"
    assert start > 1


# ---------------------------------------------------------------------------------------------
# nothing recommends the sharded verifier where the measured numbers say it loses
# ---------------------------------------------------------------------------------------------


def _losing(doc) -> dict:
    d = copy.deepcopy(doc)
    for c in d["cases"]:
        c["ours_graph_us"] = 10 * c["vllm_graph_us"]
    return d


@pytest.mark.parametrize("batch", [1, 8, 64])
def test_recommender_never_offers_a_verifier_measured_slower(cm, tmp_path, monkeypatch, doc,
                                                             batch):
    d = load_draft("lightseek-eagle3-mla")
    drafts = [(d, from_draft_profile(d.acceptance))]
    monkeypatch.setattr(vm, "DEFAULT_REPORT", _write(tmp_path, _losing(doc)))
    rec = recommend(cm, drafts, batch=batch, k_max=3)
    assert all(o.plan.verifier == "gather" for o in rec.options)
    # with the fixture, where it wins from 16 rows on, it is offered exactly there
    monkeypatch.setattr(vm, "DEFAULT_REPORT", FIXTURE)
    rec = recommend(cm, drafts, batch=batch, k_max=3)
    sharded = [o for o in rec.options if o.plan.verifier == "sharded"]
    m = vm.load_report(FIXTURE)
    for o in sharded:
        for mode in vc.KIMI_MODES:
            p = o.plan
            assert (vc.price(cm, m, "sharded", batch, p.k, mode).total_us <
                vc.price(cm, m, "stock", batch, p.k, mode).total_us)
    assert bool(sharded) == (batch > 1)  # k = 3 at batch 1 is 4 rows, where it loses


def test_docs_block_says_it_loses_when_it_loses(doc, tmp_path):
    losing = vm.load_report(_write(tmp_path, _losing(doc)))
    text = verify_markdown(losing)
    verdict_rows = [line.split(" | ") for line in text.splitlines()
                    if re.match(r"\| (T=|greedy|top-k).*, k = \d \|", line)]
    assert len(verdict_rows) == 2 * len(vc.MODES)
    for cells in verdict_rows:  # sampling | sharded vs stock | batch-sharded vs stock | s vs bs
        assert "wins" not in cells[1] and "wins" not in cells[3], cells
    priced = [c[1] for c in verdict_rows if vc.NOT_PRICED not in c[1]]
    assert len(priced) == 5 and all("loses at every priced batch" in c for c in priced)
    assert re.search(r"\| -\d+% \|", text)  # negative gains shown as such
    assert "FIXTURE" in text and "not a measurement of an RTX PRO 6000" in text
    assert vc.NOT_PRICED in verify_markdown(None) and "wins" not in verify_markdown(None)


_RECOMMEND = re.compile(r"\brecommend(s|ed)?\b|\bwins\b|faster than (stock|vLLM)", re.I)
_NEGATED = re.compile(r"\bnot\b|\bnever\b|\bonly where\b|\bslower\b|does nothing", re.I)


def recommending_lines(text: str) -> list[str]:
    """Lines that recommend the sharded verifier (flag name and a recommending phrase, no
    negation on the line)."""
    return [line for line in text.splitlines()
            if "SHARDED_VERIFY" in line and _RECOMMEND.search(line)
            and not _NEGATED.search(line)]


def test_readme_and_docs_recommend_it_only_where_measured_faster(cm):
    # the check itself catches a planted recommendation
    assert recommending_lines("We recommend `VLLM_KIMI_EXT_SHARDED_VERIFY=1` for Kimi.")
    assert not recommending_lines("Do not enable VLLM_KIMI_EXT_SHARDED_VERIFY=1 for speed; it "
                                  "is not recommended.")
    meas = vc.measurements()
    wins = meas is not None and any(
        vc.winning_batches(cm, meas, k, mode)[0] for k in (3, 7) for mode in vc.KIMI_MODES)
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    found = [f"{f.name}: {line.strip()[:120]}" for f in files
             for line in recommending_lines(f.read_text())]
    assert wins or not found, found


def test_generated_docs_never_choose_it_where_it_is_not_recommendable(cm):
    """README's headline and docs/what-to-run.md name a sharded verifier only at a batch and
    k where the measured report prices it below stock."""
    text = (REPO / "docs" / "what-to-run.md").read_text() + (REPO / "README.md").read_text()
    for m in re.finditer(r"batch (\d+)[^|]*\| k=(\d) [^,|]+, sharded,", text):
        assert vc.sharded_recommendable(cm, int(m.group(1)), int(m.group(2)))[0], m.group(0)
    if "verifier**: vocabulary-sharded" in text:
        assert vc.sharded_recommendable(cm, 1, int(re.search(r"\*\*k = (\d)", text)[1]))[0]


def test_interpolation_is_linear_and_exact_at_measured_rows(tmp_path):
    m = _small(tmp_path)
    assert m.at(3, "top_p_T1", 4, "vllm_graph_us") == 100.0
    assert m.at(3, "top_p_T1", 16, "vllm_graph_us") == 160.0
    assert m.at(3, "top_p_T1", 10, "vllm_graph_us") == pytest.approx(130.0)
    assert m.at(3, "top_p_T1", 3, "vllm_graph_us") is None
    assert m.at(3, "top_p_T1", 17, "vllm_graph_us") is None
    assert m.at(7, "top_p_T1", 4, "vllm_graph_us") is None
    assert not math.isnan(m.at(3, "top_p_T1", 5, "ours_graph_us"))


def test_docs_generator_copies_the_checked_report_into_the_package(tmp_path, monkeypatch,
                                                                   capsys):
    from vllm_kimi_ext.costmodel.verify_report import main

    root = tmp_path / "checkout"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "cost-model.md").write_text((REPO / "docs" / "cost-model.md").read_text())
    packaged = tmp_path / "package" / "verify_graph_vs_vllm_h200.json"
    monkeypatch.setattr(vm, "DEFAULT_REPORT", packaged)
    # the serving side's thresholds are written too: to a copy, never into the package
    import vllm_kimi_ext.costmodel.verify_report as vr

    handover = tmp_path / "package" / "handover.json"
    monkeypatch.setattr(vr, "HANDOVER_DATA", handover)
    docs = str(root / "docs")
    # without any report the block differs from the committed one iff that was generated
    # from the measured report
    assert main(["--check-docs", docs]) == (1 if (REPO / vc.REPORT_NAME).is_file() else 0)
    bench = root / vc.REPORT_NAME
    bench.parent.mkdir(parents=True)
    bench.write_text(FIXTURE.read_text())
    assert main(["--check-docs", docs]) == 1  # the package copy is missing
    assert main(["--write-docs", docs]) == 0
    assert packaged.read_bytes() == bench.read_bytes()
    assert main(["--check-docs", docs]) == 0
    assert handover.is_file() and '"priced": true' in handover.read_text()
    assert "wins from batch" in (root / "docs" / "cost-model.md").read_text()
    assert (root / "docs" / "img" / "costmodel-verify.png").is_file()
    bench.write_text("{")  # a broken report: refused, the package copy left as it was
    capsys.readouterr()
    assert main(["--write-docs", docs]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert packaged.read_text() == FIXTURE.read_text()


@pytest.mark.parametrize("name, packaged", [(vc.REPORT_NAME, vm.DEFAULT_REPORT)])
def test_package_copy_equals_the_checkout_report(name, packaged):
    bench = REPO / name
    assert bench.is_file() == packaged.is_file(), (
        f"{packaged} and {name} must both exist or neither: run nox -s docs")
    if bench.is_file():
        assert packaged.read_bytes() == bench.read_bytes(), "stale package copy: nox -s docs"


def test_communication_table_of_the_comparison_matches_the_model(cm):
    """docs/sharded-verification.md's hand-written communication table (batch-sharded
    sampling section) holds what the PCIe model computes."""
    text = (REPO / "docs" / "sharded-verification.md").read_text()
    section = text.split("## Batch-sharded sampling (vLLM 0.34.0) and sharded verification")[1]
    rows = re.findall(r"^\| (\d+) \| (\d+) \| (\d+) µs \| (\d+) µs \| [^|]+ \| (\d+) µs \|$",
                      section, re.M)
    assert [int(r[0]) for r in rows] == [1, 8, 32, 64]
    for batch, n, stock, bs, one_round in rows:
        b = int(batch)
        assert int(n) == 4 * b
        assert int(stock) == round(vc.price_stock(cm, None, b, 3, "top_p_T1").comm_us)
        assert int(bs) == round(vc.price_batch_sharded(cm, None, b, 3, "top_p_T1").comm_us)
        assert int(one_round) == round(cm.collective_us("allgather", 4 * b * 16 * 8, "nccl"))



def _sharded_step_us(cm, rows: int, k: int) -> tuple[float, list[str]]:
    terms = cm.verification(rows, "sharded", "nccl", k=k)
    return sum(t.time_s for t in terms) * 1e6, [t.name for t in terms]


def test_the_models_sharded_row_is_priced_from_the_report(cm, tmp_path, monkeypatch, doc):
    """The cost model's sharded-verifier row reads the measured report at (rows, k, Kimi's
    T = 1.0 / top_p 0.95): its price moves when the report's time or payload moves, and it
    falls back to the labelled constant where the report has no measurement."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setattr(vm, "DEFAULT_REPORT", path)
    case = next(c for c in doc["cases"] if c["mode"] == vc.DEFAULT_MODE)
    rows, k = case["rows"], case["k"]
    base, names = _sharded_step_us(cm, rows, k)
    assert any("measured" in n for n in names) and not any("constant" in n for n in names)
    slower = copy.deepcopy(doc)
    for c in slower["cases"]:
        if (c["rows"], c["k"], c["mode"]) == (rows, k, vc.DEFAULT_MODE):
            c["ours_graph_us"] += 1000.0
    path = tmp_path / "slower.json"  # a new file: the loader caches by path and mtime
    path.write_text(json.dumps(slower))
    monkeypatch.setattr(vm, "DEFAULT_REPORT", path)
    assert _sharded_step_us(cm, rows, k)[0] == pytest.approx(base + 1000.0)
    bigger = copy.deepcopy(doc)
    for c in bigger["cases"]:
        if (c["rows"], c["k"], c["mode"]) == (rows, k, vc.DEFAULT_MODE):
            c["payload_bytes_per_row_per_rank"] *= 64
    path = tmp_path / "bigger.json"
    path.write_text(json.dumps(bigger))
    monkeypatch.setattr(vm, "DEFAULT_REPORT", path)
    assert _sharded_step_us(cm, rows, k)[0] > base
    # no measurement at these rows / no report: the constant, and the output says so
    monkeypatch.setattr(vm, "DEFAULT_REPORT", tmp_path / "missing.json")
    _, names = _sharded_step_us(cm, rows, k)
    assert all("constant fallback" in n for n in names)


def test_crossover_against_batch_sharded_sampling_per_mode(cm):
    """The crossover batch printed in docs/what-to-run.md: from the measured report, per
    sampling mode; under Kimi's top-p it is where batch-sharded sampling's priced step
    first stays below the sharded one."""
    meas = vc.measurements()
    block = "\n".join(vc.crossover_markdown(cm, meas))
    assert block in (REPO / "docs" / "what-to-run.md").read_text()
    for mode in vc.KIMI_MODES:
        c = vc.crossover(cm, meas, 3, mode)
        assert isinstance(c, int)
        for b in range(c, 65):
            bs = vc.price(cm, meas, "batch_sharded", b, 3, mode)
            sh = vc.price(cm, meas, "sharded", b, 3, mode)
            assert bs.total_us < sh.total_us, (mode, b)
        if c > 1:
            prev = c - 1
            assert (vc.price(cm, meas, "batch_sharded", prev, 3, mode).total_us >=
                vc.price(cm, meas, "sharded", prev, 3, mode).total_us)
        assert f"| {vc.CROSSOVER_MODE_WORDS[mode]} | 3 | batch {c} |" in block
