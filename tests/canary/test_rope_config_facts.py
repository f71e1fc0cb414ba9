"""Canary: the vLLM 0.34.0 facts behind ``vllm-kimi-ext draft rope-config``'s refusal of
DeepSeek / MLA heads (``vllm_kimi_ext.drafts.rope_config.DEEPSEEK_ROPE``) and its handling
of a config carrying both ``rope_scaling`` and ``rope_parameters``. When one fails after an
upgrade, revisit ``mla_reason`` / ``check_both_dicts`` and the cited file:line."""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.canary]


def _vllm_source(rel: str) -> str:
    """A file of the installed vLLM, read without importing it (the model modules are
    slow to import on a loaded 2-core box)."""
    root = Path(importlib.util.find_spec("vllm").submodule_search_locations[0])
    return (root / rel).read_text()


def _function(src: str, qualname: str) -> str:
    tree = ast.parse(src)
    parts = qualname.split(".")
    nodes = tree.body
    for name in parts:
        node = next(n for n in nodes if getattr(n, "name", None) == name)
        nodes = getattr(node, "body", [])
    return ast.get_source_segment(src, node)


def test_mla_attention_rewrites_a_yarn_rope_and_ignores_attention_factor():
    src = _function(_vllm_source("model_executor/models/deepseek_v2.py"),
                    "DeepseekV2MLAAttention.__init__")
    # the rewrite (deepseek_v2.py:1115-1120) and the mscale^2 softmax correction that only
    # deepseek_yarn keeps (deepseek_v2.py:1129-1136)
    assert '"deepseek_llama_scaling"\n' in src and 'get("attention_factor") == 1.0' in src
    assert 'else "deepseek_yarn"' in src and "self.scaling * mscale * mscale" in src
    # the DeepSeek branch of get_rope passes no attention_factor (__init__.py:284-299) ...
    get_rope = _function(_vllm_source("model_executor/layers/rotary_embedding/__init__.py"),
                         "get_rope")
    branch = get_rope.split('elif scaling_type in ["deepseek_yarn", "deepseek_llama_scaling"]',
                            1)[1].split("elif scaling_type", 1)[0]
    assert '"mscale_all_dim"' in branch and "attention_factor" not in branch
    # ... and the class takes none
    init = _function(_vllm_source(
        "model_executor/layers/rotary_embedding/deepseek_scaling_rope.py"),
        "DeepseekScalingRotaryEmbedding.__init__")
    assert "attention_factor" not in init


def test_transformers_keeps_rope_scaling_over_rope_parameters():
    from transformers import modeling_rope_utils

    src = inspect.getsource(modeling_rope_utils)
    assert "self.rope_parameters = rope_scaling or self.rope_parameters" in src
