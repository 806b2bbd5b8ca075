"""Lone requests run on the event loop's own thread.

At one client a request finds the batcher idle, and handing its sample to a batching thread and the
answer back costs two thread wake-ups plus Python that runs several times slower right after a compute
(docs/benchmarks.md): on vit-tiny, 2 cores, running it on the loop's thread
(:meth:`veo_edge.Runtime.run_alone`) took 0.24 ms off each request at one client (paired). The loop is
blocked meanwhile, so it must not happen under concurrency, where the next request would wait unread
instead of running beside this one on another stream. :class:`LoneRequests` decides:

- a request runs on the loop only after ``streak`` requests in a row arrived with no other inference
  request in progress in the server (any model, over HTTP and gRPC alike), and only while the runtime's
  batcher is idle and its backends are steady (it refuses otherwise: no retry, switch or activation
  ever runs on the loop);
- every ``probe_every``-th of those goes through the batcher instead, leaving the loop free during its
  compute: a request that arrives meanwhile finds it in progress, which ends the streak. Concurrency
  that starts while requests run on the loop is therefore seen within ``probe_every`` requests;
- a lone compute that took more than ``max_ms`` stops it for good (a larger model would hold the loop,
  and with it health checks and metrics, too long); ``max_ms`` 0 turns it off.
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("veo_edge.serve")


class LoneRequests:
    """Whether the next lone request may run on the event loop's thread (see the module doc)."""

    def __init__(self, max_ms: float = 50.0, streak: int = 8, probe_every: int = 16) -> None:
        self.max_ms = max_ms
        #: inference requests in progress, over every model and transport of the server
        self.in_progress = 0
        self.streak_needed = streak
        self.probe_every = probe_every
        self.streak = 0
        self.too_slow = max_ms <= 0
        self._count = 0

    def begin(self) -> None:
        """An inference request began (call :meth:`end` when it is answered)."""
        self.streak = 0 if self.in_progress else self.streak + 1
        self.in_progress += 1

    def end(self) -> None:
        self.in_progress -= 1

    def run(self, runtime: Any, x: Any, arrival: Any) -> list[Any] | None:
        """Request ``x`` (one sample) run here, on the event loop's thread, when allowed and the runtime
        takes it (:meth:`veo_edge.Runtime.run_alone`): its resolved future; ``None``: submit it."""
        if len(x) != 1 or not self.on_loop():
            return None
        start = time.perf_counter()
        done = runtime.run_alone(x[0], arrival)
        if done is None:
            return None
        self.ran((time.perf_counter() - start) * 1e3)
        return [done]

    def on_loop(self) -> bool:
        """Whether this request (one sample, nothing else in progress) may run on the loop now."""
        if self.too_slow or self.streak < self.streak_needed:
            return False
        self._count += 1
        return self._count % self.probe_every != 0  # a probe: through the batcher, the loop free

    def ran(self, ms: float) -> None:
        """A request ran on the loop for ``ms``."""
        if ms > self.max_ms and not self.too_slow:
            self.too_slow = True
            log.warning(
                "a lone request held the event loop %.1f ms (over %.0f ms): lone requests go through the "
                "batcher from now on",
                ms,
                self.max_ms,
            )
