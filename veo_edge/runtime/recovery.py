"""The runtime's recovery clock: a thread that, every ``recover_interval_s``, tries the candidates ahead of
the active one again (back to the GPU once it is usable) and re-warms a standby whose fault may have
healed, so that neither ever waits on a batch or on the serving loop."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from veo_edge.runtime.state import short

__all__ = ["RecoveryClock"]

log = logging.getLogger("veo_edge.runtime")


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
