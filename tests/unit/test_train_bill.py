"""The K2.5 bill's arithmetic against cases worked out by hand."""

from __future__ import annotations

import json
import math

import pytest

from vllm_kimi_ext.train import bill as b
from vllm_kimi_ext.train.layout import DataError


def test_hidden_state_bytes_per_token_kimi():
    # 3 aux + 1 last layer, 7168 wide, bf16, plus an int64 token id
    assert b.hidden_bytes_per_token() == 4 * 7168 * 2 + 8 == 57352
    assert b.hidden_bytes_per_token(hidden=10, num_aux=3, last=False, dtype_bytes=4,
                                    token_id_bytes=0) == 120


def test_train_flops_per_token_tiny_head_by_hand():
    head = {"hidden": 4, "heads": 2, "kv_heads": 1, "head_dim": 2, "intermediate": 8,
            "num_aux": 3, "draft_vocab": 10}
    # trained MACs: fc 3*4*4=48; q,k,v: 2*4*(4+2*2)=64; o: 4*4=16; mlp 3*4*8=96 -> 224
    # lm_head 4*10=40; per depth 2*(3*224 + 2*40) = 1504; 2 depths + target head 2*40
    assert b.draft_train_flops_per_token(head, ttt_steps=2) == 2 * 1504 + 80


def test_compute_bill_round_numbers():
    traffic = b.Traffic(prompts=3600, prompt_tokens=500, response_tokens=1000)
    bill = b.compute_bill(traffic, decode_tokens_per_s=1000.0, prefill_tokens_per_s=5400.0,
                          box_gpus=8, box_gpu_tflops=989.0 / 2)
    # 3600 x 1000 generated tokens at 1000 tok/s = 1 h; 3600 x 1500 at 5400 tok/s = 1000 s
    assert bill.regenerate_hours == pytest.approx(1.0)
    assert bill.capture_hours == pytest.approx(1000 / 3600)
    assert bill.disk_bytes == 3600 * 1500 * 57352
    # lightseek: 16 x 28 H200-h for 600k samples; a box GPU at half an H200's rate
    assert bill.train_gpu_hours_reference == pytest.approx(16 * 28 / 600_000 * 3600 * 2)
    assert bill.train_gpu_hours_measured is None
    assert bill.box_hours == pytest.approx(1 + 1000 / 3600 + bill.train_gpu_hours_reference / 8)


def test_online_disk_is_a_staging_window_and_measured_training_rate():
    traffic = b.Traffic(prompts=10_000, prompt_tokens=100, response_tokens=100)
    bill = b.compute_bill(traffic, decode_tokens_per_s=1.0, prefill_tokens_per_s=1.0,
                          online=True, staging_samples=50, measured_train_tokens_per_s=2000.0)
    assert bill.disk_bytes == 50 * 200 * 57352
    assert bill.train_gpu_hours_measured == pytest.approx(10_000 * 200 / 2000 / 3600)


def test_samples_for_gain_halvings():
    assert b.samples_for_gain(0.5, n_half=1000) == pytest.approx(1000)
    assert b.samples_for_gain(0.75, n_half=1000) == pytest.approx(2000)
    assert b.samples_for_gain(0.875, n_half=1000) == pytest.approx(3000)
    with pytest.raises(DataError):
        b.samples_for_gain(1.0)


def test_fine_tune_vs_switch_by_hand():
    out = b.fine_tune_vs_switch(tau_now=2.0, tau_after=3.0, tau_alt=2.5, box_hours=10.0)
    assert out["speed_after_fine_tune"] == pytest.approx(1.5)
    assert out["speed_after_switch"] == pytest.approx(1.25)
    assert out["fine_tune_wins"]
    # 10 h x today's speed lost, 0.5 x today's speed gained per hour
    assert out["payback_hours_vs_today"] == pytest.approx(20.0)
    # 10 h x 1.25 lost vs switching at once, 0.25 gained per hour
    assert out["payback_hours_vs_switch"] == pytest.approx(50.0)
    # a cheaper alternative draft (half the step time) wins
    lose = b.fine_tune_vs_switch(2.0, 3.0, 2.5, 10.0, alt_step_cost=0.5)
    assert not lose["fine_tune_wins"] and math.isinf(lose["payback_hours_vs_switch"])


def test_prefill_rate_formula():
    # 8 GPUs x 500 TFLOPS x 0.5 / (2 x 32e9) = 31250 tok/s
    assert b.prefill_tokens_per_s(500, 0.5, 8) == pytest.approx(31250)


def test_box_rates_read_the_cost_model():
    box = b.box_rates("rtx-pro-6000-pcie-x8", batch=1, context=1024)
    assert box["gpus"] == 8 and box["decode_tokens_per_s"] > 0
    with pytest.raises(DataError, match="cost model unavailable"):
        b.box_rates("no-such-box", batch=1, context=1024)


def test_cli_bill_json_and_refusal(capsys, tmp_path):
    from vllm_kimi_ext.cli import main

    rc = main(["draft", "bill", "--prompts", "3600", "--prompt-tokens", "500",
               "--response-tokens", "1000", "--decode-tok-s", "1000", "--prefill-tok-s", "5400",
               "--tau-now", "2", "--tau-after", "3", "--tau-alt", "2.5", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bill"]["regenerate_hours"] == pytest.approx(1.0)
    assert out["compare"]["fine_tune_wins"] is True
    rc = main(["draft", "bill", "--gain-fraction", "1.5"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--gain-fraction 1.5" in err


def test_pilot_measurements_feed_the_bill(tmp_path):
    from vllm_kimi_ext.train import layout

    layout.append_samples(tmp_path, [
        layout.Sample(0, "a", "s", [], [1] * 100, [2] * 300),
        layout.Sample(1, "b", "s", [], [1] * 300, [2] * 100)])
    layout.update_manifest(tmp_path, generation={"measured": {"tokens_per_s": 250.0}},
                           capture={"measured": {"tokens": 800, "seconds": 0.5}})
    train_json = tmp_path / "training.json"
    train_json.write_text(json.dumps({"tokens_per_s": 4000.0}))
    m = b.load_measured(tmp_path, train_json)
    assert m == {"prompt_tokens": 200.0, "response_tokens": 200.0, "decode_tokens_per_s": 250.0,
                 "prefill_tokens_per_s": 1600.0, "train_tokens_per_s": 4000.0}


def test_shard_store_read_rate_and_the_disk_bound_by_hand():
    traffic = b.Traffic(prompts=1000, prompt_tokens=500, response_tokens=500)
    # measured 10 000 tok/s x 57352 B/token = 573.52 MB/s against a 0.5 GB/s store
    bill = b.compute_bill(traffic, decode_tokens_per_s=1.0, prefill_tokens_per_s=1.0,
                          measured_train_tokens_per_s=10_000.0,
                          disk_read_bytes_per_s=0.5e9, tokens_per_step=16384)
    assert bill.disk_read_bytes_per_step == 16384 * 57352
    assert bill.disk_read_bytes_per_s_needed == pytest.approx(10_000 * 57352)
    assert bill.disk_bound
    # 1e6 tokens x 57352 B at 0.5 GB/s = 114.704 s: longer than the GPUs' 100 s
    assert bill.train_hours_at_disk_rate == pytest.approx(1e6 * 57352 / 0.5e9 / 3600)
    assert bill.box_hours == pytest.approx(bill.regenerate_hours + bill.capture_hours
                                           + bill.train_hours_at_disk_rate)
    assert "DISK-BOUND" in b.format_bill(bill)
    fast = b.compute_bill(traffic, decode_tokens_per_s=1.0, prefill_tokens_per_s=1.0,
                          measured_train_tokens_per_s=10_000.0, disk_read_bytes_per_s=1e9)
    assert not fast.disk_bound and "DISK-BOUND" not in b.format_bill(fast)
    online = b.compute_bill(traffic, decode_tokens_per_s=1.0, prefill_tokens_per_s=1.0,
                            online=True, disk_read_bytes_per_s=1.0)
    assert not online.disk_bound and online.train_hours_at_disk_rate == 0
