"""Load: open loop (a fixed arrival rate) or closed loop (C clients), recorded into per-window
HdrHistograms so memory stays bounded whatever the duration.

Open loop measures each request's latency from its *scheduled* arrival, not from when a worker got to
it, so a stall shows as latency (no coordinated omission) rather than as a lower rate. Arrivals that
find the client's backlog full are recorded as errors (``backlog``), never silently skipped.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import numpy as np

from veo_edge.soak.targets import RequestError

#: latencies recorded from 1 us to 10 min, 3 significant digits
LOWEST_US, HIGHEST_US, SIG_FIGS = 1, 600_000_000, 3
#: error messages kept per window (counts are always complete)
ERRORS_KEPT = 5


def new_histogram():
    from hdrh.histogram import HdrHistogram

    return HdrHistogram(LOWEST_US, HIGHEST_US, SIG_FIGS)


def decode_histogram(encoded: str | bytes):
    from hdrh.histogram import HdrHistogram

    return HdrHistogram.decode(encoded)


class Recorder:
    """Outcomes of the current window; ``roll`` hands the window over and starts the next."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.in_flight = 0
        self.total_ok = 0
        self.total_errors = 0
        # two histograms for the whole run, swapped at each window: no allocation per window, and the
        # finished one is summarised outside the lock
        self._hist, self._spare = new_histogram(), new_histogram()
        self._reset()

    def _reset(self) -> None:
        self._issued = self._ok = self._errors = self._timeouts = 0
        self._messages: list[tuple[str, str]] = []

    def issue(self) -> None:
        with self._lock:
            self._issued += 1
            self.in_flight += 1

    def complete(self, latency_us: float, kind: str = "ok", message: str | None = None) -> None:
        with self._lock:
            self.in_flight -= 1
            if kind == "ok":
                self._ok += 1
                self.total_ok += 1
                self._hist.record_value(min(max(int(latency_us), LOWEST_US), HIGHEST_US))
                return
            self.total_errors += 1
            if kind == "timeout":
                self._timeouts += 1
            else:
                self._errors += 1
            if len(self._messages) < ERRORS_KEPT:
                self._messages.append((kind, message or kind))

    def roll(self, t0: float, t1: float) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """The finished window as a ``windows`` row, and its kept error messages."""
        with self._lock:
            h, self._hist = self._hist, self._spare
            issued, ok, errors, timeouts, messages = (
                self._issued,
                self._ok,
                self._errors,
                self._timeouts,
                self._messages,
            )
            self._reset()
        row = self._summary(h)
        h.reset()
        self._spare = h  # roll is called from one thread only
        row.update(t0=t0, t1=t1, issued=issued, ok=ok, errors=errors, timeouts=timeouts)
        return row, messages

    @staticmethod
    def _summary(h) -> dict[str, Any]:
        n = h.get_total_count()
        row: dict[str, Any] = {
            "samples": n,
            "hist": h.encode().decode() if n else None,
        }
        if n:
            row.update(
                p50_us=h.get_value_at_percentile(50.0),
                p90_us=h.get_value_at_percentile(90.0),
                p99_us=h.get_value_at_percentile(99.0),
                p999_us=h.get_value_at_percentile(99.9),
                max_us=h.get_max_value(),
                min_us=h.get_min_value(),
                mean_us=h.get_mean_value(),
            )
        return row


class LoadDriver:
    """Drive ``target.call(batch)`` open loop (``rate`` requests/s) or closed loop (``concurrency``)."""

    def __init__(
        self,
        target: Any,
        batch: np.ndarray,
        recorder: Recorder,
        *,
        rate: float | None = None,
        concurrency: int | None = None,
        workers: int = 32,
        max_backlog: int | None = None,
    ) -> None:
        self.target = target
        self.batch = batch
        self.recorder = recorder
        self.rate = rate
        self.concurrency = concurrency
        self.workers = workers if rate is not None else int(concurrency or 1)
        self.max_backlog = max_backlog or max(64, int((rate or 0) * 10))
        self._stop = threading.Event()
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._threads: list[threading.Thread] = []

    def start(self) -> LoadDriver:
        if self.rate is not None:
            self._spawn(self._schedule, "veo-soak-scheduler")
            for i in range(self.workers):
                self._spawn(self._open_worker, f"veo-soak-worker-{i}")
        else:
            for i in range(self.workers):
                self._spawn(self._closed_worker, f"veo-soak-client-{i}")
        return self

    def _spawn(self, fn, name: str) -> None:
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _one(self, started_ns: int) -> None:
        try:
            self.target.call(self.batch)
            kind, message = "ok", None
        except RequestError as e:
            kind, message = e.kind, str(e)
        except Exception as e:  # a bug or library error below the target: recorded, never fatal to the run
            kind, message = "error", f"{type(e).__name__}: {e}"
        self.recorder.complete((time.perf_counter_ns() - started_ns) / 1e3, kind, message)

    def _schedule(self) -> None:
        assert self.rate is not None
        period_ns = int(1e9 / self.rate)
        start = time.perf_counter_ns()
        k = 0
        while not self._stop.is_set():
            due = start + k * period_ns
            delay = (due - time.perf_counter_ns()) / 1e9
            if delay > 0 and self._stop.wait(delay):
                break
            self.recorder.issue()
            if self._queue.qsize() >= self.max_backlog:
                self.recorder.complete(0, "backlog", f"client backlog of {self.max_backlog} arrivals full")
            else:
                self._queue.put(due)
            k += 1
        for _ in range(self.workers):
            self._queue.put(None)

    def _open_worker(self) -> None:
        while True:
            due = self._queue.get()
            if due is None:
                return
            self._one(due)

    def _closed_worker(self) -> None:
        while not self._stop.is_set():
            self.recorder.issue()
            self._one(time.perf_counter_ns())

    def stop(self, timeout: float = 60.0) -> int:
        """Stop issuing, let every issued request finish (bounded by ``timeout``); returns those still
        in flight (0 after a clean drain)."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return self.recorder.in_flight
