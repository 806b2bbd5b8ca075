"""The runtime's recovery clock: a thread that, every ``recover_interval_s``, tries the candidates ahead of
the active one again (back to the GPU once it is usable) and re-warms a standby whose fault may have
healed, so that neither ever waits on a batch or on the serving loop; and the backoff that spaces out
the attempts on a candidate that keeps failing them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from veo_edge.runtime.state import short

__all__ = ["BACKOFF_MAX", "Backoff", "RecoveryClock"]

log = logging.getLogger("veo_edge.runtime")

#: the longest wait between two attempts on one candidate, in recovery intervals (4 min at 30 s)
BACKOFF_MAX = 8


class Backoff:
    """When each candidate that failed an attempt (an activation, a warm-up, a recovery) may be tried
    again: ``base_s`` after its first failure, then twice as long after each further one, up to
    :data:`BACKOFF_MAX` times ``base_s``; a success forgets it. ``base_s=None``: never (nothing is kept).

    A GPU that is gone for good would otherwise be deserialized and warmed on every tick beside the
    traffic, for the server's life."""

    def __init__(self, base_s: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.base_s = base_s
        self._clock = clock
        self._at: dict[str, float] = {}
        self._failures: dict[str, int] = {}

    def failed(self, name: str) -> float | None:
        """Count a failed attempt on ``name``; returns the wait before the next one (None: never)."""
        if self.base_s is None:
            return None
        n = self._failures.get(name, 0)
        self._failures[name] = n + 1
        wait = self.base_s * min(2**n, BACKOFF_MAX)
        self._at[name] = self._clock() + wait
        return wait

    def clear(self, name: str) -> None:
        """``name`` succeeded, or will not be tried again: no wait, and the next failure starts over."""
        self._at.pop(name, None)
        self._failures.pop(name, None)

    def pending(self, name: str) -> bool:
        """``name`` failed and is to be tried again (now or later)."""
        return name in self._at

    def due(self, name: str) -> bool:
        """``name`` failed and its wait is over."""
        at = self._at.get(name)
        return at is not None and self._clock() >= at

    def waiting(self, name: str) -> bool:
        """``name`` failed and its wait is not over."""
        at = self._at.get(name)
        return at is not None and self._clock() < at


class RecoveryClock:
    """Call ``tick()`` every ``interval_s`` seconds on a daemon thread until :meth:`stop`; an exception
    from a tick is logged and the clock goes on."""

    def __init__(self, interval_s: float, tick: Callable[[], object]) -> None:
        self.interval_s = interval_s
        self._tick = tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="veo-edge-recovery", daemon=True)

    def start(self) -> RecoveryClock:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._tick()
            except Exception as e:  # a recovery that raised is tried again at the next tick
                log.warning("recovery attempt raised %s", short(f"{type(e).__name__}: {e}"))

    def stop(self, timeout: float | None = None) -> None:
        """End the clock; wait (up to ``timeout``) for a tick in progress."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
