"""The draft's share of a speculative step: weights, KV reads, collectives, memory.

Autoregressive drafts (EAGLE-3, MTP, a standalone draft model) run ``k`` forwards, the
first over all ``B(k+1)`` verified positions and the rest over ``B`` tokens; a block
drafter (DFlash, DSpark) runs one forward over ``B(k+1)`` positions.

Placements (``Plan.placement``):

* ``tp8`` - sharded over the target's TP group, as stock vLLM 0.34 builds EAGLE/MTP drafts:
  each forward reads 1/TP of the draft and costs ``2L + 2`` collectives (embedding
  all-reduce, two all-reduces per layer, a local-argmax top-token gather);
* ``tp8-repemb`` - sharded, with its own full embedding table on every rank (this project's
  ``replicate-draft-embedding`` patch): ``2L + 1`` collectives, and the table costs
  ``(1 - 1/TP)`` of its size in memory per rank;
* ``tp1`` - replicated (the draft-TP-1 patches, ``patch_ids.DRAFT_TP1`` and for draft models
  ``DRAFT_MODEL_TP1``): every rank runs the whole draft, no collectives, but streams all of
  it (including its full head) on every rank and holds its own embedding table.

This module is imported by :mod:`.model`; it takes the :class:`~.model.CostModel` as an
argument and never imports it.
"""

from __future__ import annotations

from typing import Any

from vllm_kimi_ext.costmodel.catalog import DraftProfile
from vllm_kimi_ext.costmodel.terms import Term

PLACEMENTS = ("tp1", "tp8", "tp8-repemb")
#: Bytes each rank contributes per row to a draft's local-argmax top-token gather.
TOP_TOKEN_BYTES_PER_ROW_PER_RANK = 8
#: one draft token id as vLLM's speculators hold them (int64)
DRAFT_TOKEN_ID_BYTES = 8
#: Kernels of a small draft decoder layer and of a draft forward's head/embedding.
KERNELS_PER_LAYER = {"llama": 14, "mla": 18, "mla_moe": 24}
KERNELS_PER_FORWARD = 6
#: Kinds whose embedding the ``replicate-draft-embedding`` patch can replicate (the EAGLE
#: family in vLLM's loader).
REPLICABLE_EMBEDDING = ("eagle3", "eagle3_mla", "mtp")


def draft_tp(cm: Any, placement: str) -> int:
    return 1 if placement == "tp1" else cm.tp


def draft_vocab(cm: Any, draft: DraftProfile, vocab: str) -> int:
    if vocab == "full":
        return draft.vocab_size
    return min(draft.vocab_size, cm.model.reduced_draft_vocab_size)


def vocab_options(cm: Any, draft: DraftProfile) -> list[str]:
    """'reduced' only when it actually shrinks the draft's head."""
    if draft.vocab_size > cm.model.reduced_draft_vocab_size:
        return ["full", "reduced"]
    return ["full"]


def placement_options(draft: DraftProfile) -> list[str]:
    if draft.placements:
        return list(draft.placements)
    if draft.kind in REPLICABLE_EMBEDDING:
        return list(PLACEMENTS)
    return ["tp1", "tp8"]


def _llama_layers(draft: DraftProfile, h: int, layers: int, a: dict) -> tuple[float, float]:
    nh, nkv, hd = a["num_attention_heads"], a["num_key_value_heads"], a["head_dim"]
    attn = 0.0
    for i in range(layers):
        # EAGLE-3's first layer reads [embedding, hidden] (2h wide)
        qkv_in = 2 * h if (i == 0 and draft.kind == "eagle3") else h
        attn += qkv_in * (nh + 2 * nkv) * hd + nh * hd * h
    return attn, layers * 3 * h * a["intermediate_size"]


def parts(cm: Any, draft: DraftProfile, tp: int, vocab: str, n_tokens: float
          ) -> tuple[dict[str, tuple[float, float]], dict[str, float], float]:
    """Per-forward parts as {name: (bytes per GPU, flops per token)}, parts read once per
    step (EAGLE-3's fc), and the draft's KV-cache bytes per context token per GPU."""
    a, m = draft.architecture, cm.model
    b = m.dtype_bytes
    h = a.get("hidden_size", m.hidden_size)
    layers = draft.num_layers
    out: dict[str, tuple[float, float]] = {}
    once: dict[str, float] = {}
    kind = a.get("layer")
    if "weight_bytes" in a:  # published checkpoint size, all of it read every pass
        wb = float(a["weight_bytes"]) / tp
        out["layers (checkpoint bytes)"] = (wb, 2 * wb / b)
    elif kind == "llama":
        attn, mlp = _llama_layers(draft, h, layers, a)
        out["attention"] = (attn / tp * b, 2 * attn / tp)
        out["mlp"] = (mlp / tp * b, 2 * mlp / tp)
    elif kind in ("mla", "mla_moe"):
        rep = shd = 0.0
        for i in range(layers):
            r, s = m.mla_params(input_size=2 * h if (i == 0 and kind == "mla") else h)
            rep, shd = rep + r, shd + s
        out["attention (MLA)"] = ((rep + shd / tp) * b, 2 * (rep + shd / tp))
        if kind == "mla":
            mlp = layers * 3 * h * a["intermediate_size"]
            out["mlp"] = (mlp / tp * b, 2 * mlp / tp)
        else:
            ex = m.expert_params()
            out["router"] = (layers * m.router_params() * m.router_dtype_bytes,
                             2 * layers * m.router_params())
            out["shared expert"] = (layers * m.n_shared_experts * ex / tp * b,
                                    2 * layers * m.n_shared_experts * ex / tp)
            out["routed experts (INT4)"] = (
                layers * cm.distinct_experts(n_tokens) * ex / tp
                * m.routed_expert_bits_per_weight / 8,
                2 * layers * m.num_experts_per_tok * ex / tp)
            out["eh_proj (replicated)"] = (2 * h * h * b, 2 * 2 * h * h)
    else:
        raise ValueError(f"draft {draft.name}: unknown layer type {kind!r}")
    v = draft_vocab(cm, draft, vocab)
    out["lm_head"] = (v * h / tp * b, 2 * v * h / tp)
    if draft.kind in ("eagle3", "eagle3_mla"):
        once["fc (replicated)"] = a.get("num_aux_hidden_states", 3) * m.hidden_size * h * b
    if kind == "llama":
        nkv, hd = a["num_key_value_heads"], a["head_dim"]
        kv_tok = layers * 2 * nkv * hd * m.kv_cache_dtype_bytes / min(tp, nkv)
    else:
        kv_tok = layers * m.kv_latent_dim * m.kv_cache_dtype_bytes
    return out, once, kv_tok


def forward_bytes(cm: Any, draft: DraftProfile, placement: str, vocab: str,
                  n_tokens: float = 1) -> float:
    """Weight bytes one GPU streams in one draft forward (without the once-per-step fc)."""
    p, _, _ = parts(cm, draft, draft_tp(cm, placement), vocab, n_tokens)
    return sum(x[0] for x in p.values())


def forwards(draft: DraftProfile, k: int, batch: int) -> list[float]:
    """Tokens processed by each draft forward of one step."""
    if k == 0:
        return []
    n_all = batch * (k + 1)
    if draft.proposal == "one_pass":
        return [n_all]
    return [n_all] + [batch] * (k - 1)


def collectives_per_forward(draft: DraftProfile, placement: str) -> int:
    if placement == "tp1":
        return 0
    per_layer = 2 * draft.num_layers + 1  # two all-reduces per layer + top-token gather
    return per_layer if placement == "tp8-repemb" else per_layer + 1


def kv_bytes_per_token(cm: Any, draft: DraftProfile, placement: str) -> float:
    return parts(cm, draft, draft_tp(cm, placement), "full", 1)[2]


def _kv_read_factor(cm: Any, draft: DraftProfile) -> float:
    # MLA drafts run the target's MLA attention kernel, so its fitted context cost applies;
    # GQA drafts use FlashAttention-class kernels assumed to stream KV at bandwidth.
    return cm.params.kv_read_factor if draft.architecture.get("layer") != "llama" else 1.0


def step_terms(cm: Any, draft: DraftProfile, k: int, batch: int, context: int,
               placement: str, vocab: str, backend: str) -> list:
    """Terms of the draft phase of one step."""
    if k == 0:
        return []
    tp = draft_tp(cm, placement)
    m = cm.model
    terms: list = []
    kern_layer = KERNELS_PER_LAYER.get(draft.architecture.get("layer"), 14)
    for i, n in enumerate(forwards(draft, k, batch)):
        p, once, kv_tok = parts(cm, draft, tp, vocab, n)
        nbytes = sum(x[0] for x in p.values())
        flops = n * sum(x[1] for x in p.values())
        kernels = draft.num_layers * kern_layer + KERNELS_PER_FORWARD
        if i == 0 and once:
            fc = sum(once.values())
            nbytes += fc
            flops += 2 * n * fc / m.dtype_bytes
            kernels += 2
        terms.append(cm.compute("draft", f"forward {i + 1} weights ({n:g} tok)", nbytes, flops,
                                kernels))
        terms.append(cm.compute("draft", f"forward {i + 1} KV reads", batch * context * kv_tok,
                                0.0, read_factor=_kv_read_factor(cm, draft)))
        terms.append(Term("draft", f"forward {i + 1} fixed overhead",
                          time_s=cm.params.draft_forward_overhead_us * 1e-6))
        if tp > 1:
            h_bytes = n * draft.architecture.get("hidden_size", m.hidden_size) * m.dtype_bytes
            n_ar = collectives_per_forward(draft, placement) - 1
            what = "2/layer" if placement == "tp8-repemb" else "embedding + 2/layer"
            terms.append(cm.collective("draft", f"forward {i + 1} all-reduce ({what})",
                                       "allreduce", n_ar, h_bytes, backend))
            rows = batch if draft.proposal == "autoregressive" else batch * k
            per_rank = rows * TOP_TOKEN_BYTES_PER_ROW_PER_RANK
            terms.append(cm.collective("draft", f"forward {i + 1} top-token gather",
                                       "allgather", 1, per_rank * tp, "nccl",
                                       per_rank_bytes=per_rank))
    if tp == 1 and cm.tp > 1:
        # draft TP 1 (slugs eagle-draft-tp1, draft-model-tp1): each rank drafts with its
        # own whole copy, then all adopt rank 0's draft tokens, one broadcast of
        # [batch, k] int64 ids per step (spec_decode/unsharded_draft.py
        # agree_on_draft_tokens); counted in vLLM's engine
        # by tests/engine/test_llama_tp2.py. Priced as a tiny all-gather (NCCL).
        nbytes = batch * k * DRAFT_TOKEN_ID_BYTES
        terms.append(cm.collective("draft", "rank 0's draft tokens broadcast (draft TP 1)",
                                   "allgather", 1, nbytes, "nccl", per_rank_bytes=nbytes))
    return terms


def memory_bytes(cm: Any, draft: DraftProfile, placement: str, vocab: str) -> float:
    """Resident bytes of the draft per GPU (weights, plus embedding copies it needs)."""
    tp = draft_tp(cm, placement)
    m = cm.model
    p, once, _ = parts(cm, draft, tp, vocab, 1)
    total = sum(x[0] for x in p.values()) + sum(once.values())
    if "routed experts (INT4)" in p:  # resident: every expert, not the touched ones
        total -= p["routed experts (INT4)"][0]
        total += (draft.num_layers * m.n_routed_experts * m.expert_params() / tp
                  * m.routed_expert_bits_per_weight / 8)
    if draft.architecture.get("uses_target_lm_head") and vocab == "full" and tp > 1:
        total -= p["lm_head"][0]  # shares the target's resident head
    h = draft.architecture.get("hidden_size", m.hidden_size)
    embed = draft.architecture.get("embedding_vocab_size", m.vocab_size) * h * m.dtype_bytes
    if tp == 1:  # needs its own full embedding table (the target's is vocab-parallel)
        total += embed
    elif placement == "tp8-repemb":
        total += embed * (1 - 1 / tp)
    return total
