"""Run a function on N tensor-parallel ranks: spawned processes, gloo, vLLM groups.

Each rank is a fresh ``spawn`` process that initialises vLLM's distributed
state exactly as a vLLM worker does (``init_distributed_environment`` then
``initialize_model_parallel``) over gloo on loopback, runs ``fn(rank, *args)``
and sends back its (picklable) result. Any rank's exception is re-raised in the
parent with that rank's traceback. ``fn`` must be importable (module level).
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import Any

from testkit.ports import free_port  # noqa: F401  (re-exported: callers import it here)


class RankFailed(RuntimeError):
    """A tensor-parallel rank raised; the message carries its traceback."""


def _rank_main(fn, rank, world, port, queue, args, kwargs, env) -> None:
    os.environ.update(env)
    try:
        import torch

        torch.set_num_threads(1)  # N ranks share a small CPU
        from testkit.vllm_cpu import cpu_config_without_triton_cpu, prepare_process

        prepare_process()
        from vllm.config import VllmConfig, set_current_vllm_config
        from vllm.distributed import (
            init_distributed_environment,
            initialize_model_parallel,
        )

        with cpu_config_without_triton_cpu():
            bare_config = VllmConfig()
        with set_current_vllm_config(bare_config):
            init_distributed_environment(
                world_size=world, rank=rank, local_rank=rank, backend="gloo",
                distributed_init_method=f"tcp://127.0.0.1:{port}",
            )
            initialize_model_parallel(tensor_model_parallel_size=world)
        result = fn(rank, *args, **kwargs)
        queue.put((rank, True, result))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        queue.put((rank, False, traceback.format_exc()))
    finally:
        try:
            from vllm.distributed import destroy_distributed_environment, destroy_model_parallel

            destroy_model_parallel()
            destroy_distributed_environment()
        except Exception:  # noqa: BLE001
            pass


def run_in_sequence(rank: int, scenarios: list[tuple[str, Callable[..., Any], tuple]]) -> dict:
    """Rank function for :func:`run_tp`: several scenarios in one rank set, in order.

    ``scenarios`` is ``(name, fn, args)`` triples, ``fn`` module-level; each runs as
    ``fn(rank, *args)`` and its result is returned under ``name`` (one spawn of the
    ranks instead of one per scenario: starting a rank costs a vLLM import). A
    scenario that tears the groups down (``destroy_model_parallel``) must come last.
    ``_seconds``: each scenario's wall time on this rank."""
    import time

    out: dict[str, Any] = {"_seconds": {}}
    for name, fn, args in scenarios:
        t0 = time.perf_counter()
        try:
            out[name] = fn(rank, *args)
        except BaseException as exc:
            raise RuntimeError(f"scenario {name!r} ({fn.__module__}.{fn.__qualname__}) "
                               "failed") from exc
        out["_seconds"][name] = round(time.perf_counter() - t0, 1)
    return out


def run_tp(
    fn: Callable[..., Any],
    tp_size: int,
    *args: Any,
    timeout: float = 600.0,
    env: dict[str, str] | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(rank, *args, **kwargs)`` on ``tp_size`` ranks; results by rank."""
    import multiprocessing as mp
    import queue as queue_mod

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    child_env = {"VLLM_TARGET_DEVICE": "cpu", "OMP_NUM_THREADS": "1",
                 "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
                 **(env or {})}
    procs = [
        ctx.Process(target=_rank_main,
                    args=(fn, r, tp_size, port, q, args, kwargs, child_env), daemon=True)
        for r in range(tp_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    try:
        for _ in range(tp_size):
            try:
                rank, ok, payload = q.get(timeout=timeout)
            except queue_mod.Empty:
                dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
                raise RankFailed(
                    f"TP={tp_size}: no result within {timeout:.0f} s "
                    f"(ranks exited abnormally: {dead or 'none'})") from None
            (results if ok else errors)[rank] = payload
            if errors:
                break
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 1)
            if p.is_alive():
                p.terminate()
    if errors:
        rank = min(errors)
        raise RankFailed(f"rank {rank} of TP={tp_size} failed:\n{errors[rank]}")
    return [results[r] for r in range(tp_size)]
