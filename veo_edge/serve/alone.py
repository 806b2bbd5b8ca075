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
- only while the model's lone requests take at most ``max_ms`` (the median of its last ``window``, at
  least ``judged`` of them, wherever they ran): a larger model would hold the loop, and with it health
  checks and metrics, too long, and never runs there; one slow request (a busy machine, a profiler
  attaching) does not turn it off, as it did when a single one over the bound stopped it for good.
  ``max_ms`` 0 turns it off.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from typing import Any

log = logging.getLogger("veo_edge.serve")


class LoneRequests:
    """Whether the next lone request may run on the event loop's thread (see the module doc)."""

    def __init__(
        self, max_ms: float = 50.0, streak: int = 8, probe_every: int = 16, window: int = 5, judged: int = 3
    ) -> None:
        self.max_ms = max_ms
        #: inference requests in progress, over every model and transport of the server
        self.in_progress = 0
        self.streak_needed = streak
        self.probe_every = probe_every
        self.streak = 0
        self.judged = judged
        self._window = window
        self._recent: dict[str, deque[float]] = {}  # model -> ms of its last lone requests
        self._too_slow: set[str] = set()  # models whose lone requests are over max_ms now (logged once)
        self._begun = 0
        self._count = 0

    def begin(self) -> tuple[float, int] | None:
        """An inference request began: pass what this returns to :meth:`end` when it is answered."""
        alone = not self.in_progress
        self.streak = self.streak + 1 if alone else 0
        self.in_progress += 1
        self._begun += 1
        return (time.perf_counter(), self._begun) if alone else None

    def end(self, model: str, began: tuple[float, int] | None) -> None:
        """The request ``began`` (of ``model``) is answered; a lone one (nothing else began meanwhile)
        counts its time."""
        self.in_progress -= 1
        if began is not None and began[1] == self._begun:
            ms = (time.perf_counter() - began[0]) * 1e3
            self._recent.setdefault(model, deque(maxlen=self._window)).append(ms)

    def run(self, runtime: Any, x: Any, arrival: Any, model: str) -> list[Any] | None:
        """Request ``x`` (one sample of ``model``) run here, on the event loop's thread, when allowed and
        the runtime takes it (:meth:`veo_edge.Runtime.run_alone`): its resolved future; ``None``: submit
        it."""
        if len(x) != 1 or not self.on_loop(model):
            return None
        done = runtime.run_alone(x[0], arrival)
        return None if done is None else [done]

    def on_loop(self, model: str) -> bool:
        """Whether this request (one sample of ``model``, nothing else in progress) may run on the loop."""
        if self.max_ms <= 0 or self.streak < self.streak_needed or not self._fast(model):
            return False
        self._count += 1
        return self._count % self.probe_every != 0  # a probe: through the batcher, the loop free

    def _fast(self, model: str) -> bool:
        recent = self._recent.get(model, ())
        if len(recent) < self.judged:
            return False
        ms = statistics.median(recent)
        if ms <= self.max_ms:
            self._too_slow.discard(model)
            return True
        if model not in self._too_slow:
            self._too_slow.add(model)
            log.warning(
                "model %r: lone requests take %.1f ms (median of the last %d), over --lone-max-ms %g: they "
                "go through the batcher and leave the event loop free",
                model,
                ms,
                len(recent),
                self.max_ms,
            )
        return False
