"""The training commands' settings are written once (``vllm_kimi_ext.train.settings``):
the CLI's flags are generated from them, and no other module of ``train/`` spells one of
their defaults again (a function parameter or a flag of the same name with a literal)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from vllm_kimi_ext.cli import build_parser
from vllm_kimi_ext.train import settings

TRAIN = Path(settings.__file__).parent
CLASSES = (settings.Sampling, settings.Regeneration, settings.Capture, settings.TrainConfig,
           settings.Holdout, settings.Evaluation, settings.Bill)
#: parameters that share a setting's name but are another quantity, with what they are
OTHER_QUANTITY = {
    "bridge.py:write_target_stub:dtype": "the target stub's weights, not the capture's",
    "bridge.py:export_flat:dtype": "the exported head's weights, not the capture's",
}
#: (command line up to the settings, the settings classes it takes)
COMMANDS = [
    (["draft", "regenerate", "--prompts", "p", "--out", "o"],
     (settings.Sampling, settings.Regeneration)),
    (["draft", "capture", "--data", "d"], (settings.Capture,)),
    (["draft", "train", "--data", "d", "--target", "t", "--out", "o"],
     (settings.TrainConfig, settings.Holdout)),
    (["draft", "eval", "--data", "d", "--target", "t", "--draft", "x"],
     (settings.Evaluation, settings.Holdout)),
    (["draft", "bill"], (settings.Bill,)),
]


def _setting_names() -> set[str]:
    return {f.name for cls in CLASSES for f in dataclasses.fields(cls)
            if "help" in f.metadata}


def restated_defaults(sources: dict[str, str], names: set[str]) -> list[str]:
    """``file:function:param`` (or ``file:line:flag``) restating a setting's default as a
    literal, in ``{file name: source}``."""
    hits = []
    for rel, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                pos = [*a.posonlyargs, *a.args]
                pairs = [*zip(pos[len(pos) - len(a.defaults):], a.defaults),
                         *((p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults) if d)]
                hits += [f"{rel}:{node.name}:{p.arg}" for p, d in pairs
                         if p.arg in names and isinstance(d, ast.Constant)
                         and d.value is not None]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "add_argument" and node.args
                  and isinstance(node.args[0], ast.Constant)):
                dest = str(node.args[0].value).lstrip("-").replace("-", "_")
                hits += [f"{rel}:{node.lineno}:{node.args[0].value}" for k in node.keywords
                         if k.arg == "default" and dest in names
                         and isinstance(k.value, ast.Constant) and k.value.value is not None]
    return sorted(set(hits))


def test_no_setting_default_is_written_twice():
    sources = {p.name: p.read_text(encoding="utf-8") for p in sorted(TRAIN.glob("*.py"))
               if p.name != "settings.py"}
    found = restated_defaults(sources, _setting_names())
    assert [h for h in found if h not in OTHER_QUANTITY] == []
    assert sorted(set(OTHER_QUANTITY) - set(found)) == [], "stale OTHER_QUANTITY entries"


def test_the_scan_sees_a_planted_second_default():
    planted = {"capture.py": "def capture(data, *, batch_size: int = 8, dtype=None):\n"
                             "    pass\n",
               "cli.py": "p.add_argument('--ttt-steps', type=int, default=3)\n"
                         "p.add_argument('--api-key', default='EMPTY')\n"}
    assert restated_defaults(planted, _setting_names()) == [
        "capture.py:capture:batch_size", "cli.py:1:--ttt-steps"]


@pytest.mark.parametrize("argv,classes", COMMANDS, ids=[c[0][1] for c in COMMANDS])
def test_flags_are_generated_with_the_schema_defaults(argv, classes):
    args = build_parser().parse_args(argv)
    for cls in classes:
        assert settings.from_args(cls, args) == cls()


def test_a_flag_reaches_its_setting():
    args = build_parser().parse_args(["draft", "train", "--data", "d", "--target", "t",
                                      "--out", "o", "--lr", "0.5", "--ttt-steps", "2",
                                      "--max-steps", "7", "--device", "cpu"])
    cfg = settings.from_args(settings.TrainConfig, args)
    assert (cfg.lr, cfg.ttt_steps, cfg.max_steps, cfg.device) == (0.5, 2, 7, "cpu")
    assert cfg.warmup_ratio == settings.TrainConfig.warmup_ratio  # not a flag
    assert not hasattr(args, "warmup_ratio") and not hasattr(args, "log_every")
