"""The load generator: streamed chat completions against the OpenAI-compatible API on
localhost, ``requests`` of them at a fixed concurrency, with TTFT / TPOT percentiles."""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from typing import Any

from bench.harness.common import first_line


def http_get(port: int, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    for _ in range(3):  # follow a trailing-slash redirect (/metrics -> /metrics/)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            if resp.status in (301, 302, 307, 308) and resp.getheader("Location"):
                loc = resp.getheader("Location")
                path = re.sub(r"^https?://[^/]+", "", loc)
                continue
            return resp.status, body
        finally:
            conn.close()
    return 599, b"too many redirects"


def one_request(port: int, model: str, prompt: str, *, max_tokens: int, temperature: float,
                ignore_eos: bool, timeout: float) -> dict[str, Any]:
    """One streamed chat completion; returns timings and the output token count."""
    body: dict[str, Any] = {
        "model": model, "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens, "temperature": temperature, "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return {"ok": False, "error": f"HTTP {resp.status}: {resp.read()[:200]!r}"}
        first = last = None
        chunks = 0
        usage = None
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            obj = json.loads(data)
            if obj.get("usage"):
                usage = obj["usage"]
            for ch in obj.get("choices") or []:
                delta = ch.get("delta") or {}
                if any(delta.get(k) for k in ("content", "reasoning_content", "reasoning")):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    chunks += 1
        end = time.perf_counter()
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return {"ok": False, "error": first_line(exc)}
    finally:
        conn.close()
    n_out = int(usage["completion_tokens"]) if usage and "completion_tokens" in usage else chunks
    return {
        "ok": True,
        "output_tokens": n_out,
        "ttft_s": (first - t0) if first else None,
        "tpot_s": ((last - first) / (n_out - 1)) if first and last and n_out > 1 else None,
        "latency_s": end - t0,
    }


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def run_level(port: int, model: str, prompts: list[str], *, concurrency: int, requests: int,
              max_tokens: int, temperature: float, ignore_eos: bool, time_limit_s: float,
              request_timeout_s: float) -> dict[str, Any]:
    """``requests`` requests at ``concurrency`` in flight (bounded by ``time_limit_s``:
    no request starts after it)."""
    lock = threading.Lock()
    state = {"next": 0}
    results: list[dict] = []
    start = time.perf_counter()
    deadline = start + time_limit_s

    def worker() -> None:
        while True:
            with lock:
                i = state["next"]
                if i >= requests or time.perf_counter() > deadline:
                    return
                state["next"] += 1
            r = one_request(port, model, prompts[i % len(prompts)], max_tokens=max_tokens,
                            temperature=temperature, ignore_eos=ignore_eos,
                            timeout=request_timeout_s)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    duration = time.perf_counter() - start
    ok = [r for r in results if r["ok"]]
    out_tokens = sum(r["output_tokens"] for r in ok)
    tpots = [r["tpot_s"] * 1e3 for r in ok if r.get("tpot_s") is not None]
    ttfts = [r["ttft_s"] * 1e3 for r in ok if r.get("ttft_s") is not None]
    lats = [r["latency_s"] for r in ok]

    def rnd(x: float | None, n: int = 3) -> float | None:
        return None if x is None else round(x, n)

    return {
        "requests": len(results),
        "completed": len(ok),
        "errors": len(results) - len(ok),
        "duration_s": round(duration, 3),
        "output_tokens": out_tokens,
        "output_tokens_per_s": rnd(out_tokens / duration if duration > 0 and ok else None),
        "tpot_ms_p50": rnd(_pct(tpots, 0.5)),
        "tpot_ms_p90": rnd(_pct(tpots, 0.9)),
        "ttft_ms_p50": rnd(_pct(ttfts, 0.5)),
        "latency_s_p50": rnd(_pct(lats, 0.5)),
        "stopped_by": "requests" if state["next"] >= requests else "time_limit",
        "error_samples": sorted({r["error"] for r in results if not r["ok"]})[:3],
    }

