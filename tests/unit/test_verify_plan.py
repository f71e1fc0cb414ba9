"""The step plan from the requests' parameters (rounds, bytes) and the fallback decision."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from testkit.verify_hist_step import hist_plan
from testkit.verify_simulate import plan_for_layout, simulate_sharded_verify
from vllm_kimi_ext.verify import (
    Fallback,
    FallbackCounter,
    StepPlan,
    VerifyBatch,
    full_gather_bytes_per_row,
    plan_from_params,
)
from vllm_kimi_ext.verify.protocol import FALLBACK_REASONS

KIMI_V = 163840
KIMI_S = KIMI_V // 8


pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def _plan(params, rows_per_req=4, **kw) -> StepPlan | Fallback:
    return plan_from_params(params, tp_size=8, vocab_size=KIMI_V,
                            num_rows=rows_per_req * len(params), max_rows_per_req=rows_per_req,
                            **kw)


def test_plan_numbers_per_mode():
    """Rows x float32 columns of each round, from the requests' parameters (16 requests,
    k = 3, TP = 8, Kimi's vocabulary: shards of 20480 bf16)."""
    rows = 4 * 16
    greedy = _plan([{"temperature": 0.0}] * 16)
    assert [(r.name, r.rows, r.width) for r in greedy.rounds] == [("stats", rows, 2)]
    assert greedy.bytes_per_row_per_rank == 8
    onehot = _plan([{"temperature": 0.7}] * 16)
    assert onehot.bytes_per_row_per_rank == 16 and onehot.num_collectives == 1
    assert onehot.bytes_received_per_rank == 16 * 8 * rows
    topk = _plan([{"temperature": 0.7, "top_k": 50}] * 16)
    assert [(r.name, r.width) for r in topk.rounds] == [("stats+candidates", 5 + 2 * 128)]
    assert topk.bytes_sent_per_rank == rows * 4 * (5 + 2 * 128)
    assert _plan([{"temperature": 0.7, "top_k": 300}] * 16).candidates == 300
    top_p = hist_plan(_plan([{"temperature": 1.0, "top_p": 0.95}] * 16))
    # bf16 top-p at 16 requests with the histogram escalation (three small rounds, the last
    # one also carrying one whole-row slot for rows it cannot cut exactly): fewer bytes
    # than 16 whole rows
    assert [(r.name, r.rows, r.width, r.element_bytes) for r in top_p.rounds] == [
        ("stats+candidates", rows, 5 + 2 * 128, 4), ("hist-coarse", 16, 256, 8),
        ("hist-boundary", 16, 256, 4), ("hist-stats+rows", 1, 16 * 16 + KIMI_S * 2, 1)]
    assert top_p.escalation == "hist" and top_p.row_fallback_slots == 1
    assert top_p.bytes_per_escalated_row_per_rank == 2048 + 1024 + 16 + KIMI_S * 2 / 16
    rows_p = _plan([{"temperature": 1.0, "top_p": 0.95}] * 16)
    assert [(r.name, r.rows, r.width, r.element_bytes) for r in rows_p.rounds][1:] == [
        ("escalation", 16, KIMI_S, 2)]
    assert rows_p.bytes_per_escalated_row_per_rank == 40_960
    # the package plans whole rows at every batch: measured on a GPU, the step with the
    # histogram escalation (the test kit's) is slower despite its fewer bytes
    for n in (1, 9, 10, 16, 64, 256):
        plan = _plan([{"temperature": 1.0, "top_p": 0.95}] * n)
        assert plan.escalation == "rows" and [r.name for r in plan.rounds][1:] == [
            "escalation"], n
    # float32 logits and probabilistic drafts: whole rows only
    with pytest.raises(ValueError, match="16-bit"):
        hist_plan(_plan([{"temperature": 1.0, "top_p": 0.95}] * 16, logits_bytes=4))
    with pytest.raises(ValueError, match="16-bit"):
        hist_plan(_plan([{"temperature": 1.0, "top_p": 0.95}] * 16, probabilistic=True))
    assert _plan([{"temperature": 1.0, "top_p": 0.95, "top_k": 20}] * 16).escalation_slots == 0
    minp = _plan([{"temperature": 1.0, "min_p": 0.1}] * 16)
    assert minp.escalation_slots == 16
    prob = _plan([{"temperature": 0.7}] * 16, probabilistic=True)
    assert [(r.name, r.rows, r.width) for r in prob.rounds] == [
        ("stats+candidates", rows, 5), ("residual", 16, 2)]
    assert (_plan([{"temperature": 0.7, "top_k": 5}] * 16, probabilistic=True).rounds[-1].name
        == "stats+candidates")


def test_kimi_single_stream_bytes():
    """B=1, k=3 at TP=8: 4 rows; 512 B received per rank instead of 1.3 MB."""
    p = _plan([{"temperature": 0.7}])
    assert p.bytes_received_per_rank == 4 * 16 * 8 == 512
    assert 4 * full_gather_bytes_per_row(KIMI_V) == 1_310_720
    assert "1 all-gather" in p.describe()


def _batch(g, n, V, *, greedy, top_k=0, min_p=0.0):
    drafts = torch.randint(0, V, (n, 3), generator=g)
    temps = torch.zeros(n) if greedy else torch.where(torch.arange(n) % 2 == 0, 0.0, 0.8)
    return VerifyBatch.from_draft_tokens(
        drafts, temps, torch.arange(n), top_k=torch.full((n,), top_k),
        min_p=torch.full((n,), min_p))


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("case", ["greedy", "mixed", "top_k", "min_p", "prob", "prob_top_k"])
def test_measured_collectives_match_plan(tp, case):
    V = 77
    g = torch.Generator().manual_seed(tp)
    n = 10
    kw = {"greedy": case == "greedy"}
    if case in ("top_k", "prob_top_k"):
        kw["top_k"] = 6
    if case == "min_p":
        kw["min_p"] = 0.1
    b = _batch(g, n, V, **kw)
    z = torch.randn(b.num_rows, V, generator=g)
    q = torch.softmax(torch.randn(b.num_rows, V, generator=g), 1) if "prob" in case else None
    _, group, _ = simulate_sharded_verify(z, b, tp, V, q, escalation_slots=None)
    plan = plan_for_layout(b.layout(), tp_size=tp, shard_width=-(-V // tp), vocab_size=V,
                           probabilistic=q is not None, logits_bytes=4)
    for rank_calls in group.calls:
        assert len(rank_calls) == plan.num_collectives
        assert [shape for shape, _ in rank_calls] == [(c.rows, c.width) for c in plan.rounds]
        assert sum(nb for _, nb in rank_calls) == plan.bytes_sent_per_rank
    if case in ("greedy", "mixed"):
        assert plan.num_collectives == 1
        assert plan.bytes_per_row_per_rank <= 16


def test_plan_from_params_sharded_and_collective_count():
    params = [SimpleNamespace(temperature=0.0), SimpleNamespace(temperature=0.7, top_k=40),
              {"temperature": 1.0, "min_p": 0.05}]
    plan = _plan(params)
    assert isinstance(plan, StepPlan)
    assert [r.name for r in plan.rounds] == ["stats+candidates", "escalation"]
    assert [r.name for r in hist_plan(_plan(params)).rounds] == [
        "stats+candidates", "hist-coarse", "hist-boundary", "hist-stats+rows"]
    assert _plan(params[:1]).num_collectives == 1
    assert _plan(params[1:2], probabilistic=True).num_collectives == 1  # top-k: no residual
    assert _plan([{"temperature": 0.7}], probabilistic=True).num_collectives == 2
    # greedy ignores top_p (vLLM does too)
    assert _plan([SimpleNamespace(temperature=0.0, top_p=0.5)]).all_greedy
    # top-p is sharded unless the caller cannot pass top_p to the step
    kimi = [SimpleNamespace(temperature=1.0, top_p=0.95), SimpleNamespace(temperature=0.6,
                                                                           top_p=0.95)]
    assert _plan(kimi, top_p_sharded=False).reason == "top_p"
    sharded = _plan(kimi)
    assert isinstance(sharded, StepPlan)
    assert (sharded.escalation_slots, sharded.num_collectives) == (2, 2)  # rows: 2 slots
    assert hist_plan(_plan(kimi)).num_collectives == 4


@pytest.mark.parametrize("field,value,reason", [
    ("top_p", 0.9, "top_p"),
    ("logprobs", 5, "logprobs"),
    ("logprob_token_ids", [1, 2], "logprobs"),
    ("presence_penalty", 0.5, "penalties"),
    ("frequency_penalty", 0.1, "penalties"),
    ("repetition_penalty", 1.1, "penalties"),
    ("bad_words", ["x"], "bad_words"),
    ("logit_bias", {5: 1.0}, "logit_bias"),
    ("allowed_token_ids", [1, 2, 3], "allowed_token_ids"),
    ("min_tokens", 4, "min_tokens"),
    ("structured_outputs", object(), "structured_output"),
    ("thinking_token_budget", 100, "thinking_budget"),
    ("watermarking", True, "watermarking"),
])
def test_fallback_reasons_are_counted_and_logged(field, value, reason, caplog):
    counter = FallbackCounter()
    p = SimpleNamespace(temperature=0.8, **{field: value})
    with caplog.at_level(logging.DEBUG, logger="vllm_kimi_ext.verify.protocol"):
        fb = _plan([SimpleNamespace(temperature=0.0), p], counter=counter,
                   top_p_sharded=False)
    assert isinstance(fb, Fallback) and fb.reason == reason
    assert reason in FALLBACK_REASONS
    assert counter.as_dict() == {reason: 1} and counter.total == 1
    assert any(reason in r.getMessage() for r in caplog.records)


def test_fallback_other_causes():
    c = FallbackCounter()
    assert plan_from_params([{"temperature": 1.0}], tp_size=8, vocab_size=2**24, num_rows=4,
                            max_rows_per_req=4, counter=c).reason == "vocab_too_large"
    fb = _plan([{"temperature": 1.0, "top_p": 0.9, "logprobs": 1}], top_p_sharded=False,
               custom_logits_processors=True, counter=c)
    assert fb.reason == "top_p"
    assert fb.all_reasons == ("top_p", "logprobs", "logits_processors")
    assert c.as_dict() == {"vocab_too_large": 1, "top_p": 1}
    c.reset()
    assert c.total == 0


def test_group_coordinator_adapter_shapes():
    """vLLM's GroupCoordinator.all_gather concatenates on dim 0; the adapter restacks."""
    from vllm_kimi_ext.verify import group_coordinator_all_gather

    class FakeGroup:
        world_size = 4

        def all_gather(self, t, dim=0):
            return torch.cat([t + r for r in range(self.world_size)], dim=dim)

    ag = group_coordinator_all_gather(FakeGroup())
    x = torch.arange(6.0).view(3, 2)
    out = ag(x)
    assert out.shape == (4, 3, 2)
    assert torch.equal(out[2], x + 2)


@pytest.mark.parametrize("top_k", [KIMI_V, KIMI_V + 1, -1, 0])
def test_a_top_k_of_the_whole_vocabulary_is_no_cut(top_k):
    """vLLM treats ``top_k >= V`` (and ``<= 0``) as off: the plan is the uncut one (one
    stats-only all-gather, captured), never 128 candidates per row plus nothing certified,
    and the step's device inputs carry 0 (planted ``0 < k <= vocab_size`` in the plan ->
    a candidates round)."""
    from vllm_kimi_ext.verify.step_io import StepInputs

    plain = _plan([{"temperature": 1.0}] * 4)
    assert _plan([{"temperature": 1.0, "top_k": top_k}] * 4) == plain
    assert plain.stats_only and plain.candidates == 0 and plain.num_collectives == 1
    one = torch.ones(1)
    inp = StepInputs.from_requests(torch.tensor([0, 2]), torch.tensor([5, -1]), one,
                                   torch.zeros(1, dtype=torch.long), torch.arange(2),
                                   torch.tensor([top_k]), torch.zeros(1), one, KIMI_V)
    assert inp.top_k.tolist() == [0, 0]
