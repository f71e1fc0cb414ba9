"""Plain-torch stand-ins that let vLLM 0.34.0's real engine run on a GPU-less x86 box.

What the ``empty`` build (no ``vllm._C``) lacks on the decoder path of vLLM's CPU
platform, and what stands in for it here (tests only; nothing in ``vllm_kimi_ext``
imports this module):

* ``CPU_ATTN`` (``vllm/v1/attention/backends/cpu_attn.py``) calls three wrappers of
  ``vllm/_cpu_ops.py`` through ``from vllm import _cpu_ops as ops`` (looked up at call
  time, so replacing the module attributes is enough):

  - ``cpu_attn_get_scheduler_metadata`` (``_cpu_ops.py:913``, called at
    ``cpu_attn.py:265``): an opaque work-split tensor the compiled kernel reads; the
    stand-in computes attention without one and returns an empty tensor.
  - ``cpu_attn_reshape_and_cache`` (``_cpu_ops.py:946``; ``cpu_attn.py:488``): writes
    token ``t``'s key/value to slot ``slot_mapping[t]`` = ``block * block_size +
    offset`` of the ``[blocks, kv_heads, block_size, head]`` key and value views of the
    ``[blocks, kv_heads, 2 * block_size, head]`` cache (``cpu_attn.py:485-487``: K in
    the first ``block_size`` rows, V in the next); a negative slot is padding and is
    skipped (``csrc/cpu/cpu_attn_amx.hpp:552-553``).
  - ``cpu_attention_with_kv_cache`` (``_cpu_ops.py:970``; ``cpu_attn.py:451``): for
    request ``i`` with queries ``query[qsl[i]:qsl[i+1]]`` and ``seq_lens[i]`` cached
    tokens (the queries' own included, they are the last ones), reads the keys and
    values through ``block_table[i]``; causal: query ``j`` of ``q`` sees the first
    ``seq_len - q + j + 1`` tokens; GQA by repeating kv heads; ``scale``; optional
    ``sliding_window`` (> 0), ``softcap`` (> 0) and ``alibi_slopes``; writes ``output``.
    Attention sinks (``s_aux``), ``dynamic_causal`` and fp8 caches are refused.
* ``CPUWorker.__init__`` calls ``torch.ops._C.init_cpu_memory_env([node])``
  (``vllm/v1/worker/cpu_worker.py:72``): registered here as a no-op op under
  ``CompositeExplicitAutograd`` (it has no tensor argument, so a ``CPU`` kernel would
  never be dispatched to).
* Triton 3.9's interpreter ``create_splat`` (``triton/runtime/interpreter.py``) builds
  the splatted tensor with the *source* scalar's type instead of the result type's
  element type, so e.g. splatting a constant into an ``int1`` block yields an
  ``int32`` "mask" that ``tl.load``/``tl.where`` then reject; vLLM's ngram speculator
  hits it. :func:`fix_triton_interpreter_splat` replaces that one method when (and
  only when) the installed interpreter has the bug (:func:`splat_bug_present`).
* Triton 3.9's interpreter runs ``tl.range`` as Python's ``range`` (loop variable a Python
  int, not an ``int32`` scalar), so vLLM's top-k/top-p kernel fails at ``row_id.to(...)``
  (``vllm/v1/sample/ops/topk_topp_triton.py:128``); :func:`fix_triton_interpreter_range`
  makes ``tl.range`` yield scalar tensors (only where the interpreter has the bug), so the
  kernel runs here (``tests/engine/test_triton_interpreter_range.py``).
* In the engine, :func:`install_top_k_top_p` still routes ``apply_top_k_top_p`` to vLLM's
  own exact torch implementation: the Triton kernel's nucleus is approximate (vLLM 0.34.0
  documents it), and the engine tests check every sampled token against the exact kept set.
* MLA targets (Kimi-K2.5, DeepSeek-V3) run ``CPU_MLA``, whose decode op is stood in by
  :mod:`testkit.engine_mla_ops`; their MoE layers call ``_C::cpu_fused_moe`` and
  ``_C::prepack_moe_weight``, stood in by :mod:`testkit.cpu_stand_ins`.

:func:`install` applies all of it (idempotent); :func:`register` is the
``vllm.general_plugins`` entry point (``testkit/engine_plugin``) that vLLM calls in
every process it starts, so TP workers get the stand-ins too.
"""

from __future__ import annotations

import os

import torch

from testkit.cpu_stand_ins import has_c_op

_STATE: dict[str, object] = {}


# ---- CPU_ATTN ------------------------------------------------------------------------


def stand_in_get_scheduler_metadata(num_reqs, num_heads, num_kv_heads, head_dim, seq_lens,
                                    dtype, query_start_loc, causal, sliding_window_size, isa,
                                    enable_kv_split, dynamic_causal=None,
                                    kv_cache_dtype="auto") -> torch.Tensor:
    if dynamic_causal is not None:
        raise NotImplementedError("engine_ops stand-in: dynamic_causal attention")
    if kv_cache_dtype not in ("auto", "bfloat16", "float16", "float32"):
        raise NotImplementedError(f"engine_ops stand-in: kv_cache_dtype {kv_cache_dtype!r}")
    return torch.empty(0, dtype=torch.uint8)


def stand_in_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, isa,
                               k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto") -> None:
    n = min(key.shape[0], slot_mapping.shape[0])
    slots = slot_mapping[:n].long()
    keep = slots >= 0
    slots = slots[keep]
    block_size = key_cache.shape[2]
    blocks, offsets = slots // block_size, slots % block_size
    # key_cache[b, :, o, :] for each token: advanced indexing on dims 0 and 2
    key_cache[blocks, :, offsets, :] = key[:n][keep].to(key_cache.dtype)
    value_cache[blocks, :, offsets, :] = value[:n][keep].to(value_cache.dtype)


def _gather_kv(cache: torch.Tensor, block_row: torch.Tensor, seq_len: int) -> torch.Tensor:
    """``[seq_len, kv_heads, head]`` of one request from its block-table row."""
    block_size = cache.shape[2]
    nblocks = (seq_len + block_size - 1) // block_size
    blocks = cache[block_row[:nblocks].long()]  # [nb, kvh, bs, hd]
    return blocks.permute(0, 2, 1, 3).reshape(nblocks * block_size, cache.shape[1],
                                               cache.shape[3])[:seq_len]


def stand_in_attention_with_kv_cache(query, key_cache, value_cache, output, query_start_loc,
                                     seq_lens, scale, causal, alibi_slopes, sliding_window,
                                     block_table, softcap, scheduler_metadata, s_aux,
                                     dynamic_causal=None, k_scale=1.0, v_scale=1.0,
                                     kv_cache_dtype="auto") -> None:
    if s_aux is not None or dynamic_causal is not None:
        raise NotImplementedError("engine_ops stand-in: attention sinks / dynamic_causal")
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    heads = query.shape[1]
    for i in range(len(lens)):
        lo, hi, seq_len = qsl[i], qsl[i + 1], int(lens[i])
        if hi <= lo:
            continue
        q = query[lo:hi].float()  # [nq, H, D]
        k = _gather_kv(key_cache, block_table[i], seq_len).float()  # [S, KVH, D]
        v = _gather_kv(value_cache, block_table[i], seq_len).float()
        rep = heads // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("qhd,shd->hqs", q, k) * scale
        if softcap and softcap > 0:
            scores = softcap * torch.tanh(scores / softcap)
        q_pos = torch.arange(seq_len - (hi - lo), seq_len)[:, None]  # absolute positions
        k_pos = torch.arange(seq_len)[None, :]
        if alibi_slopes is not None:
            scores = scores + alibi_slopes.float()[:, None, None] * (k_pos - q_pos)[None]
        allowed = torch.ones(hi - lo, seq_len, dtype=torch.bool)
        if causal:
            allowed &= k_pos <= q_pos
        if sliding_window is not None and sliding_window > 0:
            allowed &= k_pos > q_pos - sliding_window
        scores = scores.masked_fill(~allowed[None], float("-inf"))
        out = torch.einsum("hqs,shd->qhd", torch.softmax(scores, dim=-1), v)
        output[lo:hi] = out.reshape(output[lo:hi].shape).to(output.dtype)


def install_cpu_attn() -> list[str]:
    """Point the three ``vllm._cpu_ops`` CPU_ATTN wrappers at the stand-ins."""
    from vllm import _cpu_ops

    wanted = {
        "cpu_attn_get_scheduler_metadata": stand_in_get_scheduler_metadata,
        "cpu_attn_reshape_and_cache": stand_in_reshape_and_cache,
        "cpu_attention_with_kv_cache": stand_in_attention_with_kv_cache,
    }
    done = []
    for name, fn in wanted.items():
        if not hasattr(_cpu_ops, name):
            raise RuntimeError(f"vllm._cpu_ops has no {name}: the stand-ins target vLLM 0.34.0")
        if getattr(_cpu_ops, name) is not fn:
            setattr(_cpu_ops, name, fn)
            done.append(name)
    return done


# ---- _C::init_cpu_memory_env -----------------------------------------------------------


def install_init_cpu_memory_env() -> list[str]:
    if has_c_op("init_cpu_memory_env"):
        return []
    lib = torch.library.Library("_C", "FRAGMENT")
    lib.define("init_cpu_memory_env(int[] node_ids) -> ()")
    lib.impl("init_cpu_memory_env", lambda node_ids: None, "CompositeExplicitAutograd")
    _STATE["lib"] = lib  # a Library unregisters its ops when collected
    return ["init_cpu_memory_env"]


# ---- Triton interpreter create_splat -----------------------------------------------------


def _interpreter_builder():
    from triton.runtime import interpreter

    return interpreter, interpreter.InterpreterBuilder


def splat_bug_present() -> bool:
    """Does the installed interpreter splat ``int32`` data into an ``int1`` block type as
    ``int32``? (the result's element type must be the block type's)."""
    import numpy as np
    import triton.language as tl

    interpreter, builder_cls = _interpreter_builder()
    handle = interpreter.TensorHandle(np.array(1, dtype=np.int32), tl.int32)
    original = _STATE.get("original_splat", builder_cls.create_splat)
    out = original(builder_cls.__new__(builder_cls), tl.block_type(tl.int1, [4]), handle)
    return out.dtype != tl.int1 or out.data.dtype != np.dtype(bool)


def fix_triton_interpreter_splat() -> bool:
    """Make ``create_splat`` build its result with the result type's element type (only
    if the bug is present). Returns whether the method was replaced now."""
    import numpy as np

    interpreter, builder_cls = _interpreter_builder()
    if "original_splat" in _STATE or not splat_bug_present():
        return False
    _STATE["original_splat"] = builder_cls.create_splat

    def create_splat(self, ret_ty, arg):
        scalar = ret_ty.element_ty if hasattr(ret_ty, "element_ty") else arg.dtype.scalar
        value = arg.data[0] if arg.data.ndim else arg.data
        data = np.full(ret_ty.shape, value, dtype=interpreter._get_np_dtype(scalar))
        return interpreter.TensorHandle(data, scalar)

    builder_cls.create_splat = create_splat
    return True


def range_bug_present() -> bool:
    """Does the installed interpreter run ``tl.range`` as Python's ``range`` (its loop
    variable a Python ``int``, where compiled Triton gives an ``int32`` scalar tensor)?
    vLLM's top-k/top-p kernel then fails at ``row_id.to(tl.int64)``
    (``vllm/v1/sample/ops/topk_topp_triton.py:127-128``: "'int' object has no attribute
    'to'"), so no top-k / top-p request can be sampled in the engine on CPU."""
    import inspect

    from triton.runtime import interpreter

    core = _STATE.get("original_patch_lang_core", getattr(interpreter, "_patch_lang_core", None))
    return core is not None and "return range(start, end, step)" in inspect.getsource(core)


def fix_triton_interpreter_range() -> bool:
    """Make the interpreter's ``tl.range`` (not ``tl.static_range``, whose variable is a
    compile-time int) yield ``int32`` scalar tensors, as compiled Triton does (only if the
    bug is present). Returns whether the patch was installed now."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    if "original_patch_lang_core" in _STATE or not range_bug_present():
        return False
    original = _STATE["original_patch_lang_core"] = interpreter._patch_lang_core

    def tensor_range(arg1, arg2=None, step=None, **kwargs):
        start, end = (0, arg1) if arg2 is None else (arg1, arg2)
        for i in range(int(start), int(end), int(step or 1)):
            yield tl.tensor(interpreter.TensorHandle(np.array([i], dtype=np.int32), tl.int32),
                            tl.int32)

    def patch_lang_core(lang, scope):
        original(lang, scope)
        scope.set_attr(lang, "range", tensor_range)

    interpreter._patch_lang_core = patch_lang_core
    return True


# ---- top-k / top-p: vLLM's torch path instead of its Triton kernel ----------------------------


def install_top_k_top_p() -> bool:
    """vLLM's ``apply_top_k_top_p`` (``vllm/v1/sample/ops/topk_topp_sampler.py:198``) calls
    the Triton top-k/top-p kernel whenever Triton is present; under Triton 3.9's
    interpreter that kernel fails ("'int' object has no attribute 'to'",
    ``topk_topp_triton.py:1713``), so any top-k/top-p request breaks the engine on CPU.
    Point the module's ``apply_top_k_top_p_triton`` at vLLM's own exact torch
    implementation (``apply_top_k_top_p_pytorch``, what vLLM uses without Triton). Test
    harness only: the Triton kernel itself is a GPU-box matter. Returns whether it changed
    now."""
    from vllm.v1.sample.ops import topk_topp_sampler as ops

    triton_fn = getattr(ops, "apply_top_k_top_p_triton", None)  # imported only with Triton
    if triton_fn is None or getattr(triton_fn, "_kimi_testkit", False):
        return False

    def apply_top_k_top_p_torch(logits, k, p, has_topp_only_rows=True):
        return ops.apply_top_k_top_p_pytorch(logits, k, p, allow_cpu_sync=True)

    apply_top_k_top_p_torch._kimi_testkit = True
    ops.apply_top_k_top_p_triton = apply_top_k_top_p_torch
    return True


# ---- TP workers forked, not spawned ---------------------------------------------------------


def keep_worker_fork() -> bool:
    """vLLM's CPU platform forces ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` while it checks the
    config (``vllm/platforms/cpu.py:425``), so every TP worker imports vLLM afresh (tens of
    seconds on a loaded 2-core box). With ``KIMI_TESTKIT_WORKER_MP_METHOD=fork`` (set by
    :func:`testkit.engine.engine_env`) the method is put back to ``fork`` right after that
    check: workers are forked from the engine process, which has no model, no threads of
    its own work and no accelerator. Test harness only; returns whether it wrapped now."""
    if os.environ.get("KIMI_TESTKIT_WORKER_MP_METHOD") != "fork" or "cpu_check" in _STATE:
        return False
    from vllm.platforms.cpu import CpuPlatform

    original = CpuPlatform.check_and_update_config.__func__
    _STATE["cpu_check"] = original

    def check_and_update_config(cls, vllm_config):
        original(cls, vllm_config)
        if os.environ.get("KIMI_TESTKIT_WORKER_MP_METHOD") == "fork":
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
    return True


# ---- everything ---------------------------------------------------------------------------


def install() -> list[str]:
    """Every stand-in and fix above (idempotent); returns what was installed now."""
    from testkit import cpu_stand_ins, engine_mla_ops  # MLA decode, MoE (Kimi targets)

    done = (install_init_cpu_memory_env() + install_cpu_attn() + engine_mla_ops.install()
            + cpu_stand_ins.install())
    if os.environ.get("TRITON_INTERPRET") == "1" and fix_triton_interpreter_splat():
        done.append("triton create_splat")
    if os.environ.get("TRITON_INTERPRET") == "1" and fix_triton_interpreter_range():
        done.append("triton range")
    if install_top_k_top_p():
        done.append("top-k/top-p in torch")
    if keep_worker_fork():
        done.append("fork TP workers")
    return done


def register() -> None:
    """``vllm.general_plugins`` entry point (``testkit/engine_plugin``): vLLM calls it in
    every process it starts (engine core, each TP worker)."""
    install()
