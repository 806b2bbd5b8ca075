"""Loopback ports for the servers and engines the tests start."""

from __future__ import annotations

import contextlib
import random
import socket


def free_port(low: int | None = None, high: int | None = None) -> int:
    """A free loopback TCP port (in [low, high] when given: swarm's data-path port must be < 49152)."""
    if low is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    for port in random.sample(range(low, high + 1), 200):
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("127.0.0.1", port))
            return port
    raise RuntimeError(f"no free port in {low}..{high}")
