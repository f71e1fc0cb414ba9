"""Worker-side probes for :meth:`testkit.engine.Engine.rpc` (each runs on every TP rank as
``fn(worker, *args)`` through vLLM's ``collective_rpc``; results must pickle).

* :func:`collective_summary` / :func:`reset_collectives`: the plugin's live collective
  counter (``VLLM_KIMI_EXT_COUNT_COLLECTIVES``, :mod:`vllm_kimi_ext.comm.accounting`):
  calls per ``(group, phase, op)`` and the model-runner steps counted since the reset;
* :func:`sharded_verify_counters`: what :mod:`vllm_kimi_ext.integration.sharded_verify`
  counts in this process (sharded steps, fallbacks by reason, graph replays and uncaptured
  steps by reason, escalated rows);
* :func:`perturb_draft` / :func:`restore_draft`: a rank-local change of the draft's
  weights (the test hook of the draft-TP-1 tests: one rank's draft differs, so its own
  draft tokens would differ from rank 0's);
* :func:`runner_facts`: rank, TP size, speculator class, draft TP world size.
"""

from __future__ import annotations

from typing import Any


def _runner(worker: Any) -> Any:
    return worker.model_runner


def rank_of(worker: Any) -> int:
    from vllm.distributed import get_tensor_model_parallel_rank

    return get_tensor_model_parallel_rank()


def runner_facts(worker: Any) -> dict:
    from vllm.distributed import get_tp_group

    runner = _runner(worker)
    spec = getattr(runner, "speculator", None)
    model = getattr(spec, "model", None)
    facts = {"rank": rank_of(worker), "tp": get_tp_group().world_size,
             "runner": type(runner).__name__, "speculator": type(spec).__name__,
             "has_compute_logits_local": hasattr(runner.model, "compute_logits_local")}
    if model is not None:
        # a draft built unsharded holds full-size weights: compare one parameter's size
        facts["draft_params"] = sum(p.numel() for p in model.parameters())
    return facts


def collective_summary(worker: Any) -> dict:
    """``{"steps": n, "calls": {(group, phase, op): calls}}`` since the last reset."""
    from vllm_kimi_ext.comm import accounting

    reporter = accounting._live.get("reporter")
    if reporter is None:
        raise RuntimeError("no live collective counter in this worker: start the engine "
                           "with VLLM_KIMI_EXT=1 and VLLM_KIMI_EXT_COUNT_COLLECTIVES=N")
    calls = {k: v[0] for k, v in reporter.counter.summary().items()}
    return {"steps": reporter.steps, "calls": calls, "rank": rank_of(worker)}


def reset_collectives(worker: Any) -> None:
    from vllm_kimi_ext.comm import accounting

    reporter = accounting._live["reporter"]
    reporter.counter.clear()
    reporter.steps = 0
    reporter._mark = 0


def sharded_verify_counters(worker: Any) -> dict:
    """The counters of the runner's one ``ShardedSampler`` (the plugin's only attribute on
    vLLM's runner; absent until the first sharded step or warm-up)."""
    from vllm_kimi_ext.integration.sharded_verify.sampler import ShardedSampler

    sampler = _runner(worker).__dict__.get(ShardedSampler.ATTR)
    if sampler is None:
        return {"rank": rank_of(worker), "steps": 0, "handed": 0, "fallbacks": {},
                "graphs": {"replayed": 0}, "device": {"escalated_rows": 0,
                                                      "deferred_requests": 0}}
    t = sampler.telemetry
    return {"rank": rank_of(worker), "steps": t.steps, "handed": t.handed,
            "fallbacks": dict(t.fallbacks.as_dict()), "graphs": sampler.graph_counts(),
            "device": t.device_counts()}


_SAVED = "_kimi_testkit_saved_draft"


def perturb_draft(worker: Any, rank: int, scale: float = 0.5, seed: int = 11) -> bool:
    """On TP rank ``rank`` only: add seeded noise of relative size ``scale`` to every
    floating-point parameter of the draft (originals kept for :func:`restore_draft`).
    Returns whether this rank changed its draft."""
    import torch

    if rank_of(worker) != rank:
        return False
    model = _runner(worker).speculator.model
    saved = {}
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dtype.is_floating_point:
                saved[name] = p.detach().clone()
                noise = torch.randn(p.shape, generator=g).to(p.dtype)
                p.add_(noise * scale * (p.detach().float().std().item() + 1e-3))
    setattr(worker, _SAVED, saved)
    return True


def restore_draft(worker: Any) -> bool:
    import torch

    saved = getattr(worker, _SAVED, None)
    if not saved:
        return False
    params = dict(_runner(worker).speculator.model.named_parameters())
    with torch.no_grad():
        for name, value in saved.items():
            params[name].copy_(value)
    setattr(worker, _SAVED, None)
    return True


def plugin_state(worker: Any) -> dict:
    """Whether this process's plugin registered (pin check passed) and which runtime
    patches it applied."""
    from vllm_kimi_ext import plugin
    from vllm_kimi_ext.patching import applied_patches

    return {"rank": rank_of(worker), "registered": bool(plugin._state["registered"]),
            "patches": sorted(applied_patches())}


def track_steps(worker: Any) -> None:
    """From now on, record the collectives of every model-runner step separately
    (:func:`step_collectives` reads them): wraps the live reporter's ``step_done``."""
    from vllm_kimi_ext.comm import accounting

    reporter = accounting._live["reporter"]
    reporter.counter.clear()
    reporter.steps = 0
    reporter._mark = 0
    marks: list[int] = []
    inner = type(reporter).step_done

    def step_done():
        marks.append(len(reporter.counter.calls))
        inner(reporter)

    reporter.step_done = step_done
    reporter._kimi_testkit_marks = marks


def step_collectives(worker: Any) -> list[dict]:
    """Per step since :func:`track_steps`: ``{phase: tp-group calls}``."""
    from vllm_kimi_ext.comm import accounting

    reporter = accounting._live["reporter"]
    calls, out, start = reporter.counter.calls, [], 0
    for end in reporter._kimi_testkit_marks:
        step: dict[str, int] = {}
        for c in calls[start:end]:
            if c.group == "tp":
                step[c.phase] = step.get(c.phase, 0) + 1
        out.append(step)
        start = end
    return out
