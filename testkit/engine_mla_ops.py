"""A plain-torch stand-in for the one compiled op vLLM 0.34.0's ``CPU_MLA`` backend calls.

The CPU platform picks ``CPU_MLA`` for MLA models (Kimi-K2.5, DeepSeek-V3) when the host
has no AMX tiles (``vllm/platforms/cpu.py:157-187``) and forces ``block_size=16``
(``vllm/platforms/cpu.py:263-297``). The backend
(``vllm/v1/attention/backends/mla/cpu_mla.py``) writes its KV cache in torch
(``do_kv_cache_update``), runs prefill with SDPA (the ``CPU_SDPA_MLA`` prefill backend),
and for decode calls ``_cpu_ops.mla_decode_kvcache_cpu`` (``cpu_mla.py:182-189``), a
wrapper of ``torch.ops._C.mla_decode_kvcache`` (``vllm/_cpu_ops.py:25-33``). The
``empty`` build has no ``vllm._C``, so this module registers that op with the schema of
``csrc/cpu/torch_bindings.cpp:1032-1036``::

    mla_decode_kvcache(Tensor! out, Tensor query, Tensor kv_cache, float scale,
                       Tensor block_tables, Tensor seq_lens) -> ()

Its contract, read from ``csrc/cpu/mla_decode.cpp:247-392``:

* ``query``: ``[num_seqs, num_heads, head_dim]`` (``head_dim`` = ``kv_lora_rank +
  qk_rope_head_dim``: the absorbed nope part then the rope part, ``cpu_mla.py:166-171``);
* ``kv_cache``: ``[num_blocks, block_size, head_dim]``: one latent row per token
  (``kv_c_normed`` in the first ``kv_lora_rank`` columns, ``k_pe`` in the rest,
  ``cpu_mla.py:197-223``); the keys are whole rows, the values their first
  ``v_head_dim = out.size(2)`` columns (``mla_decode.cpp:117-121``: V is read from the
  same row);
* ``block_tables``: ``[num_seqs, max_blocks]`` int32; ``seq_lens``: ``[num_seqs]`` int32
  (the query's own token included: decode attends to every cached token, no causal mask
  within a sequence);
* ``out[s, h] = softmax(scale · q[s, h] · K_sᵀ) · V_s`` over the first ``seq_lens[s]``
  tokens of sequence ``s`` read through its block table, accumulated in float32
  (``mla_decode.cpp:66-121``) and stored in ``out``'s dtype.

The compiled kernel only instantiates ``head_dim 576, v_head_dim 512, block_size 16``
(``mla_decode.cpp:382-387``; anything else raises "Unsupported block size"), i.e.
Kimi-K2.5's ``kv_lora_rank 512 + qk_rope_head_dim 64``; the stand-in refuses the same,
so a tiny test model must keep those two dims (``CPUMLABackend.get_supported_head_sizes``
is ``[576]`` too). The stand-in is checked against a dense per-token reference in
``tests/engine/test_kimi_target_engine.py``.
"""

from __future__ import annotations

import torch

from testkit.cpu_stand_ins import has_c_op

#: The only shape the compiled kernel instantiates (``csrc/cpu/mla_decode.cpp:382``).
KERNEL_HEAD_DIM, KERNEL_V_HEAD_DIM, KERNEL_BLOCK_SIZE = 576, 512, 16
SCHEMA = ("mla_decode_kvcache(Tensor! out, Tensor query, Tensor kv_cache, float scale, "
          "Tensor block_tables, Tensor seq_lens) -> ()")

_LIB: list[torch.library.Library] = []
#: calls per op in this process (read back from engine workers by the engine tests, to
#: show the engine's decode path went through the stand-in)
CALLS: dict[str, int] = {"mla_decode_kvcache": 0}


def stand_in_mla_decode_kvcache(out: torch.Tensor, query: torch.Tensor,
                                kv_cache: torch.Tensor, scale: float,
                                block_tables: torch.Tensor, seq_lens: torch.Tensor) -> None:
    """``torch.ops._C.mla_decode_kvcache`` in torch (contract: module docstring)."""
    CALLS["mla_decode_kvcache"] += 1
    num_seqs, _, head_dim = query.shape
    block_size, v_dim = kv_cache.shape[1], out.shape[2]
    if (head_dim, v_dim, block_size) != (KERNEL_HEAD_DIM, KERNEL_V_HEAD_DIM,
                                         KERNEL_BLOCK_SIZE):
        raise RuntimeError(f"Unsupported block size: {block_size} (stand-in: the compiled "
                           f"kernel only has head_dim {KERNEL_HEAD_DIM}, v_head_dim "
                           f"{KERNEL_V_HEAD_DIM}, block_size {KERNEL_BLOCK_SIZE}; got "
                           f"{head_dim}, {v_dim}, {block_size})")
    for s in range(num_seqs):
        n = int(seq_lens[s])
        blocks = block_tables[s, : (n + block_size - 1) // block_size].long()
        rows = kv_cache[blocks].reshape(-1, head_dim)[:n].float()
        probs = torch.softmax((query[s].float() @ rows.t()) * scale, dim=-1)
        out[s] = (probs @ rows[:, :v_dim]).to(out.dtype)


def install() -> list[str]:
    """Register the stand-in when the real op is absent (idempotent); returns the names
    registered now."""
    if has_c_op("mla_decode_kvcache"):
        return []
    lib = torch.library.Library("_C", "FRAGMENT")
    lib.define(SCHEMA)
    lib.impl("mla_decode_kvcache", stand_in_mla_decode_kvcache, "CPU")
    _LIB.append(lib)
    return ["mla_decode_kvcache"]
