"""The engine tier's shared cases (``tests/engine``): one batch, draft kinds, references.

Every engine test compares an engine with speculation against the same engine without it,
on :data:`PROMPTS`: three requests that cross KV blocks (block 32) and finish at different
steps. Engines are expensive (seconds to start, 0.05-0.5 s per step), so greedy references
are computed once per process (:func:`reference`).
"""

from __future__ import annotations

import dataclasses

#: three requests: a repetitive one (ngram finds matches), a 33-token one (its prompt alone
#: crosses a 32-token block), a short one; different max_tokens, so they finish at
#: different steps, and 70 + 6 tokens cross two block boundaries.
PROMPTS = [[1, 5, 9, 5, 9, 5, 9, 5], list(range(3, 36)), [3, 4]]
MAX_TOKENS = [70, 40, 20]
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
        assert a == b, f"{what}: request {i} differs from token {first}: {a[first:first + 5]} " \
                       f"vs {b[first:first + 5]} without speculation"


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


def engine_collectives_per_step(summaries: list[dict]) -> dict[str, float]:
    """Per-step calls by phase from :func:`testkit.engine_probes.collective_summary` of
    every rank (asserts the ranks agree: SPMD)."""
    first = summaries[0]
    for other in summaries[1:]:
        assert other["calls"] == first["calls"] and other["steps"] == first["steps"], \
            f"ranks counted different collectives: {first} vs {other}"
    out: dict[str, float] = {}
    for (group, phase, _op), n in first["calls"].items():
        if group == "tp":
            out[phase] = out.get(phase, 0) + n / first["steps"]
    return out


#: one sampling filter per request, so each kept set is unambiguous (vLLM applies
#: temperature, then the filters)
SAMPLED = [
    {"max_tokens": MAX_TOKENS[0], "ignore_eos": True, "temperature": 0.7, "top_p": 0.8,
     "seed": 1},
    {"max_tokens": MAX_TOKENS[1], "ignore_eos": True, "temperature": 1.0, "top_k": 5,
     "seed": 2},
    {"max_tokens": MAX_TOKENS[2], "ignore_eos": True, "temperature": 1.0, "min_p": 0.2,
     "seed": 3},
]


def kept_set_violations(target_dir: str, prompts: list[list[int]], outputs: list[list[int]],
                        params: list[dict], eps: float = 1e-4) -> list[str]:
    """Every sampled token must lie in the target's kept set after temperature and the
    request's filter, recomputed independently: Hugging Face transformers' forward of the
    target on each request's prompt + generated tokens (one causal pass gives every
    prefix's next-token logits), float32. ``eps``: slack at the boundary for float
    differences between the two forwards (a token that is in only because of it is still
    reported if it is further out). Returns one line per violation."""
    import torch
    from transformers import LlamaForCausalLM

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
            elif "min_p" in p:
                ok = pt >= p["min_p"] * row.max().item() - eps
            else:
                raise ValueError(f"request {i}: no filter in {p}")
            if not ok:
                bad.append(f"request {i} token {j} ({tok}): p={pt:.4g}, params {p}")
    return bad
