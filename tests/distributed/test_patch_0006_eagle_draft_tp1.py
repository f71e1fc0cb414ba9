"""Patch 0006: ``draft_tensor_parallel_size: 1`` for EAGLE/EAGLE-3/MTP drafts,
at TP=2 over gloo with vLLM's real EAGLE-3 classes and its real
``load_eagle_model``:

* the TP=1 draft is built under the draft's parallel config (tensor parallel size 1)
  and is un-sharded (parameter shapes equal the checkpoint's full shapes), its draft
  phase makes zero collectives, and it drafts the same tokens as the sharded draft on
  every rank;
* a head without its own embedding gets a full replica of the target's
  (gathered from the target's shards at load time);
* the plugin's opt-in agreement check raises when ranks' draft tokens differ.

Stock behaviour (the value accepted and ignored) is checked in
test_draft_collectives.py; the configuration side in
tests/vllm/test_patch_0006_eagle_draft_tp1_config.py.
"""

from __future__ import annotations

import pytest

from testkit.checkpoints import TinyKimiSpec
from testkit.draft_scenarios import (
    expected_draft_pass,
    full_shapes,
    has_unsharded_draft_patch,
    summarize,
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.distributed,
    pytest.mark.skipif(not has_unsharded_draft_patch(),
                       reason="running vLLM lacks patch 0006 (spec_decode.unsharded_draft)"),
]

TARGET = TinyKimiSpec()
ROWS = 2  # DRAFT_TP_ROWS of draft_tp_results (tests/distributed/conftest.py)


# "mla": a dense EAGLE-3 MLA head whose DeepSeek config carries Hugging Face's default
# n_routed_experts; it runs whole like the Llama-style head (patch 0006 decides MoE from
# the draft's layers, not from ModelConfig.is_moe)
@pytest.mark.parametrize("style", ["llama", "mla"])
def test_tp1_draft_is_whole_and_silent(draft_tp_results, eagle3_heads, style):
    for rank_res in draft_tp_results:
        res = rank_res[f"{style}-tp1"]
        assert res["runs_unsharded"]
        # built under the draft's own parallel config, as the standalone draft path does
        assert res["built_under_tp"] == 1
        assert res["unwritten"] == []
        got = summarize(res["summary"])
        assert got == {**expected_draft_pass(num_layers=1, hidden=64, draft_vocab=1280, tp=2,
                                             rows=ROWS, placement="unsharded"), "other": 0}
        for name, shape in full_shapes(eagle3_heads[style][1], style).items():
            assert res["shapes"][name] == shape, name
    # identical drafts on every rank, and the same tokens as the sharded draft
    tokens = {tuple(r[f"{style}-tp1"]["tokens"]) for r in draft_tp_results}
    assert tokens == {tuple(draft_tp_results[0][style]["tokens"])}


def test_sharded_draft_shapes_differ(draft_tp_results, eagle3_heads):
    full = full_shapes(eagle3_heads["llama"][1], "llama")
    assert draft_tp_results[0]["llama"]["built_under_tp"] == 2
    shapes = draft_tp_results[0]["llama"]["shapes"]
    assert (shapes["model.layers.0.self_attn.o_proj.weight"] !=
        full["model.layers.0.self_attn.o_proj.weight"])


def test_tp1_head_without_embedding_gets_target_replica(draft_tp_results):
    for rank_res in draft_tp_results:
        res = rank_res["llama-shared-tp1"]
        assert res["shapes"]["model.embed_tokens.weight"] == (TARGET.vocab_size, 64)
        assert summarize(res["summary"])["all_reduce"] == 0
    # every rank holds the same full table
    sums = {r["llama-shared-tp1"]["embed_weight_sum"] for r in draft_tp_results}
    assert len(sums) == 1


def test_agreement_check_fails_loudly(draft_tp_results):
    for rank_res in draft_tp_results:
        agreement = rank_res["_agreement"]
        assert agreement["raised"]
        assert "rank 0 and rank 1" in agreement["message"]
        assert "(1, 2)" in agreement["message"] and "10 vs 11" in agreement["message"]
