"""A full copy of a sharded EAGLE / EAGLE-3 / MTP draft's input embedding on every rank.

A draft sharded like the target (vLLM's default) looks its input tokens up in a
vocab-parallel table, which ends in one all-reduce of ``[tokens, hidden]`` per
draft token. With ``VLLM_KIMI_EXT_REPLICATE_DRAFT_EMBEDDING=1`` the plugin gathers
the table once, after the draft is loaded, and gives the draft a whole copy built
with ``disable_tp=True``: its lookups need no collective (3 collectives per draft
token instead of 4 for a one-layer EAGLE-3 head), at ``(1 - 1/TP) x vocab x hidden``
more weights per rank (Kimi-K2.5, TP=8, bf16: 2240 MiB whole, +1960 MiB), logged.

Only the draft's reference is replaced: a target that shared its table with the
draft keeps its own shard. A draft built un-sharded (``draft_tensor_parallel_size:
1``) already holds a whole table and is left alone. Anything else the flag cannot
serve (no embedding, a quantized or LoRA-wrapped table) is refused by name when the
draft loads, not ignored. The runtime patch:
``vllm_kimi_ext/runtime/target_dependent_ar_speculator.py``.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm_kimi_ext import envs
from vllm_kimi_ext.user_input import UserInputError

logger = logging.getLogger("vllm_kimi_ext.draft_embedding")

#: speculative methods whose draft loads through vLLM's ``load_eagle_model``
EAGLE_FAMILY = ("eagle", "eagle3", "mtp")


class DraftEmbeddingError(UserInputError):
    """The flag asks for a replicated draft embedding this draft cannot have."""


def enabled(environ=None) -> bool:
    return bool(envs.REPLICATE_DRAFT_EMBEDDING.get(environ))


def compile_factor(factors: dict, environ=None) -> dict:
    """``factors`` plus a key when the flag is on: the draft's compiled graph loses
    its embedding all-reduce, so it must not share a compile cache entry with the
    sharded one."""
    if enabled(environ):
        factors["kimi_ext_replicated_draft_embedding"] = True
    return factors


def replicated_table(module: Any, what: str) -> Any:
    """A whole ``disable_tp=True`` copy of the vocab-parallel layer ``module``,
    gathered over the current tensor-parallel group (collective: every rank calls it)."""
    import torch
    from vllm.distributed import tensor_model_parallel_all_gather
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        VocabParallelEmbedding,
    )

    weight = getattr(module, "weight", None)
    if (type(module) not in (VocabParallelEmbedding, ParallelLMHead) or not isinstance(
            weight, torch.Tensor) or getattr(module, "quant_method", None) is not None and
            type(module.quant_method).__name__ != "UnquantizedEmbeddingMethod"):
        raise DraftEmbeddingError(
            f"{envs.REPLICATE_DRAFT_EMBEDDING.name}=1: cannot replicate the draft {what} "
            f"({type(module).__name__}): only an unquantized vocab-parallel table can be "
            "gathered; unset the variable")
    vocab, dim = module.org_vocab_size, module.embedding_dim
    full = weight.data
    if module.tp_size > 1:
        full = tensor_model_parallel_all_gather(weight.data, dim=0)
    with torch.device(weight.device):
        copy = type(module)(vocab, dim, params_dtype=weight.dtype, disable_tp=True)
    with torch.no_grad():
        copy.weight.zero_()
        copy.weight[:vocab].copy_(full[:vocab])
    return copy


def replicate(draft_model: Any, tp_size: int) -> bool:
    """Give ``draft_model`` (an EAGLE-family draft, ``draft_model.model.embed_tokens``)
    a whole input embedding; True when it did, False when there was nothing to do
    (``tp_size`` 1, or the table is whole already)."""
    inner = getattr(draft_model, "model", None)
    embed = getattr(inner, "embed_tokens", None)
    if embed is None:
        raise DraftEmbeddingError(
            f"{envs.REPLICATE_DRAFT_EMBEDDING.name}=1: the draft "
            f"{type(draft_model).__name__} has no model.embed_tokens on this rank; "
            "unset the variable")
    if tp_size == 1 or getattr(embed, "tp_size", 1) == 1:
        return False
    replica = replicated_table(embed, "input embedding")
    sharded_mib = embed.weight.numel() * embed.weight.element_size() / 2**20
    whole_mib = replica.weight.numel() * replica.weight.element_size() / 2**20
    logger.info("vllm-kimi-ext: replicated the draft input embedding on every rank: "
                "%.1f MiB per rank (+%.1f MiB over the %.1f MiB shard); one all-reduce "
                "fewer per draft token", whole_mib, whole_mib - sharded_mib, sharded_mib)
    del inner.embed_tokens  # a registered submodule: drop the (maybe shared) reference
    inner.embed_tokens = replica
    return True


def after_load(speculator: Any) -> None:
    """The speculator's draft is loaded: replicate its embedding when the flag is on
    and the method is an EAGLE-family one (refuse any other method by name)."""
    if not enabled():
        return
    spec = speculator.vllm_config.speculative_config
    method = getattr(spec, "method", None)
    if method not in EAGLE_FAMILY:
        raise DraftEmbeddingError(
            f"{envs.REPLICATE_DRAFT_EMBEDDING.name}=1 applies to the methods "
            f"{', '.join(EAGLE_FAMILY)}, not {method!r}; unset the variable")
    replicate(speculator.model, speculator.vllm_config.parallel_config.tensor_parallel_size)
