"""A stand-in for ``vllm serve`` that speaks just enough of its HTTP surface for the e2e
runner's tests: ``/health``, ``/v1/models``, streamed ``/v1/chat/completions`` with usage,
``/metrics`` (behind a trailing-slash redirect, like vLLM's mount) with the spec-decode and
generation counters, and the plugin's ``collectives per step`` log lines on stdout.

Invoked as ``python bench/harness/fake_server.py <vllm serve argv>`` (stdlib only); it reads
``--port`` and ``--speculative-config`` and ignores the rest. Deterministic accounting, so
tests can check the runner's arithmetic:

* every request streams ``min(max_tokens, 12)`` one-token chunks;
* with a speculative config of k tokens, every 2 output tokens are one draft of k tokens
  with exactly position 0 accepted (acceptance length 2.0, per position [1, 0, ...]);
* each decode step logs ``target: 124.0 calls``, plus ``draft: 4.0 calls`` when speculating,
  from two "ranks" (``Worker_TP0``/``Worker_TP1``) - the runner must count one.

``FAKE_VLLM_FAIL=1`` in the environment makes it exit with a RuntimeError before listening.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKENS_PER_REQUEST = 12


class State:
    def __init__(self, k: int | None, model: str):
        self.k = k
        self.model = model
        self.lock = threading.Lock()
        self.generation = 0
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted = 0
        self.accepted_pos0 = 0

    def metrics(self) -> str:
        lab = f'engine="0",model_name="{self.model}"'
        out = ["# HELP vllm:generation_tokens_total Number of generation tokens processed.",
               "# TYPE vllm:generation_tokens_total counter",
               f"vllm:generation_tokens_total{{{lab}}} {float(self.generation)}",
               f"vllm:generation_tokens_created{{{lab}}} 1.7e9"]
        if self.k:
            out += [f"vllm:spec_decode_num_drafts_total{{{lab}}} {float(self.drafts)}",
                    (f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} "
                    f"{float(self.draft_tokens)}"),
                    (f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} "
                    f"{float(self.accepted)}")]
            for p in range(self.k):
                v = self.accepted_pos0 if p == 0 else 0
                out.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},'
                           f'position="{p}"}} {float(v)}')
        return "\n".join(out) + "\n"

    def account(self, n: int) -> None:
        with self.lock:
            self.generation += n
            steps = n
            if self.k:
                drafts = n // 2
                self.drafts += drafts
                self.draft_tokens += drafts * self.k
                self.accepted += drafts
                self.accepted_pos0 += drafts
                steps = n - drafts  # one step per draft, tokens = 2 per step
            body = "target: 124.0 calls 1,000 B"
            if self.k:
                body = "draft: 4.0 calls 100 B, " + body
            for rank in (0, 1):
                print(f"(Worker_TP{rank} pid={1000 + rank}) INFO vllm-kimi-ext collectives per "
                      f"step (last {steps} steps): {body}", flush=True)


def make_handler(state: State):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def _send(self, code: int, body: bytes, ctype: str = "application/json",
                  headers: dict | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                self._send(200, b"")
            elif self.path == "/v1/models":
                self._send(200, json.dumps({"data": [{"id": state.model}]}).encode())
            elif self.path == "/metrics":
                self._send(307, b"", headers={"Location": "/metrics/"})
            elif self.path == "/metrics/":
                self._send(200, state.metrics().encode(), "text/plain")
            else:
                self._send(404, b"{}")

        def do_POST(self):
            length = int(self.headers.get("Content-Length", 0))
            req = json.loads(self.rfile.read(length) or b"{}")
            if self.path != "/v1/chat/completions":
                self._send(404, b"{}")
                return
            n = min(int(req.get("max_tokens", TOKENS_PER_REQUEST)), TOKENS_PER_REQUEST)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for _ in range(n):
                chunk = {"choices": [{"index": 0, "delta": {"content": "tok"}}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.002)
            usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n}}
            self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
            self.wfile.flush()
            state.account(n)
            self.close_connection = True

    return Handler


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--speculative-config", default=None)
    ap.add_argument("--served-model-name", default=None)
    args, rest = ap.parse_known_args(argv)
    positional = [a for a in rest if not a.startswith("-")]
    model = args.served_model_name or (positional[-1] if positional else "fake")
    # "serve MODEL" (after -m vllm.entrypoints.cli.main) - take the word after "serve"
    if "serve" in rest and rest.index("serve") + 1 < len(rest):
        model = args.served_model_name or rest[rest.index("serve") + 1]
    print(f"fake vllm serve {model} on port {args.port}", flush=True)
    if os.environ.get("FAKE_VLLM_FAIL") == "1":
        print("Traceback (most recent call last):\n  File \"fake\", line 1\n"
              "RuntimeError: fake engine failed to start", flush=True)
        return 1
    k = None
    if args.speculative_config:
        k = int(json.loads(args.speculative_config).get("num_speculative_tokens", 1))
    time.sleep(0.5)  # the runner must poll for readiness
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(State(k, model)))
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
