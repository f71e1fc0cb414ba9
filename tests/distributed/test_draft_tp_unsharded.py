"""draft_tensor_parallel_size=1 and replicate_draft_embedding (draft-TP vLLM
patches), at TP=2 over gloo with vLLM's real EAGLE-3 classes and its real
``load_eagle_model``:

* the TP=1 draft is un-sharded (parameter shapes equal the checkpoint's full
  shapes), its draft phase makes zero collectives, and it drafts the same
  tokens as the sharded draft on every rank;
* a head without its own embedding gets a full replica of the target's
  (gathered from the target's shards at load time);
* a sharded draft with a replicated embedding makes 3 collectives per token;
* the opt-in agreement check raises when ranks' draft tokens differ.
"""

from __future__ import annotations

import pytest

from vllm_kimi_ext.testing.checkpoints import TinyEagle3Spec, TinyKimiSpec, write_tiny_eagle3
from vllm_kimi_ext.testing.draft_scenarios import (
    DraftCase,
    expected_draft_pass,
    full_shapes,
    has_replicated_embedding_patch,
    has_unsharded_draft_patch,
    summarize,
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.distributed,
    pytest.mark.skipif(not (has_unsharded_draft_patch() and has_replicated_embedding_patch()),
                       reason="running vLLM lacks the draft-TP patches "
                              "(parallel_state.unsharded_tensor_parallel, "
                              "SpeculativeConfig.replicate_draft_embedding)"),
]

TARGET = TinyKimiSpec()
ROWS = 2
TP1 = (("draft_tensor_parallel_size", 1),)
REPL = (("replicate_draft_embedding", True),)


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    specs = {"llama": TinyEagle3Spec(style="llama"),
             "mla": TinyEagle3Spec(style="mla"),
             "llama-shared": TinyEagle3Spec(style="llama", share_embedding=True)}
    return {name: (str(root / name), write_tiny_eagle3(root / name, TARGET, spec))
            for name, spec in specs.items()}


@pytest.fixture(scope="module")
def results(tiny_kimi_dir, heads):
    from vllm_kimi_ext.testing.distributed import run_tp
    from vllm_kimi_ext.testing.draft_scenarios import unsharded_draft_scenarios

    cases = [
        DraftCase("llama", "eagle3", heads["llama"][0], rows=ROWS),
        DraftCase("mla", "eagle3", heads["mla"][0], rows=ROWS),
        DraftCase("llama-tp1", "eagle3", heads["llama"][0], rows=ROWS, options=TP1),
        DraftCase("mla-tp1", "eagle3", heads["mla"][0], rows=ROWS, options=TP1),
        DraftCase("llama-shared-tp1", "eagle3", heads["llama-shared"][0], rows=ROWS,
                  options=TP1),
        DraftCase("llama-repl", "eagle3", heads["llama"][0], rows=ROWS, options=REPL),
        DraftCase("mla-repl", "eagle3", heads["mla"][0], rows=ROWS, options=REPL),
        DraftCase("llama-shared-repl", "eagle3", heads["llama-shared"][0], rows=ROWS,
                  options=REPL),
    ]
    return run_tp(unsharded_draft_scenarios, 2, str(tiny_kimi_dir), cases)


@pytest.mark.parametrize("style", ["llama", "mla"])
def test_tp1_draft_is_whole_and_silent(results, heads, style):
    for rank_res in results:
        res = rank_res[f"{style}-tp1"]
        assert res["runs_unsharded"]
        assert res["unwritten"] == []
        got = summarize(res["summary"])
        assert got == {**expected_draft_pass(num_layers=1, hidden=64, draft_vocab=1280, tp=2,
                                             rows=ROWS, placement="unsharded"), "other": 0}
        for name, shape in full_shapes(heads[style][1], style).items():
            assert res["shapes"][name] == shape, name
    # identical drafts on every rank, and the same tokens as the sharded draft
    tokens = {tuple(r[f"{style}-tp1"]["tokens"]) for r in results}
    assert tokens == {tuple(results[0][style]["tokens"])}


def test_sharded_draft_shapes_differ(results, heads):
    full = full_shapes(heads["llama"][1], "llama")
    shapes = results[0]["llama"]["shapes"]
    assert shapes["model.layers.0.self_attn.o_proj.weight"] != \
        full["model.layers.0.self_attn.o_proj.weight"]


def test_tp1_head_without_embedding_gets_target_replica(results):
    for rank_res in results:
        res = rank_res["llama-shared-tp1"]
        assert res["shapes"]["model.embed_tokens.weight"] == (TARGET.vocab_size, 64)
        assert summarize(res["summary"])["all_reduce"] == 0
    # every rank holds the same full table
    sums = {r["llama-shared-tp1"]["embed_weight_sum"] for r in results}
    assert len(sums) == 1


@pytest.mark.parametrize("name", ["llama-repl", "mla-repl", "llama-shared-repl"])
def test_replicated_embedding_is_three_per_token(results, name):
    res = results[0][name]
    got = summarize(res["summary"])
    assert got.pop("other") == 0
    assert got == expected_draft_pass(num_layers=1, hidden=64, draft_vocab=1280, tp=2,
                                      rows=ROWS, placement="replicated_embedding")
    assert got["all_reduce"] + got["all_gather"] == 3
    assert res["shapes"]["model.embed_tokens.weight"] == (TARGET.vocab_size, 64)
    if "shared" not in name:  # same head, sharded embedding: same drafts
        assert res["tokens"] == results[0][name.replace("-repl", "")]["tokens"]
    assert {tuple(r[name]["tokens"]) for r in results} == {tuple(res["tokens"])}


def test_agreement_check_fails_loudly(results):
    for rank_res in results:
        agreement = rank_res["_agreement"]
        assert agreement["raised"]
        assert "rank 0 and rank 1" in agreement["message"]
        assert "(1, 2)" in agreement["message"] and "10 vs 11" in agreement["message"]
