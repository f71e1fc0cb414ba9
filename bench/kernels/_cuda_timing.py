"""CUDA timing helpers shared by the kernel benchmarks (not a benchmark itself:
``nox -s bench`` skips ``_``-prefixed files)."""

from __future__ import annotations

import statistics

import torch


def _elapsed_us(fn) -> float:
    """Device time of one call of ``fn`` between two CUDA events, in µs."""
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1000.0


def time_graph(calls, reps: int = 30, warmup: int = 3) -> dict:
    """Median per-call time (us) of a CUDA graph replaying ``calls`` back to back."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            for c in calls:
                c()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = [_elapsed_us(graph.replay) / len(calls) for _ in range(reps)]
    return {"median_us": statistics.median(times), "min_us": min(times),
            "max_us": max(times), "calls_per_graph": len(calls)}


def time_eager(fn, reps: int = 50) -> float:
    """Median µs of one eager call of ``fn`` (after 5 warm-up calls)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    return statistics.median(_elapsed_us(fn) for _ in range(reps))
