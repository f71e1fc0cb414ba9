"""vLLM 0.34.0's own config path reads a DFlash-shaped draft's RoPE attention factor both
ways: the published config (yarn factor 64, mscale = mscale_all_dim = 1) builds a rotary
embedding at factor 1.0, the copy ``vllm-kimi-ext draft rope-config`` writes at the
plain-YaRN factor 1.4159 (or the one given); which one the draft was trained with is
unknown. The config is read by
``vllm.transformers_utils.config.get_config`` and the rotary embedding built by
``vllm.model_executor.layers.rotary_embedding.get_rope`` with ``config.rope_parameters``,
as ``qwen3_dflash.py`` does. Canary: :func:`effective_attention_factor` (what the doctor
reports) must equal what vLLM builds; if 0.34.0's rules change, this fails and names it.

Planted bugs: ``write_copy`` writing the factor under a key vLLM ignores (``attn_factor``)
fails the first test ("assert 1.0 == 1.4158883083359672"); ``effective_attention_factor``
ignoring mscale / mscale_all_dim fails it on the stock config; the mscale ratio inverted
fails ``test_mscale_differing_from_mscale_all_dim``; README's DFlash A/B block serving the
download as its second arm fails the last test.
"""

from __future__ import annotations

import math

import pytest

from tests.unit.test_draft_rope_config import dflash_config, write_draft
from vllm_kimi_ext.drafts.rope_config import effective_attention_factor, write_copy

pytestmark = pytest.mark.vllm


def vllm_rotary_factor(path) -> tuple[float, dict]:
    """(the built rotary embedding's attention factor, the rope dict vLLM read)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope
    from vllm.model_executor.layers.rotary_embedding.yarn_scaling_rope import (
        YaRNScalingRotaryEmbedding,
    )
    from vllm.transformers_utils.config import get_config

    from testkit.vllm_cpu import cpu_config_without_triton_cpu

    cfg = get_config(str(path), trust_remote_code=False)
    with cpu_config_without_triton_cpu(), set_current_vllm_config(VllmConfig()):
        rope = get_rope(cfg.head_dim, max_position=cfg.max_position_embeddings,
                        rope_parameters=cfg.rope_parameters)
    assert isinstance(rope, YaRNScalingRotaryEmbedding)
    # the factor multiplies the cos/sin cache: check the built cache, not only the field
    cos_sin = rope.cos_sin_cache
    assert float(cos_sin[0, 0]) == pytest.approx(rope.mscale, rel=1e-6)
    return float(rope.mscale), dict(cfg.rope_parameters)


def test_mscale_differing_from_mscale_all_dim(tmp_path):
    draft = write_draft(tmp_path / "uneven", dflash_config(mscale=2.0))
    factor, rope = vllm_rotary_factor(draft)
    assert factor == pytest.approx((0.2 * math.log(64) + 1) / (0.1 * math.log(64) + 1))
    assert effective_attention_factor(rope)[0] == pytest.approx(factor)


def test_stock_config_runs_at_1_and_the_copy_at_the_plain_yarn_factor(tmp_path):
    draft = write_draft(tmp_path / "Kimi-K2.5-DFlash")
    stock, rope = vllm_rotary_factor(draft)
    assert stock == pytest.approx(1.0)
    assert effective_attention_factor(rope)[0] == pytest.approx(stock)

    out = tmp_path / "Kimi-K2.5-DFlash-rope-1.4159"
    write_copy(draft, out)
    trained, rope = vllm_rotary_factor(out)
    assert trained == pytest.approx(0.1 * math.log(64) + 1)
    assert effective_attention_factor(rope)[0] == pytest.approx(trained)

    chosen = tmp_path / "chosen"
    write_copy(draft, chosen, 1.2)
    assert vllm_rotary_factor(chosen)[0] == pytest.approx(1.2)


def test_without_mscale_vllm_uses_plain_yarn(tmp_path):
    cfg = dflash_config()
    del cfg["rope_scaling"]["mscale"], cfg["rope_scaling"]["mscale_all_dim"]
    draft = write_draft(tmp_path / "plain", cfg)
    factor, rope = vllm_rotary_factor(draft)
    assert factor == pytest.approx(0.1 * math.log(64) + 1)
    assert effective_attention_factor(rope)[0] == pytest.approx(factor)


def test_the_documented_dflash_commands_serve_both_factors(tmp_path):
    """The DFlash A/B block README.md prints, run as written (with /models moved under a
    temporary directory and the download replaced by a DFlash-shaped config): the first serve
    command's draft is the published checkpoint (vLLM builds it at 1.0), the second the copy
    rope-config writes, which vLLM builds at 1.4159."""
    import json
    import re
    import shlex
    from pathlib import Path

    from vllm_kimi_ext.cli import main

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", readme, re.S) if '"dflash"' in b]
    assert blocks, "README.md prints no DFlash serve command"
    lines = [ln.strip() for ln in blocks[0].splitlines()]
    root = str(tmp_path)
    download = next(ln for ln in lines if ln.startswith("huggingface-cli download"))
    downloaded = Path(shlex.split(download)[-1].replace("/models", root, 1))
    write_draft(downloaded)
    rope = next(ln for ln in lines if ln.startswith("vllm-kimi-ext draft rope-config"))
    argv = [w.replace("/models", root, 1) for w in shlex.split(rope)[1:]]
    assert main(argv) == 0
    specs = [json.loads(m) for m in re.findall(r"--speculative-config '(\{.*\})'", blocks[0])]
    assert len(specs) == 2
    assert specs[0]["model"] == shlex.split(download)[2]  # the published checkpoint
    assert vllm_rotary_factor(downloaded)[0] == pytest.approx(1.0)
    served = Path(specs[1]["model"].replace("/models", root, 1))
    assert served.is_dir() and served != downloaded
    # the printed factor is 1.4159, four decimals of 0.1 ln 64 + 1
    assert vllm_rotary_factor(served)[0] == pytest.approx(0.1 * math.log(64) + 1, abs=1e-4)
