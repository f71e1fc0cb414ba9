"""What the cost model tells a user to type exists in vLLM 0.34.0: every serve command the
docs print parses with ``vllm serve``'s own argument parser, its ``--speculative-config``
keys are ``SpeculativeConfig`` fields and its attention backends are vLLM's; every what-if
row of kind "setting" names an environment variable vLLM reads or a ``SpeculativeConfig``
field.

Planted: a serve command with ``"draft_attention_backend"`` (not a field) fails
``test_serve_commands_parse``; a what-if setting ``VLLM_ALLREDUCE_USE_FLASHINFER_IPC=1``
(misspelt) fails ``test_what_if_settings_exist``.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def serve_parser():
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


def _spec_fields() -> set[str]:
    from vllm.config.speculative import SpeculativeConfig

    return {f.name for f in dataclasses.fields(SpeculativeConfig)}


def _commands() -> list[tuple[str, str]]:
    from vllm_kimi_ext.costmodel import load_draft
    from vllm_kimi_ext.costmodel.headline import headline, serve_command
    from vllm_kimi_ext.costmodel.model import Plan

    h = headline()
    out = [("headline", serve_command(h.plan, h.choice.option.requires))]
    if h.measure_next is not None:
        out.append(("measure", serve_command(h.measure_next.plan,
                                             h.measure_next.option.requires)))
    for name, placement in (("zlab-dflash", "tp8"), ("lightseek-eagle3", "tp8-repemb"),
                            ("lightseek-eagle3", "tp1")):
        plan = Plan(k=3, draft=load_draft(name), placement=placement, batch=1, context=1024,
                    backend="nccl", verifier="sharded")
        out.append((f"{name}/{placement}", serve_command(plan, ("x",))))
    docs = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
    for doc in docs:
        for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", (ROOT / doc).read_text(), re.S):
            for i, cmd in enumerate(_serve_lines(block)):
                out.append((f"{doc}#{len(out)}.{i}", cmd))
    return out


def _serve_lines(block: str) -> list[str]:
    """Each ``vllm serve`` command of a shell block, its continuation lines joined (a
    trailing backslash, or a quote still open)."""
    out, cur = [], None
    for line in block.splitlines():
        if cur is None:
            if re.match(r"^\s*(?:[A-Z_][A-Z0-9_]*=\S*\s+)*vllm serve\b", line):
                cur = line
            else:
                continue
        else:
            cur += "\n" + line
        if cur.endswith("\\") or cur.count("'") % 2:
            continue
        out.append(cur.rstrip("& "))
        cur = None
    return out


_COMMANDS = _commands()


@pytest.mark.parametrize("where,cmd", _COMMANDS, ids=[w for w, _ in _COMMANDS])
def test_serve_commands_parse(where, cmd, serve_parser):
    from vllm.config.speculative import SpeculativeConfig
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    words = shlex.split(cmd.replace("\\\n", " "), comments=True)
    words = words[words.index("serve") + 1:]
    args = serve_parser.parse_args(words)
    assert args.model_tag.endswith("Kimi-K2.5"), where
    if "#" in where and not args.speculative_config:
        return  # a plain serve (e.g. the target for regeneration): parsed, nothing more
    if where == "headline" or "attention-backend" in cmd:  # the recommendation pins it
        assert args.attention_backend in AttentionBackendEnum.__members__, where
    spec = args.speculative_config
    assert isinstance(spec, dict) and {"method", "model", "num_speculative_tokens"} <= set(spec)
    unknown = set(spec) - _spec_fields()
    assert not unknown, f"{where}: not SpeculativeConfig fields: {unknown}"
    if "attention_backend" in spec:  # the draft's own backend (draft-only override)
        assert isinstance(SpeculativeConfig._parse_attention_backend(spec["attention_backend"]),
                          AttentionBackendEnum)
    if spec["method"] == "dflash":
        assert spec.get("attention_backend") == "TRITON_ATTN", where


def test_what_if_settings_exist():
    import vllm.envs as envs

    from vllm_kimi_ext.costmodel.whatif import LEVERS

    fields = _spec_fields()
    for lever, _ in LEVERS:
        if lever.kind != "setting":
            continue
        names = re.findall(r"\b(VLLM_[A-Z0-9_]+)=", lever.action)
        keys = re.findall(r'"([a-z_]+)": ', lever.action)
        nccl = re.findall(r"\b(NCCL_[A-Z_]+)=", lever.action)
        assert names or keys or nccl, lever.key
        for name in names:
            assert name in envs.environment_variables, (lever.key, name)
        for key in keys:
            assert key in fields, (lever.key, key)
    # adaptive verification is DSpark-only in this vLLM, as the row says (its field's doc)
    import inspect

    from vllm.config.speculative import SpeculativeConfig

    assert SpeculativeConfig.__dataclass_fields__["enable_adaptive_verification"].default is False
    assert 'Currently only supported for method="dspark"' in inspect.getsource(SpeculativeConfig)
