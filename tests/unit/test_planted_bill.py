"""`draft bill`'s training GPU-hours from FLOPs, against a count made here from the
head's weight matrices (each written down with its shape), not from the bill's
own formula."""

from __future__ import annotations

import json

import pytest

from vllm_kimi_ext.train import bill as b


def _matrices(head: dict) -> dict[str, tuple[int, int]]:
    """The EAGLE-3 head's weight matrices, ``name: (out, in)``."""
    h, hd = head["hidden"], head["head_dim"]
    return {
        "fc": (h, head["num_aux"] * h),
        "q_proj": (head["heads"] * hd, 2 * h),  # the layer reads [embeds | hidden]
        "k_proj": (head["kv_heads"] * hd, 2 * h),
        "v_proj": (head["kv_heads"] * hd, 2 * h),
        "o_proj": (h, head["heads"] * hd),
        "gate_proj": (head["intermediate"], h),
        "up_proj": (head["intermediate"], h),
        "down_proj": (h, head["intermediate"]),
    }


def _independent_flops_per_token(head: dict, depths: int) -> int:
    """2 FLOPs per multiply-add. Trained matrices: forward + weight and input gradients
    (2 + 2 + 2); the frozen draft lm_head: forward + input gradient (2 + 2), at each
    depth; the target's lm_head once, forward only, for the loss's targets."""
    trained = sum(o * i for o, i in _matrices(head).values())
    lm_head = head["draft_vocab"] * head["hidden"]
    return depths * (6 * trained + 4 * lm_head) + 2 * lm_head


def _hours(flops: float, tflops: float) -> float:
    return flops / (tflops * 1e12 * b.TRAIN_MFU) / 3600


def test_kimi_head_flops_per_token_from_its_matrices():
    head = b.LIGHTSEEK_HEAD
    assert head["hidden"] == 7168 and head["draft_vocab"] == 163840  # Kimi-K2.5 config
    for depths in (1, 3):
        assert (b.draft_train_flops_per_token(head, ttt_steps=depths) ==
            _independent_flops_per_token(head, depths))
    # by hand, so a wrong shape above cannot hide: trained MACs fc 154,140,672 + q 117,440,512
    # + k, v 2 x 14,680,064 + o 58,720,256 + MLP 264,241,152 = 623,902,720; lm_head
    # 1,174,405,120 MACs; 3 x (6 x 623,902,720 + 4 x 1,174,405,120) + 2 x 1,174,405,120
    assert _independent_flops_per_token(head, 3) == 27_671_920_640


def test_train_gpu_hours_from_flops_match_an_independent_count():
    traffic = b.Traffic(prompts=300_000, prompt_tokens=1000, response_tokens=2000)
    for depths, epochs, tflops in ((3, 1.0, 500.0), (1, 2.0, 989.0), (5, 0.5, 250.0)):
        bill = b.compute_bill(traffic, decode_tokens_per_s=1.0, prefill_tokens_per_s=1.0,
                              ttt_steps=depths, epochs=epochs, box_gpu_tflops=tflops)
        expected = _hours(_independent_flops_per_token(b.LIGHTSEEK_HEAD, depths)
                          * 300_000 * 3000 * epochs, tflops)
        assert bill.train_gpu_hours_flops == pytest.approx(expected, rel=1e-12)
    # 300k prompts of 3k tokens, 3 depths, one epoch at 500 TFLOPS and MFU 0.3:
    # 27,671,920,640 x 9e8 / (500e12 x 0.3) / 3600 = 46.12 GPU-hours
    bill = b.compute_bill(traffic, decode_tokens_per_s=1.0, prefill_tokens_per_s=1.0)
    assert b.TRAIN_MFU == 0.3
    assert bill.train_gpu_hours_flops == pytest.approx(46.1199, abs=1e-4)


def test_cli_prints_the_same_flop_figure(capsys):
    from vllm_kimi_ext import costmodel
    from vllm_kimi_ext.cli import main

    hw = "rtx-pro-6000-pcie-x8"
    rc = main(["draft", "bill", "--prompts", "1000", "--prompt-tokens", "100",
               "--response-tokens", "300", "--hardware", hw, "--ttt-steps", "2",
               "--epochs", "3", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)["bill"]
    tflops = float(costmodel.CostModel.build(hw).hw.peak_bf16_tflops)
    expected = _hours(_independent_flops_per_token(b.LIGHTSEEK_HEAD, 2) * 1000 * 400 * 3, tflops)
    assert out["train_gpu_hours_flops"] == pytest.approx(expected, rel=1e-12)
