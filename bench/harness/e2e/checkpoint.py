"""The ``@tiny`` model of an e2e config: a tiny Kimi-shaped checkpoint and EAGLE-3 head,
written on the fly (exercises the pipeline anywhere; its speed means nothing)."""

from __future__ import annotations

from pathlib import Path

from bench.harness.e2e.config import TINY, TINY_EAGLE3


def tiny_asset_paths(directory: str | Path) -> dict[str, str]:
    """Where :func:`write_tiny_assets` puts the ``@tiny`` placeholders (nothing is written)."""
    directory = Path(directory)
    return {TINY: str(directory / "tiny-kimi-k25-text"),
            TINY_EAGLE3: str(directory / "tiny-eagle3")}


def write_tiny_assets(directory: str | Path) -> dict[str, str]:
    """A tiny Kimi-K2.5 language model (text form, ``DeepseekV3ForCausalLM`` with the real
    config fields and a Kimi-format tokenizer) and a tiny EAGLE-3 head for it.

    The text form is used because vLLM's ``KimiK25ForConditionalGeneration`` also needs a
    vision preprocessor config to serve; the language model and its collectives are the
    same."""
    from testkit.checkpoints import (
        TinyKimiSpec,
        write_tiny_deepseek_v3,
        write_tiny_eagle3,
    )
    from testkit.tokenizers import write_kimi_tokenizer

    paths = tiny_asset_paths(directory)
    spec = TinyKimiSpec()
    model, eagle = Path(paths[TINY]), Path(paths[TINY_EAGLE3])
    if not (model / "model.safetensors").exists():
        write_tiny_deepseek_v3(model, spec)
        write_kimi_tokenizer(model, n_ranks=spec.num_ranks)
    if not (eagle / "model.safetensors").exists():
        write_tiny_eagle3(eagle, spec)
    return paths

