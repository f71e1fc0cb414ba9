"""Communication plan (collectives, bytes) and the fallback decision."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from testkit.verify_simulate import simulate_sharded_verify
from vllm_kimi_ext.verify import (
    BatchModes,
    Fallback,
    FallbackCounter,
    ShardedPlan,
    VerifyBatch,
    comm_plan,
    plan_verification,
)
from vllm_kimi_ext.verify.plan import FALLBACK_REASONS
from vllm_kimi_ext.verify.sharded import full_gather_bytes_per_row

KIMI_V = 163840


pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def test_plan_numbers_per_mode():
    rows, tp = 4 * 16, 8  # 16 requests, k = 3
    greedy = comm_plan(rows, tp, BatchModes(all_greedy=True))
    assert greedy.num_collectives == 1
    assert greedy.bytes_per_row_per_rank == 8
    onehot = comm_plan(rows, tp, BatchModes(all_greedy=False))
    assert onehot.num_collectives == 1
    assert onehot.bytes_per_row_per_rank == 16
    assert onehot.bytes_received_per_rank == 16 * tp * rows
    topk = comm_plan(rows, tp, BatchModes(all_greedy=False, threshold_rows=rows,
                                          threshold_width=50))
    assert topk.num_collectives == 2
    assert [c.name for c in topk.collectives] == ["threshold", "stats"]
    assert topk.bytes_sent_per_rank == rows * (50 * 4 + 16)
    minp = comm_plan(rows, tp, BatchModes(all_greedy=False, threshold_rows=8,
                                          threshold_width=1))
    assert minp.bytes_sent_per_rank == 8 * 4 + rows * 16
    prob = comm_plan(rows, tp, BatchModes(all_greedy=False, prob_requests=16))
    assert prob.num_collectives == 2
    assert prob.bytes_sent_per_rank == rows * 16 + 16 * 8
    both = comm_plan(rows, tp, BatchModes(False, rows, 20, 16))
    assert both.num_collectives == 3


def test_kimi_single_stream_bytes():
    """B=1, k=3 at TP=8: 4 rows; 512 B received per rank instead of 1.3 MB."""
    p = comm_plan(4, 8, BatchModes(all_greedy=False))
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
    _, group, _ = simulate_sharded_verify(z, b, tp, V, q)
    plan = comm_plan(b.num_rows, tp, BatchModes.from_batch(b, V, q is not None))
    for rank_calls in group.calls:
        assert len(rank_calls) == plan.num_collectives
        assert [shape for shape, _ in rank_calls] == [(c.rows, c.width) for c in plan.collectives]
        assert sum(nb for _, nb in rank_calls) == plan.bytes_sent_per_rank
    if case in ("greedy", "mixed"):
        assert plan.num_collectives == 1
        assert plan.bytes_per_row_per_rank <= 16


def test_plan_verification_sharded_and_collective_count():
    params = [SimpleNamespace(temperature=0.0), SimpleNamespace(temperature=0.7, top_k=40),
              {"temperature": 1.0, "min_p": 0.05}]
    plan = plan_verification(params, tp_size=8, vocab_size=KIMI_V)
    assert isinstance(plan, ShardedPlan)
    assert (plan.greedy_reqs, plan.top_k_reqs, plan.min_p_reqs) == (1, 1, 1)
    assert plan.num_collectives == 2
    assert plan_verification(params[:1], tp_size=8, vocab_size=KIMI_V).num_collectives == 1
    assert plan_verification(params[1:2], tp_size=8, vocab_size=KIMI_V,
                             probabilistic_draft=True).num_collectives == 3
    # greedy ignores top_p (vLLM does too)
    assert isinstance(plan_verification([SimpleNamespace(temperature=0.0, top_p=0.5)],
                                        tp_size=8, vocab_size=KIMI_V), ShardedPlan)
    # top-p is sharded only for a caller that passes top_p to the verifier
    kimi = [SimpleNamespace(temperature=1.0, top_p=0.95), SimpleNamespace(temperature=0.6,
                                                                           top_p=0.95)]
    assert plan_verification(kimi, tp_size=8, vocab_size=KIMI_V).reason == "top_p"
    sharded = plan_verification(kimi, tp_size=8, vocab_size=KIMI_V, top_p_sharded=True)
    assert isinstance(sharded, ShardedPlan)
    assert (sharded.top_p_reqs, sharded.num_collectives) == (2, 2)


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
    with caplog.at_level(logging.DEBUG, logger="vllm_kimi_ext.verify.plan"):
        fb = plan_verification([SimpleNamespace(temperature=0.0), p], tp_size=8,
                               vocab_size=KIMI_V, counter=counter)
    assert isinstance(fb, Fallback) and fb.reason == reason
    assert reason in FALLBACK_REASONS
    assert counter.as_dict() == {reason: 1} and counter.total == 1
    assert any(reason in r.getMessage() for r in caplog.records)


def test_fallback_other_causes():
    c = FallbackCounter()
    assert plan_verification([{"temperature": 1.0}], tp_size=8, vocab_size=2**24,
                             counter=c).reason == "vocab_too_large"
    fb = plan_verification([{"temperature": 1.0, "top_p": 0.9, "logprobs": 1}], tp_size=8,
                           vocab_size=KIMI_V, custom_logits_processors=True, counter=c)
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
