"""Collectives per draft token, counted (vLLM's real draft classes, gloo TP).

One draft forward + compute_logits of tiny drafts on a tiny Kimi-K2.5 target,
under the CollectiveCounter (phase "draft"), at TP=2 and TP=4:

* EAGLE-3 Llama-style and MLA heads (one decoder layer), full and reduced
  draft vocabulary: embedding all-reduce + o_proj all-reduce + MLP all-reduce
  + logits all-gather = 4 per draft token, with bytes from the configs;
* a DFlash drafter (two Qwen3-style layers, one pass drafts the block):
  2L + 2 = 6 per step.

Stock behaviour of ``draft_tensor_parallel_size: 1`` is checked too: without
the draft-TP patch vLLM accepts the value and still shards the draft (the
silent-ignore bug); with the patch the draft is whole and makes no collective
(details in test_patch_0006_eagle_draft_tp1.py).
"""

from __future__ import annotations

import pytest

from testkit.checkpoints import TinyKimiSpec
from testkit.draft_scenarios import (
    DraftCase,
    TinyDFlashSpec,
    expected_draft_pass,
    has_unsharded_draft_patch,
    summarize,
)

pytestmark = [pytest.mark.vllm, pytest.mark.distributed]

TARGET = TinyKimiSpec()
DFLASH = TinyDFlashSpec()
BLOCK_ROWS = DFLASH.block_size  # one DFlash step verifies k + 1 = block rows


@pytest.fixture(scope="module")
def drafts(eagle3_heads, dflash_draft):
    paths = {name: eagle3_heads[name][0] for name in ("llama", "mla", "llama-v512")}
    paths["dflash"] = dflash_draft
    return paths


def _cases(drafts, with_tp1: bool):
    cases = [DraftCase("llama", "eagle3", drafts["llama"], rows=2),
             DraftCase("mla", "eagle3", drafts["mla"], rows=2),
             DraftCase("llama-v512", "eagle3", drafts["llama-v512"], rows=2),
             DraftCase("dflash", "dflash", drafts["dflash"], rows=BLOCK_ROWS)]
    if with_tp1:
        cases.append(DraftCase("llama-tp1", "eagle3", drafts["llama"], rows=2,
                               options=(("draft_tensor_parallel_size", 1),)))
    return cases


@pytest.fixture(scope="module")
def tp2(draft_tp_results):
    """The TP=2 draft cases of the tier's shared rank set (tests/distributed/conftest.py:
    ``draft_cases``: the cases of ``_cases(drafts, True)`` and the draft-TP tests' heads)."""
    return draft_tp_results


@pytest.fixture(scope="module")
def tp4(tiny_kimi_dir, drafts):
    from testkit.distributed import run_tp
    from testkit.draft_scenarios import draft_collectives

    return run_tp(draft_collectives, 4, str(tiny_kimi_dir), _cases(drafts, False))


def _check_sharded(results, tp):
    for name in ("llama", "mla", "llama-v512", "dflash"):
        per_rank = [r[name] for r in results]
        res = per_rank[0]
        expected = expected_draft_pass(num_layers=res["num_layers"], hidden=res["hidden"],
                                       draft_vocab=res["draft_vocab"], tp=tp,
                                       rows=BLOCK_ROWS if name == "dflash" else 2)
        got = summarize(res["summary"])
        assert got.pop("other") == 0, name
        assert got == expected, f"{name} at TP={tp}"
        # the closed forms the docs table uses
        n = got["all_reduce"] + got["all_gather"]
        assert n == (2 * DFLASH.num_hidden_layers + 2 if name == "dflash" else 4), name
        assert [u for u in res["unwritten"] if u != "model.mask_embedding"] == [], name
        # SPMD: every rank made the same calls and drafted the same tokens
        assert all(r["summary"] == res["summary"] for r in per_rank), name
        assert all(r["tokens"] == res["tokens"] for r in per_rank), name


def test_sharded_drafts_tp2(tp2):
    _check_sharded(tp2, 2)


@pytest.mark.slow  # a 4-rank set costs ~100 s on 2 CPU cores
def test_sharded_drafts_tp4(tp4):
    _check_sharded(tp4, 4)


def test_reduced_draft_vocab_gathers_fewer_bytes(tp2):
    full = summarize(tp2[0]["llama"]["summary"])
    small = summarize(tp2[0]["llama-v512"]["summary"])
    assert small["all_gather_bytes"] * TARGET.vocab_size == full["all_gather_bytes"] * 512


def test_draft_tp1_stock_is_ignored_patched_is_real(tp2):
    res = tp2[0]["llama-tp1"]
    got = summarize(res["summary"])
    o_proj = res["shapes"]["model.layers.0.self_attn.o_proj.weight"]
    if has_unsharded_draft_patch():
        assert got["all_reduce"] == got["all_gather"] == 0
        assert o_proj == (TARGET.hidden_size, TARGET.hidden_size)
        assert res["tokens"] == tp2[0]["llama"]["tokens"]  # same draft, whole
    else:  # vLLM 0.34.0 as shipped: the value is accepted and ignored
        assert got == summarize(tp2[0]["llama"]["summary"])
        assert o_proj == (TARGET.hidden_size, TARGET.hidden_size // 2)
