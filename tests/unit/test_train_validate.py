"""train/validate.py's rules one by one: number bounds, derived defaults that fit the
target, remote-code detection, output overlap in all directions."""

from __future__ import annotations

import argparse
import json

import pytest

from vllm_kimi_ext.train import capture, validate
from vllm_kimi_ext.user_input import UserInputError


@pytest.mark.parametrize("n,ids", [
    (61, [2, 30, 58, 61]),  # Kimi-K2.5: vLLM's taps as they are
    (6, [2, 3, 6]), (4, [1, 2, 4]), (3, [0, 1, 2, 3]), (2, [0, 1, 2]), (1, [0, 1]),
])
def test_default_layer_ids_fit_every_target_depth(n, ids):
    got = capture.default_layer_ids(n)
    assert got == ids
    assert capture.check_layer_ids(got, n) == got  # valid by construction


def _capture_args(tmp_path, layers: int, layer_ids=None):
    from vllm_kimi_ext.train import layout

    target = tmp_path / "t"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(
        {"num_hidden_layers": layers, "hidden_size": 8, "vocab_size": 50}))
    data = tmp_path / "d"
    layout.append_samples(data, [layout.Sample(0, "h", "s", [], [1, 2], [3])])
    return argparse.Namespace(data=str(data), vllm_target=None, hf_model=str(target),
                              gguf_file=None, staging=None, layer_ids=layer_ids,
                              dtype="bfloat16", tensor_parallel_size=8, max_model_len=None,
                              batch_size=8, trust_remote_code=False)


def test_a_small_target_gets_a_default_that_fits_and_no_flag_is_blamed(tmp_path):
    args = _capture_args(tmp_path, layers=3)
    validate.check_args("capture", args)
    assert args.layer_ids == [0, 1, 2, 3]


def test_only_a_given_layer_ids_is_blamed(tmp_path):
    args = _capture_args(tmp_path, layers=3, layer_ids=[1, 5])
    with pytest.raises(UserInputError, match=r"--layer-ids 1 5: .*the target has 3 layers"):
        validate.check_args("capture", args)


def test_a_resume_reuses_the_earlier_captures_layer_ids(tmp_path):
    from vllm_kimi_ext.train import layout

    args = _capture_args(tmp_path, layers=6)
    layout.update_manifest(args.data, capture={"layer_ids": [1, 2, 6], "dtype": "bfloat16",
                                               "hidden_size": 8})
    validate.check_args("capture", args)
    assert args.layer_ids == [1, 2, 6]


@pytest.mark.parametrize("rule,good,bad", [
    (validate.Num(int, 1), [1, 10**12], [0, -1, 1.5, True, "1"]),
    (validate.Num(float, 0, 1, lo_open=True), [1e-9, 1.0, 1], [0, 0.0, 1.0001, float("nan")]),
    (validate.Num(float, 0, lo_open=True), [1e-300], [0.0, float("inf"), -float("inf")]),
    (validate.Num(float, 0, 1, lo_open=True, hi_open=True), [0.5], [0.0, 1.0]),
])
def test_number_rules(rule, good, bad):
    assert all(rule.ok(v) for v in good)
    assert not any(rule.ok(v) for v in bad)


def test_expectations_read_as_intervals():
    assert validate.Num(float, 0, 1, lo_open=True).expected() == "a finite number in (0, 1]"
    assert validate.Num(int, 1).expected() == "an integer >= 1"
    assert validate.flag_name("k") == "-k" and validate.flag_name("top_p") == "--top-p"


def test_remote_code_is_found_in_config_tokenizer_config_and_text_config(tmp_path):
    assert validate.needs_remote_code(tmp_path) == []
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"auto_map": {"x": "y"}}}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"x": "y"}}))
    assert validate.needs_remote_code(tmp_path) == ["config.json", "tokenizer_config.json"]
    validate.require_remote_code_opt_in("--target", tmp_path, allowed=True)
    with pytest.raises(UserInputError) as err:
        validate.require_remote_code_opt_in("--target", tmp_path, allowed=False)
    assert err.value.field == "--trust-remote-code" and "\n" not in str(err.value)


@pytest.mark.parametrize("out,inp,how", [
    ("a", "a", "is the same path as"), ("a", "a/b", "contains"), ("a/b", "a", "lies inside"),
    ("a/./b/..", "a", "is the same path as"), ("ab", "a", None), ("a", "ab", None),
])
def test_output_overlap_in_every_direction(tmp_path, out, inp, how):
    assert validate._overlap(tmp_path / out, tmp_path / inp) == how


def _draft_parsers() -> dict[str, argparse.ArgumentParser]:
    from vllm_kimi_ext.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    draft = sub.choices["draft"]
    return next(a for a in draft._actions if isinstance(a, argparse._SubParsersAction)).choices


#: numeric options checked by a command's own rule instead of the number table
_CHECKED_ELSEWHERE = {("capture", "layer_ids")}


def test_every_numeric_option_has_a_number_rule():
    """A new ``type=int`` / ``type=float`` flag of these commands needs its row in
    validate.NUMBERS (and, through test_bad_input_train, a bad-input case)."""
    parsers = _draft_parsers()
    missing = [f"{command} {a.option_strings[0]}" for command in validate.NUMBERS
               for a in parsers[command]._actions
               if a.type in (int, float) and a.dest not in validate.NUMBERS[command]
               and (command, a.dest) not in _CHECKED_ELSEWHERE]
    assert missing == []


def test_train_bill_and_eval_number_tables_name_real_flags():
    """Every row of the table is a flag of its command's parser (a renamed flag fails)."""
    dsub = argparse.Namespace(choices=_draft_parsers())
    for command, rules in validate.NUMBERS.items():
        dests = {a.dest for a in dsub.choices[command]._actions}
        assert set(rules) <= dests, (command, set(rules) - dests)
    for command, rules in validate.PATHS.items():
        dests = {a.dest for a in dsub.choices[command]._actions}
        assert set(rules) <= dests, (command, set(rules) - dests)


@pytest.mark.parametrize("gpus,heads,given,want", [
    (8, 64, None, 8), (8, 4, None, 4), (3, 64, None, 2), (6, 64, None, 4), (1, 7, None, 1),
    (8, 64, 4, 4),
])
def test_tensor_parallel_default_fits_gpus_and_heads(monkeypatch, gpus, heads, given, want):
    monkeypatch.setattr(validate, "_visible_gpus", lambda: gpus)
    assert validate._check_gpus(given, heads) == want


def test_tensor_parallel_given_beyond_the_gpus_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(validate, "_visible_gpus", lambda: 2)
    with pytest.raises(UserInputError, match="--tensor-parallel-size 8: 2 CUDA GPU"):
        validate._check_gpus(8, 64)
    monkeypatch.setattr(validate, "_visible_gpus", lambda: 0)
    with pytest.raises(UserInputError) as err:
        validate._check_gpus(None, 64)
    assert "--tensor-parallel-size" not in str(err.value)  # not given: not blamed
