"""The engine tier's shared cases (``tests/engine``): one batch, draft kinds, references.

Every engine test compares an engine with speculation against the same engine without it,
on :data:`PROMPTS`: three requests that cross KV blocks (block 32) and finish at different
steps. Engines are expensive (seconds to start, 0.05-0.5 s per step), so greedy references
are computed once per process (:func:`reference`).
"""

from __future__ import annotations

import dataclasses

#: three requests: a repetitive one (ngram finds matches; 8 + 40 tokens cross the first
#: 32-token block boundary), a 33-token one (its prompt crosses the first boundary, 33 + 34
#: tokens the second), a short one; different max_tokens, so they finish at different steps.
PROMPTS = [[1, 5, 9, 5, 9, 5, 9, 5], list(range(3, 36)), [3, 4]]
MAX_TOKENS = [40, 34, 12]
GREEDY = [{"max_tokens": n, "ignore_eos": True} for n in MAX_TOKENS]
K = 3  # draft tokens per step (num_speculative_tokens)


@dataclasses.dataclass
class Run:
    tokens: list[list[int]]
    metrics: dict
    extra: dict


def speculative(llama: dict, kind: str, **extra) -> dict | None:
    """vLLM's speculative_config for a draft kind of the tiny Llama target."""
    if kind == "none":
        return None
    if kind == "ngram":
        cfg = {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    elif kind == "self":
        cfg = {"method": "draft_model", "model": llama["target"]}
    else:
        cfg = {"method": kind, "model": llama[kind]}
    return {**cfg, "num_speculative_tokens": K, **extra}


def run_engine(spec, params=GREEDY, probes: dict | None = None,
               before: tuple[str, ...] = ()) -> Run:
    """Start ``spec``, call the ``before`` probes, generate :data:`PROMPTS`, read metrics
    and ``probes`` (name -> ``module:function`` for :meth:`Engine.rpc`), stop it."""
    from testkit.engine import Engine

    with Engine(spec) as eng:
        for fn in before:
            eng.rpc(fn)
        outs = eng.generate(PROMPTS, params)
        extra = {name: eng.rpc(fn) for name, fn in (probes or {}).items()}
        return Run([o.token_ids for o in outs], eng.spec_metrics(), extra)


_REFERENCES: dict = {}


def reference(spec) -> Run:
    """Greedy output of ``spec`` without speculation (computed once per session)."""
    plain = spec.without_speculation()
    key = repr(plain)
    if key not in _REFERENCES:
        _REFERENCES[key] = run_engine(plain)
    return _REFERENCES[key]


def assert_same_tokens(got: Run, want: Run, what: str) -> None:
    for i, (a, b) in enumerate(zip(got.tokens, want.tokens)):
        assert len(a) == MAX_TOKENS[i], f"{what}: request {i} has {len(a)} tokens"
        first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
        assert a == b, (f"{what}: request {i} differs from token {first}: {a[first:first + 5]} "
                       f"vs {b[first:first + 5]} without speculation")


def cost_model_collectives(*, target_layers: int, hidden: int, vocab: int, k: int,
                           draft_layers: int, placement: str, batch: int = 3) -> dict[str, int]:
    """Collectives per decode step by phase (``target``, ``verify``, ``draft``) that the
    cost model counts for a dense Llama-shaped target of ``target_layers`` layers (its
    MoE/MLA dimensions do not change any count) with a ``draft_layers``-layer Llama-style
    autoregressive draft at ``placement`` (``"tp8"``: sharded like the target, ``"tp1"``:
    whole on every rank), the stock verifier (``"gather"``). Uses the cost model's own
    step functions (``CostModel.target_pass`` / ``verification`` / ``draft_step``), count
    mode ``code`` (no unattributed per-step extra)."""
    import dataclasses as dc

    from vllm_kimi_ext.costmodel.catalog import load_draft, load_model
    from vllm_kimi_ext.costmodel.model import CostModel

    model = dc.replace(load_model(), num_layers=target_layers,
                       first_k_dense_replace=target_layers, hidden_size=hidden,
                       vocab_size=vocab)
    cm = CostModel.build(model=model, count_mode="code")
    base = load_draft("lightseek-eagle3")
    draft = dc.replace(base, architecture={**base.architecture, "num_layers": draft_layers,
                                           "hidden_size": hidden, "vocab_size": vocab})
    rows = batch * (k + 1)
    terms = (cm.target_pass(rows, batch, 64, "nccl") + cm.verification(rows, "gather", "nccl")
             + cm.draft_step(draft, k, batch, 64, placement, "full", "nccl"))
    out = {"target": 0, "verify": 0, "draft": 0}
    for t in terms:
        out[t.phase] = out.get(t.phase, 0) + int(t.collectives)
    return out


def engine_steps(per_rank: list[list[dict]]) -> list[dict[str, int]]:
    """Per-step ``{phase: calls}`` (``target``, ``verify``, ``draft``; missing = 0) from
    :func:`testkit.engine_probes.step_collectives` of every rank (asserts the ranks agree:
    SPMD)."""
    first = per_rank[0]
    for rank, other in enumerate(per_rank[1:], 1):
        assert other == first, f"rank {rank} counted other collectives than rank 0"
    return [{p: s.get(p, 0) for p in ("target", "verify", "draft")} | {
        p: n for p, n in s.items() if p not in ("target", "verify", "draft")} for s in first]


#: one sampling filter per request, so each kept set is unambiguous (vLLM applies
#: temperature, then the filters). min_p is not among them: vLLM 0.34.0 refuses it with
#: speculative decoding ("The min_p and logit_bias sampling parameters are not yet supported
#: with speculative decoding", ``SamplingParams._validate_spec_decode``).
SAMPLED = [
    {"max_tokens": MAX_TOKENS[0], "ignore_eos": True, "temperature": 0.7, "top_p": 0.8,
     "seed": 1},
    {"max_tokens": MAX_TOKENS[1], "ignore_eos": True, "temperature": 1.0, "top_k": 5,
     "seed": 2},
    {"max_tokens": MAX_TOKENS[2], "ignore_eos": True, "temperature": 0.6, "top_p": 0.95,
     "seed": 3},  # Kimi's "instant" setting
]


def kept_set_violations(target_dir: str, prompts: list[list[int]], outputs: list[list[int]],
                        params: list[dict], eps: float = 1e-4, model=None) -> list[str]:
    """Every sampled token must lie in the target's kept set after temperature and the
    request's filter, recomputed independently: Hugging Face transformers' forward of the
    target on each request's prompt + generated tokens (one causal pass gives every
    prefix's next-token logits), float32. ``eps``: slack at the boundary for float
    differences between the two forwards (a token that is in only because of it is still
    reported if it is further out). Returns one line per violation."""
    import torch
    from transformers import LlamaForCausalLM

    if model is None:  # another architecture passes its own transformers model
        model = LlamaForCausalLM.from_pretrained(target_dir, torch_dtype=torch.float32).eval()
    bad = []
    for i, (prompt, out, p) in enumerate(zip(prompts, outputs, params)):
        ids = torch.tensor([prompt + out])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1:len(prompt) - 1 + len(out)]
        probs = torch.softmax(logits / p.get("temperature", 1.0), dim=-1)
        for j, tok in enumerate(out):
            row = probs[j]
            pt = row[tok].item()
            if "top_k" in p:
                kth = torch.topk(row, p["top_k"]).values[-1].item()
                ok = pt >= kth - eps
            elif "top_p" in p:
                above = row[row > pt + eps].sum().item()  # mass strictly more likely
                ok = above < p["top_p"]
            else:
                raise ValueError(f"request {i}: no filter in {p}")
            if not ok:
                bad.append(f"request {i} token {j} ({tok}): p={pt:.4g}, params {p}")
    return bad
