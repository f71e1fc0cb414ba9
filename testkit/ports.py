"""A free loopback TCP port (stdlib only; imported by both :mod:`testkit.distributed`
and :mod:`testkit.vllm_cpu`, which therefore no longer import each other)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
