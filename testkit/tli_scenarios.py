"""Tiny checkpoints for cross-tokenizer (``kimi_tli``) drafting tests.

:func:`write_retokenized_draft` writes a DeepSeek-V3-architecture draft that is
*the target's own language model* re-indexed for a different tokenizer: the
draft's rank file keeps the 256 single bytes, drops a fraction of the target's
multi-byte tokens, adds tokens the target does not have, and shuffles the ids;
special tokens keep Kimi's names at the draft's own ids.  Embedding and LM-head
rows are permuted accordingly (draft-only tokens get fresh rows).

So the draft computes exactly what the target computes whenever the context
maps exactly -- the case where a correct cross-tokenizer draft must agree with
the target on every shared token, and an unmapped one (draft ids read as target
ids) almost never does.  A constructed ground truth, not a coincidence of
random weights.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import torch

from .checkpoints import TinyKimiSpec, write_tiny_deepseek_v3
from .tokenizers import write_kimi_tokenizer, write_rank_file


@dataclasses.dataclass(frozen=True)
class RetokenizedDraft:
    path: Path
    n_ranks: int
    draft_to_target: dict[int, int]  # draft id -> target id, shared tokens only
    vocab_size: int


def write_tli_target(target_dir: str | Path) -> Path:
    """A tiny Kimi-K2.5 checkpoint with its Kimi-format tokenizer files."""
    from .checkpoints import write_tiny_kimi_k25

    write_tiny_kimi_k25(target_dir)
    write_target_tokenizer(target_dir)
    return Path(target_dir)


def write_target_tokenizer(target_dir: str | Path, spec: TinyKimiSpec | None = None) -> Path:
    """Kimi-format tokenizer files matching a tiny Kimi checkpoint's vocabulary."""
    spec = spec or TinyKimiSpec()
    return write_kimi_tokenizer(target_dir, n_ranks=spec.num_ranks)


def write_retokenized_draft(
    target_dir: str | Path,
    draft_dir: str | Path,
    *,
    spec: TinyKimiSpec | None = None,
    drop_fraction: float = 0.2,
    n_new: int = 160,
    seed: int = 1,
    dtype: torch.dtype = torch.bfloat16,
) -> RetokenizedDraft:
    """See the module docstring.  ``target_dir`` holds a tiny Kimi-K2.5 checkpoint
    (``write_tiny_kimi_k25``, written in ``dtype``) and its tokenizer
    (:func:`write_target_tokenizer`)."""
    from safetensors.torch import load_file, save_file

    from vllm_kimi_ext.tokenizers.loading import vocab_keys

    spec = spec or TinyKimiSpec()
    target_dir, draft_dir = Path(target_dir), Path(draft_dir)
    rng = random.Random(seed)
    t_keys = vocab_keys(target_dir)
    t_index = {k: i for i, k in enumerate(t_keys) if k is not None}
    singles = [bytes([b]) for b in range(256)]
    multi = [k for k in t_keys[:spec.num_ranks] if isinstance(k, bytes) and len(k) > 1]
    kept = [k for k in multi if rng.random() >= drop_fraction]
    new: list[bytes] = []
    while len(new) < n_new:
        tok = bytes(rng.randrange(97, 123) for _ in range(rng.randrange(4, 9))) + b"#"
        if tok not in t_index and tok not in new:
            new.append(tok)
    body = kept + new
    rng.shuffle(body)
    ranks = singles + body
    n_ranks = len(ranks)

    dspec = dataclasses.replace(spec, num_ranks=n_ranks)
    draft_dir.mkdir(parents=True, exist_ok=True)
    write_tiny_deepseek_v3(draft_dir, dspec, seed=seed + 100, dtype=dtype)
    write_kimi_tokenizer(draft_dir, n_ranks=n_ranks)
    write_rank_file(draft_dir / "tiktoken.model", ranks)

    d_keys = vocab_keys(draft_dir)
    d2t = {d: t_index[k] for d, k in enumerate(d_keys)
           if k is not None and k in t_index
           and not (isinstance(k, str) and k.startswith("<|reserved_token_"))}

    target = load_file(str(target_dir / "model.safetensors"))
    draft = load_file(str(draft_dir / "model.safetensors"))
    prefix = "language_model."
    for name in list(draft):
        src = target.get(prefix + name)
        if src is None:
            raise AssertionError(f"target has no {prefix + name}")
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            rows = draft[name].clone()
            d_ids = torch.tensor(sorted(d2t))
            rows[d_ids] = src[torch.tensor([d2t[d] for d in sorted(d2t)])]
            draft[name] = rows.contiguous()
        else:
            if src.shape != draft[name].shape:
                raise AssertionError(f"{name}: {tuple(src.shape)} vs {tuple(draft[name].shape)}")
            draft[name] = src.clone().contiguous()
    save_file(draft, str(draft_dir / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((draft_dir / "config.json").read_text())
    assert cfg["vocab_size"] == dspec.vocab_size
    return RetokenizedDraft(draft_dir, n_ranks, d2t, dspec.vocab_size)


def write_hf_bytelevel_tokenizer(directory: str | Path, tokens: list[bytes],
                                 added: dict[int, str] | None = None) -> Path:
    """A minimal Hugging Face ``tokenizer.json`` (byte-level BPE) with these
    regular tokens at ids ``0..len-1`` and ``added`` control tokens."""
    from vllm_kimi_ext.tokenizers.hf_json import gpt2_byte_decoder

    enc = {b: c for c, b in gpt2_byte_decoder().items()}
    vocab = {"".join(enc[b] for b in tok): i for i, tok in enumerate(tokens)}
    data = {
        "version": "1.0",
        "added_tokens": [{"id": i, "content": s, "special": True}
                         for i, s in sorted((added or {}).items())],
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False}]},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": []},
    }
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    return directory


# ------------------------------------------------------------- the vLLM speculator


def build_tli_speculator(target_dir: str | Path, draft_dir: str | Path, *,
                         num_speculative_tokens: int = 3,
                         draft_sample_method: str = "probabilistic", **spec_extra):
    """``(vllm_config, TLISpeculator)`` on CPU with its draft loaded by vLLM's
    ``get_model``, exactly as the GPU model runner builds it (``EngineArgs`` with
    ``method: kimi_tli`` -> ``VllmConfig`` -> speculator -> ``load_model``)."""
    from .vllm_cpu import ensure_single_rank, make_vllm_config, prepare_process

    prepare_process()  # the CPU platform, before vLLM is imported
    from vllm_kimi_ext import plugin
    from vllm_kimi_ext.integration.tli_speculator import TLISpeculator

    plugin.register_speculative_methods()
    ensure_single_rank()  # no-op inside run_tp ranks
    from vllm.distributed import get_tensor_model_parallel_world_size

    speculative_config = {
        "method": "kimi_tli", "model": str(draft_dir),
        "num_speculative_tokens": num_speculative_tokens,
        "draft_sample_method": draft_sample_method, **spec_extra}
    cfg = make_vllm_config(target_dir, speculative_config=speculative_config,
                           tensor_parallel_size=get_tensor_model_parallel_world_size())
    if spec_extra.get("draft_tensor_parallel_size") == 1:
        from .draft_scenarios import ensure_unsharded_tp_group

        ensure_unsharded_tp_group()  # as initialize_model_parallel does for this config
    return cfg, load_speculator(cfg, TLISpeculator)


def load_speculator(cfg, speculator_cls):
    """Build ``speculator_cls(cfg, cpu)`` and load its draft with vLLM's
    ``get_model``, as the GPU model runner does."""
    import torch

    from .vllm_cpu import cpu_config_without_triton_cpu, prepare_process

    prepare_process()  # the CPU platform, before vLLM is imported
    from vllm.config import set_current_vllm_config

    # vLLM's loader empties the accelerator cache after loading; there is none here.
    if not torch.accelerator.is_available():
        torch.accelerator.empty_cache = lambda: None
    with set_current_vllm_config(cfg), cpu_config_without_triton_cpu():
        spec = speculator_cls(cfg, torch.device("cpu"))
        spec.load_model(target_model=None)
    return spec


def gumbel_check(target_dir: str, draft_dir: str, rows: int = 48, seed: int = 0) -> dict:
    """The proposal the speculator hands vLLM's samplers, sampled by vLLM's own
    Triton Gumbel sampler, against the reference TLI distribution of
    :mod:`~vllm_kimi_ext.drafts.tli.cross_tokenizer` sampled by the same kernel with
    the same seeds and positions (shared random draws); plus the greedy path
    (``sample_draft`` without a logits cache).  Needs vLLM's Triton kernels
    runnable: on CPU, Triton's interpreter (``TRITON_INTERPRET=1`` with
    ``CUDA_VISIBLE_DEVICES=""`` so that vLLM keeps Triton enabled).  The
    logits-cache write of the probabilistic path does not run under the
    interpreter; ``bench/kernels/check_tli_vllm_kernels.py`` covers it on a GPU.
    Returns plain data for the caller to assert on."""
    import torch

    cfg, spec = build_tli_speculator(target_dir, draft_dir, draft_sample_method="greedy")
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.gpu.sample.gumbel import gumbel_sample

    maps = spec.tli_maps
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, spec.hidden_size, generator=g).to(cfg.model_config.dtype)
    temperature = torch.tensor([0.7, 1.0, 1.6], dtype=torch.float32).repeat(rows)[:rows]
    idx_mapping = torch.arange(rows, dtype=torch.int64)
    seeds = torch.arange(rows, dtype=torch.int64) + 11
    positions = torch.arange(rows, dtype=torch.int64) + 5
    step = torch.zeros((), dtype=torch.int64)
    with set_current_vllm_config(cfg), torch.no_grad():
        draft_logits = spec.model.compute_logits(hidden)
        proposal = spec.compute_draft_logits(hidden, 0)
        sampled = gumbel_sample(proposal, idx_mapping, temperature, seeds, positions,
                                apply_temperature=True, is_drafting=True)
        t = temperature.unsqueeze(1)
        q = maps.intersection.map_probs(torch.softmax(draft_logits.float() / t, dim=-1))
        reference = gumbel_sample(torch.log(q), idx_mapping, torch.ones(rows), seeds, positions,
                                  apply_temperature=False, is_drafting=True)
        q_proposal = torch.softmax(proposal.float() / t, dim=-1)
        greedy = spec.sample_draft(hidden, positions, idx_mapping, temperature, seeds, step, None)
        greedy_ref = maps.intersection.map_probs(torch.softmax(draft_logits.float(), -1)).argmax(-1)
    # the Triton kernel the speculator uses on CUDA, here under the interpreter
    from vllm_kimi_ext.drafts.tli._triton import gather_logits_triton
    from vllm_kimi_ext.drafts.tli.maps import gather_table, scatter_to_target

    triton_gather = gather_logits_triton(draft_logits.contiguous(),
                                         gather_table(maps.intersection))
    ref_logits = scatter_to_target(draft_logits, maps.shared_draft_ids,
                                   maps.shared_target_ids, maps.target_vocab_size)
    shared = set(maps.shared_target_ids.tolist())
    off = torch.ones(q.shape[1], dtype=torch.bool)
    off[maps.shared_target_ids] = False
    return {
        "sampled": sampled.tolist(),
        "reference": reference.tolist(),
        "sampled_all_shared": all(x in shared for x in sampled.tolist()),
        "proposal_vs_reference_max_abs": float((q_proposal - q).abs().max()),
        "proposal_zero_off_intersection": bool((q_proposal[:, off] == 0).all()),
        "greedy": greedy.tolist(),
        "greedy_reference": greedy_ref.tolist(),
        "distinct_sampled": len(set(sampled.tolist())),
        "triton_gather_equals_reference": bool(torch.equal(triton_gather, ref_logits)),
        "proposal_equals_reference": bool(torch.equal(proposal, ref_logits)),
    }


def _draft_group(spec):
    """The group the speculator drafts in (it enters it around ``propose``)."""
    import contextlib

    enter = getattr(spec, "draft_tp_context", None)
    return enter() if enter is not None else contextlib.nullcontext()


def _counted_tli_step(cfg, spec, rows: int):
    """One draft step of the speculator (``_run_model`` + ``compute_draft_logits``)
    over ``rows`` shared regular tokens, under the collective counter."""
    import torch
    from vllm.config import set_current_vllm_config

    import vllm_kimi_ext.runtime  # noqa: F401 - registers the patch CollectiveCounter installs
    from vllm_kimi_ext.comm import CollectiveCounter

    maps = spec.tli_maps
    ids = maps.shared_target_ids[maps.shared_target_ids < 1024][:rows]
    pos = torch.arange(rows) + 5
    with set_current_vllm_config(cfg), torch.no_grad():
        with CollectiveCounter() as cc, cc.phase("draft"), _draft_group(spec):
            proposal = spec.compute_draft_logits(
                spec._run_model(ids.to(torch.int32), pos, None, None, None), 0)
    return ids, pos, proposal, cc.summary()


def tli_draft_collectives(rank: int, target_dir: str, draft_dir: str, rows: int = 4) -> dict:
    """Rank function (``run_tp``): the collectives of one ``kimi_tli`` draft step --
    the speculator's ``_run_model`` (input projection + the draft's forward) and
    ``compute_draft_logits`` (logits + scatter onto target ids) -- next to the same
    draft's plain forward + ``compute_logits`` (what ``draft_model`` runs), both
    under the :class:`~vllm_kimi_ext.comm.CollectiveCounter`."""

    import vllm_kimi_ext.runtime  # noqa: F401 - registers the patch CollectiveCounter installs
    from vllm_kimi_ext.comm import CollectiveCounter

    from .vllm_cpu import compute_logits, run_forward

    cfg, spec = build_tli_speculator(target_dir, draft_dir)
    maps = spec.tli_maps
    hf = cfg.speculative_config.draft_model_config.hf_config
    ids, pos, proposal, tli_summary = _counted_tli_step(cfg, spec, rows)
    with CollectiveCounter() as plain_cc, plain_cc.phase("draft"):
        plain = compute_logits(spec.model, cfg, run_forward(spec.model, cfg,
                                                              maps.draft_inputs(ids), pos))
    sd = maps.shared_draft_ids
    return {
        "tli": tli_summary,
        "plain": plain_cc.summary(),
        "tokens": proposal.float().argmax(-1).tolist(),
        # the plain draft's restricted argmax, mapped to target ids by hand
        "plain_tokens_mapped": maps.intersection.map_draft_tokens(
            sd[plain.float()[:, sd].argmax(-1)]).tolist(),
        "num_layers": hf.num_hidden_layers,
        "hidden": hf.hidden_size,
        "draft_vocab": hf.vocab_size,
    }


# ----------------------------------------------------- a dense draft of another family

QWEN_STYLE_ADDED = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                    "<tool_call>", "</tool_call>")


@dataclasses.dataclass(frozen=True)
class TinyQwen3Draft:
    path: Path
    vocab_size: int
    num_hidden_layers: int
    hidden_size: int


def write_tiny_qwen3_draft(
    target_dir: str | Path,
    draft_dir: str | Path,
    *,
    num_hidden_layers: int = 2,
    hidden_size: int = 64,
    keep_fraction: float = 0.7,
    n_new: int = 200,
    seed: int = 5,
    dtype: torch.dtype = torch.bfloat16,
    same_tokenizer: bool = False,
) -> TinyQwen3Draft:
    """A tiny dense ``Qwen3ForCausalLM`` with a Hugging Face byte-level
    ``tokenizer.json`` of another family: the 256 single bytes, ``keep_fraction``
    of the Kimi target's multi-byte tokens and ``n_new`` tokens the target lacks,
    shuffled, then Qwen-style added tokens (some, like ``<|im_end|>`` and
    ``<think>``, also exist in Kimi's tokenizer under the same names).
    ``same_tokenizer``: copy the target's tokenizer files instead (a plain
    ``draft_model`` draft)."""
    from safetensors.torch import save_file

    from vllm_kimi_ext.tokenizers.loading import vocab_keys

    from .checkpoints import _init_tensor
    from .draft_scenarios import qwen3_layer_tensors

    draft_dir = Path(draft_dir)
    t_keys = vocab_keys(target_dir)
    if same_tokenizer:
        import shutil

        draft_dir.mkdir(parents=True, exist_ok=True)
        for name in ("tiktoken.model", "tokenizer_config.json", "tokenization_kimi.py"):
            if (Path(target_dir) / name).is_file():
                shutil.copyfile(Path(target_dir) / name, draft_dir / name)
        vocab = len(t_keys)
        bos, eos = t_keys.index("[BOS]"), t_keys.index("[EOS]")
    else:
        rng = random.Random(seed)
        t_bytes = {k for k in t_keys if isinstance(k, bytes)}
        multi = [k for k in t_keys if isinstance(k, bytes) and len(k) > 1]
        kept = [k for k in multi if rng.random() < keep_fraction]
        new: list[bytes] = []
        while len(new) < n_new:
            tok = b" " + bytes(rng.randrange(97, 123) for _ in range(rng.randrange(3, 8)))
            if tok not in t_bytes and tok not in new:
                new.append(tok)
        body = kept + new
        rng.shuffle(body)
        tokens = [bytes([b]) for b in range(256)] + body
        added = {len(tokens) + i: name for i, name in enumerate(QWEN_STYLE_ADDED)}
        vocab = len(tokens) + len(added)
        bos, eos = len(tokens), len(tokens) + 2  # <|endoftext|>, <|im_end|>
        write_hf_bytelevel_tokenizer(draft_dir, tokens, added)
    heads, kv_heads, head_dim, inter = 4, 2, 16, 96
    cfg = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": hidden_size, "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "intermediate_size": inter, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "max_position_embeddings": 4096, "vocab_size": vocab,
        "tie_word_embeddings": False, "attention_bias": False, "torch_dtype": "bfloat16",
        "bos_token_id": bos, "eos_token_id": eos,
    }
    (draft_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

    def names():
        yield "model.embed_tokens.weight", (vocab, hidden_size)
        yield "lm_head.weight", (vocab, hidden_size)
        yield "model.norm.weight", (hidden_size,)
        for i in range(num_hidden_layers):
            yield from qwen3_layer_tensors(f"model.layers.{i}", hidden_size, heads, kv_heads,
                                           head_dim, inter)

    gen = torch.Generator().manual_seed(seed)
    out = {n: _init_tensor(n, s, gen).to(dtype).contiguous() for n, s in names()}
    save_file(out, str(draft_dir / "model.safetensors"), metadata={"format": "pt"})
    return TinyQwen3Draft(draft_dir, vocab, num_hidden_layers, hidden_size)


def tli_placement_collectives(rank: int, target_dir: str, draft_dir: str,
                              rows: int = 4) -> dict:
    """Rank function (``run_tp``): one ``kimi_tli`` draft step of a dense draft,
    sharded like the target and with ``draft_tensor_parallel_size: 1``
    (collectives, greedy proposals, the draft's o_proj shape). Greedy drafting: the
    draft-TP-1 patches honor draft TP 1 only with it (ranks share draft tokens, not
    draft probabilities); ``tp1-probabilistic`` is the refused case (sharded, warned)."""
    from .draft_scenarios import _zero_attention

    out = {}
    cases = (("sharded", {"draft_sample_method": "greedy"}),
             ("tp1", {"draft_sample_method": "greedy", "draft_tensor_parallel_size": 1}),
             ("tp1-probabilistic", {"draft_sample_method": "probabilistic",
                                    "draft_tensor_parallel_size": 1}))
    for name, extra in cases:
        cfg, spec = build_tli_speculator(target_dir, draft_dir, **extra)
        _zero_attention(spec.model)  # deterministic tokens (metadata-free attention)
        _, _, proposal, summary = _counted_tli_step(cfg, spec, rows)
        out[name] = {
            "summary": summary,
            "tokens": proposal.float().argmax(-1).tolist(),
            "o_proj": tuple(dict(spec.model.named_parameters())[
                "model.layers.0.self_attn.o_proj.weight"].shape),
            "runs_unsharded": bool(getattr(spec, "draft_runs_unsharded", False)),
        }
    return out
