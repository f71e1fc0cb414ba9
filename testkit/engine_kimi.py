"""Tiny Kimi-K2.5-shaped checkpoints for the engine tier, and an independent reference.

* :data:`ENGINE_KIMI`: a :class:`~testkit.checkpoints.TinyKimiSpec` whose MLA latent is
  Kimi-K2.5's own (``kv_lora_rank 512 + qk_rope_head_dim 64 = 576``, the only head size
  vLLM 0.34.0's ``CPU_MLA`` decode kernel has, see :mod:`testkit.engine_mla_ops`), with
  the rest tiny: hidden 64, 4 heads, 3 layers (1 dense + 2 MoE of 8 routed experts, top 2,
  1 shared expert, sigmoid routing with correction bias), vocab 1024 + 256 specials.
* :func:`write_kimi_target`: that model as a ``KimiK25ForConditionalGeneration``
  checkpoint (real tensor names, a vision tower the engine skips in text-only mode),
  float32, optionally with its MTP layer (``num_nextn_predict_layers: 1``).
* drafts for it: EAGLE-3 Llama-style and MLA heads (:func:`write_kimi_eagle3`), DFlash
  (:func:`write_kimi_dflash`), an MLA draft with another tokenizer for ``kimi_tli``
  (:func:`write_kimi_tli_pair`).
* :func:`hf_greedy`: greedy continuations of the same checkpoint computed by Hugging Face
  transformers' own ``DeepseekV3ForCausalLM`` (eager attention, per-expert loop): no vLLM
  code, so an engine that agrees with it token for token computes the model correctly.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import torch

from testkit.checkpoints import (
    TinyEagle3Spec,
    TinyKimiSpec,
    _dump_config,
    write_tiny_eagle3,
    write_tiny_kimi_k25,
)

ENGINE_KIMI = TinyKimiSpec(kv_lora_rank=512, qk_rope_head_dim=64)


def write_kimi_target(path: str | Path, *, with_mtp: bool = False, seed: int = 0) -> Path:
    """:data:`ENGINE_KIMI` as a float32 ``KimiK25ForConditionalGeneration`` checkpoint."""
    path = Path(path)
    if not (path / "model.safetensors").is_file():
        write_tiny_kimi_k25(path, ENGINE_KIMI, with_mtp=with_mtp, seed=seed,
                            dtype=torch.float32)
    return path


_SHARED: dict[str, Path] = {}


def shared_target(tmp_path_factory) -> Path:
    """One :func:`write_kimi_target` directory per test session, so every module's engines
    on it share one reference engine (:func:`reference` is keyed by the spec)."""
    if "target" not in _SHARED:
        _SHARED["target"] = write_kimi_target(tmp_path_factory.mktemp("engine-kimi") / "target")
    return _SHARED["target"]


def write_kimi_eagle3(path: str | Path, style: str, *, seed: int = 1) -> Path:
    """An EAGLE-3 head for :data:`ENGINE_KIMI` (``style``: ``llama`` or ``mla``), full
    vocabulary, two aux hidden states: the inputs of layers 1 and 2, named at the config's
    top level, where vLLM 0.34.0 reads them (``eagle3_utils.py:109``; inside
    ``eagle_config`` they are not seen). Without them vLLM taps its default
    ``(2, n // 2, n - 3)`` = ``(2, 1, 0)`` for 3 layers, and a tap at layer 0 adds a ``None``
    residual in ``DeepseekV2Model.forward`` (``deepseek_v2.py:1561-1562``): a TypeError."""
    path = Path(path)
    if not (path / "model.safetensors").is_file():
        head = TinyEagle3Spec(style=style, num_aux_hidden_states=2, aux_layer_ids=(1, 2))
        write_tiny_eagle3(path, ENGINE_KIMI, head, seed=seed, dtype=torch.float32)
        cfg = json.loads((path / "config.json").read_text())
        cfg["eagle_aux_hidden_state_layer_ids"] = list(head.aux_layer_ids)
        _dump_config(path, cfg)
    return path


def write_kimi_dflash(path: str | Path, *, seed: int = 3) -> Path:
    from testkit.draft_scenarios import write_tiny_dflash

    path = Path(path)
    if not (path / "model.safetensors").is_file():
        write_tiny_dflash(path, ENGINE_KIMI, seed=seed, dtype=torch.float32)
    return path


def write_kimi_tli_pair(target: str | Path, draft: str | Path) -> tuple[Path, Path]:
    """A ``kimi_tli`` draft with another tokenizer for ``target``: returns ``(target's
    tokenizer directory, draft)``. The tokenizer directory is a copy of the target (config,
    weights) with its Kimi-format tokenizer files; the target directory itself stays
    without them (with tokenizer files there, vLLM builds the multimodal processor for a
    ``KimiK25`` *draft* of it and a self-draft fails on the missing image processor). The
    draft is the target's own language model re-indexed for a different rank file
    (:func:`testkit.tli_scenarios.write_retokenized_draft`: 20 % of the target's multi-byte
    tokens dropped, 160 new ones, ids shuffled), MLA like the target, so it runs on
    ``CPU_MLA`` next to it."""
    import shutil

    from testkit.tli_scenarios import write_retokenized_draft, write_target_tokenizer

    target, draft = Path(target), Path(draft)
    tok = draft.parent / (draft.name + "-target-tokenizer")
    if not (tok / "tiktoken.model").is_file():
        tok.mkdir(parents=True, exist_ok=True)
        for name in ("config.json", "model.safetensors"):
            shutil.copyfile(target / name, tok / name)
        write_target_tokenizer(tok, ENGINE_KIMI)
    if not (draft / "model.safetensors").is_file():
        write_retokenized_draft(tok, draft, spec=ENGINE_KIMI, dtype=torch.float32)
    return tok, draft


# ---- the independent reference -----------------------------------------------------------

_EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")


def _hf_state_dict(path: Path, n_experts: int) -> dict[str, torch.Tensor]:
    """The checkpoint's language-model tensors in transformers' layout (experts stacked
    as ``gate_up_proj [E, 2·I, H]`` and ``down_proj [E, H, I]``)."""
    from safetensors.torch import load_file

    raw = {k.removeprefix("language_model."): v.float()
           for k, v in load_file(str(path / "model.safetensors")).items()
           if k.startswith("language_model.")}
    out = {k: v for k, v in raw.items() if not _EXPERT.match(k)}
    layers = sorted({int(m.group(1)) for k in raw if (m := _EXPERT.match(k))})
    for i in layers:
        pre = f"model.layers.{i}.mlp.experts."
        out[pre + "gate_up_proj"] = torch.stack([
            torch.cat([raw[f"{pre}{e}.gate_proj.weight"], raw[f"{pre}{e}.up_proj.weight"]])
            for e in range(n_experts)])
        out[pre + "down_proj"] = torch.stack([raw[f"{pre}{e}.down_proj.weight"]
                                              for e in range(n_experts)])
    return out


def hf_model(path: str | Path):
    """transformers' ``DeepseekV3ForCausalLM`` built from the checkpoint's text config,
    float32, every tensor loaded (strict)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    path = Path(path)
    text = dict(json.loads((path / "config.json").read_text())["text_config"])
    for key in ("model_type", "architectures"):
        text.pop(key, None)
    text["num_nextn_predict_layers"] = 0  # transformers has no MTP layer
    cfg = DeepseekV3Config(**text)
    cfg._attn_implementation = "eager"
    model = DeepseekV3ForCausalLM(cfg).float().eval()
    sd = _hf_state_dict(path, cfg.n_routed_experts)
    sd = {k: v for k, v in sd.items() if not k.startswith(f"model.layers.{cfg.num_hidden_layers}.")}
    model.load_state_dict(sd, strict=True)
    return model


@dataclasses.dataclass(frozen=True)
class Greedy:
    tokens: list[int]
    margins: list[float]  # top-1 minus top-2 logit at each step


def hf_greedy(path: str | Path, prompts: list[list[int]], max_tokens: list[int]) -> list[Greedy]:
    """Greedy continuations by transformers (one prompt at a time, KV cache on)."""
    model = hf_model(path)
    out = []
    with torch.no_grad():
        for prompt, n in zip(prompts, max_tokens):
            ids, past, toks, margins = torch.tensor([prompt]), None, [], []
            for _ in range(n):
                res = model(input_ids=ids, past_key_values=past, use_cache=True)
                past = res.past_key_values
                top = res.logits[0, -1].topk(2)
                toks.append(int(top.indices[0]))
                margins.append(float(top.values[0] - top.values[1]))
                ids = top.indices[:1].view(1, 1)
            out.append(Greedy(toks, margins))
    return out


# ---- engine runs on the Kimi target ------------------------------------------------------

#: three requests: a repetitive one (ngram finds matches), a 12-token one, a 2-token one;
#: different max_tokens so they finish at different steps. ``CPU_MLA`` forces 16-token KV
#: blocks (``vllm/platforms/cpu.py:290-297``): 7 + 40, 12 + 25 and 2 + 33 tokens cross 2 or 3
#: block boundaries each.
PROMPTS = [[5, 17, 300, 5, 17, 300, 5], [900, 3, 3, 250, 600, 11, 12, 13, 14, 15, 16, 400],
           [21, 22]]
MAX_TOKENS = [40, 25, 33]
GREEDY = [{"max_tokens": n, "ignore_eos": True} for n in MAX_TOKENS]
K = 3  # draft tokens per step
#: the engine arguments every Kimi run uses: text-only (the vision tower is not built)
KIMI_LLM_KWARGS = {"limit_mm_per_prompt": {"image": 0, "video": 0}}


def kimi_spec(model: str | Path, speculative_config: dict | None = None, **kw):
    """An :class:`~testkit.engine.EngineSpec` for a Kimi target (text-only)."""
    from testkit.engine import EngineSpec

    llm_kwargs = {**KIMI_LLM_KWARGS, **kw.pop("llm_kwargs", {})}
    return EngineSpec(model=str(model), speculative_config=speculative_config,
                      llm_kwargs=llm_kwargs, **kw)


@dataclasses.dataclass
class KimiRun:
    tokens: list[list[int]]
    finish: list[str | None]
    metrics: dict
    probes: dict
    seconds: dict  # start, generate
    log: str
    again: list[list[int]] | None = None  # :data:`AGAIN` in the same engine, if asked


#: a second batch for the same engine: the prompts in reverse order, 12 tokens each (the
#: greedy tokens must be a prefix of the first batch's: batch composition and slot reuse
#: must not change them)
AGAIN = 12


def run(spec, params: list[dict] | None = None, probes: dict | None = None,
        prompts: list[list[int]] | None = None, again: bool = False) -> KimiRun:
    """Start ``spec``, generate (default :data:`PROMPTS` / :data:`GREEDY`), read the engine's
    spec-decode metrics and ``probes`` (name -> ``module:function`` on every rank), with
    ``again`` generate :data:`AGAIN` tokens of the prompts in reverse order, stop."""
    import time

    from testkit.engine import Engine

    with Engine(spec) as eng:
        t0 = time.monotonic()
        outs = eng.generate(prompts or PROMPTS, params or GREEDY)
        gen = time.monotonic() - t0
        got = {name: eng.rpc(fn) for name, fn in (probes or {}).items()}
        metrics = eng.spec_metrics()
        rerun = None
        if again:
            rev = eng.generate((prompts or PROMPTS)[::-1], {"max_tokens": AGAIN,
                                                            "ignore_eos": True})
            rerun = [o.token_ids for o in rev][::-1]
        return KimiRun([o.token_ids for o in outs], [o.finish_reason for o in outs],
                       metrics, got, {"start": eng.start_seconds, "generate": gen},
                       eng.log(), rerun)


_REFERENCES: dict[str, KimiRun] = {}


def reference(spec) -> KimiRun:
    """Greedy output of ``spec`` without speculation (one engine per session and spec)."""
    plain = spec.without_speculation()
    key = repr(plain)
    if key not in _REFERENCES:
        _REFERENCES[key] = run(plain, probes={"calls": "testkit.engine_kimi:stand_in_calls"},
                               again=True)
    return _REFERENCES[key]


def stand_in_calls(worker) -> dict[str, int]:
    """Probe: calls of the MLA and MoE stand-ins in this worker process."""
    from testkit import cpu_stand_ins, engine_mla_ops

    return {**engine_mla_ops.CALLS, **cpu_stand_ins.CALLS}


def speculative(kind: str, drafts: dict[str, Path], **extra) -> dict | None:
    """vLLM's ``speculative_config`` for a draft kind on the Kimi target."""
    if kind == "none":
        return None
    if kind == "ngram":
        cfg: dict = {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    elif kind == "mtp":
        cfg = {"method": "mtp"}  # the MTP layer inside the target checkpoint
    elif kind in ("eagle3-llama", "eagle3-mla"):
        cfg = {"method": "eagle3", "model": str(drafts[kind])}
    elif kind == "self":
        cfg = {"method": "draft_model", "model": str(drafts["target"])}
    elif kind == "kimi_tli":  # a draft with another tokenizer (plugin on)
        cfg = {"method": "kimi_tli", "model": str(drafts[kind]),
               "speculator_options": {"draft_tokenizer": str(drafts[kind]),
                                      "target_tokenizer": str(drafts["kimi_tli-tokenizer"])}}
    else:
        cfg = {"method": kind, "model": str(drafts[kind])}
    return {**cfg, "num_speculative_tokens": K, **extra}
