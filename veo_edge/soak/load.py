"""Load: open loop (a fixed arrival rate) or closed loop (C clients), recorded into per-window
HdrHistograms so memory stays bounded whatever the duration.

Open loop measures each request's latency from its *scheduled* send time, not from when a worker got to
it, so a stall shows as latency (no coordinated omission) rather than as a lower rate; closed loop
measures from the actual send. Either way an answer later than the timeout is a timeout, and a request
is sent with what is left of its timeout. Arrivals the client could not send (its backlog full, waiting
there past the timeout, or still queued at the end of the run) are counted as ``not_sent``, apart from
the server's errors: the offered rate was then not sustained.
"""

from __future__ import annotations

import math
import queue
import re
import threading
import time
from typing import Any

import numpy as np

from veo_edge.soak.targets import RequestError

#: latencies recorded from 1 us to 10 min, 3 significant digits
LOWEST_US, HIGHEST_US, SIG_FIGS = 1, 600_000_000, 3
#: error messages kept per window (counts are always complete; arrivals not sent are counted by reason,
#: each reason one message with its count)
ERRORS_KEPT = 5
#: the open loop's client backlog: arrivals of this many seconds, at most MAX_BACKLOG
BACKLOG_S, MAX_BACKLOG = 10.0, 100_000
#: the error kind of arrivals the client did not send
NOT_SENT = "not sent: client backlog"


def new_histogram():
    from hdrh.histogram import HdrHistogram

    return HdrHistogram(LOWEST_US, HIGHEST_US, SIG_FIGS)


def decode_histogram(encoded: str | bytes):
    from hdrh.histogram import HdrHistogram

    return HdrHistogram.decode(encoded)


_HTTP = re.compile(r"HTTP (\d{3})")
_EXC = re.compile(r"\b([A-Z][A-Za-z]*(?:Error|Exception|Disconnected|Timeout))\b")


def error_label(kind: str, message: str | None) -> str:
    """A short class of a failed request for ``error_kinds``: ``timeout``, ``error: HTTP 503``,
    ``error: ConnectionRefusedError``, ``error: malformed answer``, else ``error``."""
    if kind != "error" or not message:
        return kind
    m = _HTTP.search(message)
    if m:
        return f"error: HTTP {m.group(1)}"
    if message.startswith("malformed answer"):
        return "error: malformed answer"
    m = _EXC.search(message)
    return f"error: {m.group(1)}" if m else "error"


class Window:
    """One window's outcomes, gathered from the recorder at every sample tick (``Recorder.take_into``),
    so its row as it stands can be committed at each tick: a SIGKILL loses at most the last sample
    interval's counts, not a window's."""

    def __init__(self, t0: float) -> None:
        self.hist = new_histogram()
        self.start(t0)

    def start(self, t0: float) -> None:
        self.t0 = t0
        self.counts = dict(issued=0, ok=0, errors=0, timeouts=0, not_sent=0)
        self.kinds: dict[str, int] = {}  # errors and timeouts by ``error_label``
        self.why: dict[str, int] = {}  # arrivals not sent, by reason
        self.errors_kept = 0
        if self.hist.get_total_count():
            self.hist.reset()

    def row(self, t1: float, summary: bool = True) -> dict[str, Any]:
        """The window as a ``windows`` row ending at ``t1``; ``summary``: with its percentiles (a row
        rewritten at every tick leaves them to its last: they cost ~50 ms each)."""
        h = self.hist
        n = h.get_total_count()
        row: dict[str, Any] = {"samples": n, "hist": h.encode().decode() if n else None}
        if n and summary:
            row.update(
                p50_us=h.get_value_at_percentile(50.0),
                p90_us=h.get_value_at_percentile(90.0),
                p99_us=h.get_value_at_percentile(99.0),
                p999_us=h.get_value_at_percentile(99.9),
                max_us=h.get_max_value(),
                min_us=h.get_min_value(),
                mean_us=h.get_mean_value(),
            )
        row.update(t0=self.t0, t1=t1, **self.counts)
        row.update(kinds=dict(self.kinds) or None, not_sent_why=dict(self.why) or None)
        return row

    def not_sent_messages(self) -> list[tuple[str, str]]:
        """One ``backlog`` message per reason, with the window's count."""
        return [("backlog", f"{n} not sent: {why}") for why, n in self.why.items()]


class Recorder:
    """Outcomes since the last ``take_into``, which hands them to the current window.

    Every arrival is ``issue``d once and ends once: answered, an error, a timeout or not sent;
    ``pending`` is those not ended yet (in flight, or queued in the client's backlog)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pending = 0
        self.total_ok = 0
        self.total_errors = 0
        self.total_not_sent = 0
        # swapped with an empty one at each take: the answers' histogram is merged outside the lock
        self._hist, self._spare = new_histogram(), new_histogram()
        self._reset()

    def _reset(self) -> None:
        self._issued = self._ok = self._errors = self._timeouts = self._not_sent = 0
        self._kinds: dict[str, int] = {}
        self._why: dict[str, int] = {}  # arrivals not sent, by reason
        self._messages: list[tuple[str, str]] = []

    def issue(self, n: int = 1) -> None:
        with self._lock:
            self._issued += n
            self.pending += n

    def not_sent(self, n: int, why: str) -> None:
        """``n`` issued arrivals the client did not send (``why``: its backlog full, ...)."""
        if n <= 0:
            return
        with self._lock:
            self.pending -= n
            self._not_sent += n
            self.total_not_sent += n
            self._why[why] = self._why.get(why, 0) + n

    def complete(self, latency_us: float, kind: str = "ok", message: str | None = None) -> None:
        with self._lock:
            self.pending -= 1
            if kind == "ok":
                self._ok += 1
                self.total_ok += 1
                self._hist.record_value(min(max(int(latency_us), LOWEST_US), HIGHEST_US))
                return
            self.total_errors += 1
            if kind == "timeout":
                self._timeouts += 1
            else:
                kind = "error"
                self._errors += 1
            label = error_label(kind, message)
            self._kinds[label] = self._kinds.get(label, 0) + 1
            if len(self._messages) < ERRORS_KEPT:
                self._messages.append((kind, message or kind))

    def take_into(self, window: Window) -> list[tuple[str, str]]:
        """Add the outcomes since the last take to ``window`` (one thread calls this); returns the error
        messages it keeps (``ERRORS_KEPT`` a window)."""
        with self._lock:
            h, self._hist = self._hist, self._spare
            counts = dict(
                issued=self._issued,
                ok=self._ok,
                errors=self._errors,
                timeouts=self._timeouts,
                not_sent=self._not_sent,
            )
            kinds, why, messages = self._kinds, self._why, self._messages
            self._reset()
        if h.get_total_count():
            if window.hist.get_total_count():
                window.hist.add(h)
                h.reset()
            else:  # swapped, not added: HdrHistogram.add takes an empty one's minimum as 0
                window.hist, h = h, window.hist
        self._spare = h
        for k, n in counts.items():
            window.counts[k] += n
        for into, add in ((window.kinds, kinds), (window.why, why)):
            for k, n in add.items():
                into[k] = into.get(k, 0) + n
        kept = messages[: max(ERRORS_KEPT - window.errors_kept, 0)]
        window.errors_kept += len(kept)
        return kept

    def roll(self, t0: float, t1: float) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """The outcomes since the last take as one window's row, and its messages (kept errors, then
        one per reason arrivals were not sent)."""
        window = Window(t0)
        messages = self.take_into(window)
        return window.row(t1), messages + window.not_sent_messages()


class LoadDriver:
    """Drive ``target.call(batch, timeout_s)`` open loop (``rate`` requests/s) or closed loop
    (``concurrency``), each request bounded by ``timeout_s``."""

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
        timeout_s: float = 30.0,
    ) -> None:
        self.target = target
        self.batch = batch
        self.recorder = recorder
        self.rate = rate
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.workers = workers if rate is not None else int(concurrency or 1)
        self.max_backlog = max_backlog or max(64, min(int((rate or 0) * BACKLOG_S), MAX_BACKLOG))
        self._stop = threading.Event()
        self._cut_ns: int | None = None  # arrivals due before this are issued, sent or not (finish)
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._threads: list[threading.Thread] = []

    def start(self, duration_s: float | None = None, ran_s: float = 0.0, issued: int = 0) -> LoadDriver:
        """Start issuing; with ``duration_s``, no request is issued (open loop: scheduled) after that
        long, whenever ``finish`` comes. A resumed run passes the run time its earlier segments spent
        issuing (``ran_s``) and the arrivals they issued: open loop, its arrivals go on from there (arrival
        k of the run is due k / rate into its run time), so a run issues rate x duration in all."""
        self._t0_ns = time.perf_counter_ns()
        self._end_ns = None if duration_s is None else self._t0_ns + int(duration_s * 1e9)
        self._grid_ns = self._t0_ns - round(ran_s * 1e9)  # where the run's arrival 0 was due
        self._first = issued
        self._total_ns = None if duration_s is None else round((ran_s + duration_s) * 1e9)
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
        """One request whose clock started at ``started_ns`` (its scheduled or its actual send)."""
        left = self.timeout_s - (time.perf_counter_ns() - started_ns) / 1e9
        try:
            self.target.call(self.batch, timeout_s=max(left, 1e-3))
            kind, message = "ok", None
        except RequestError as e:
            kind, message = e.kind, str(e)
        except Exception as e:  # a bug or library error below the target: recorded, never fatal to the run
            kind, message = "error", f"{type(e).__name__}: {e}"
        latency_us = (time.perf_counter_ns() - started_ns) / 1e3
        if kind == "ok" and latency_us > self.timeout_s * 1e6:
            kind = "timeout"
            message = f"answered after {latency_us / 1e6:.3f} s, past the {self.timeout_s:g} s timeout"
        self.recorder.complete(latency_us, kind, message)

    def _schedule(self) -> None:
        assert self.rate is not None
        period_ns = 1e9 / self.rate
        start, grid = self._t0_ns, self._grid_ns
        # arrivals due before the end of the run: exactly rate x duration
        last = None if self._total_ns is None else math.ceil(self._total_ns / period_ns)
        k = self._first  # the run's arrivals issued so far: arrival k is due at grid + k * period
        while not self._stop.is_set():
            if last is not None and k >= last:
                self._stop.wait()
                break
            due = grid + int(k * period_ns)
            delay = (due - time.perf_counter_ns()) / 1e9
            if delay > 0:
                if self._stop.wait(delay):
                    break
                continue
            # every arrival due by now (more than one when this thread fell behind) is issued at once
            n = int((time.perf_counter_ns() - grid) // period_ns) + 1
            n = (n if last is None else min(n, last)) - k
            sent = min(n, max(self.max_backlog - self._queue.qsize(), 0))
            self.recorder.issue(n)
            for i in range(sent):  # an arrival due before this segment started counts from its start
                self._queue.put(max(grid + int((k + i) * period_ns), start))
            self.recorder.not_sent(n - sent, f"the client's backlog of {self.max_backlog} arrivals was full")
            k += n
        self._behind(grid, period_ns, last, k)
        for _ in range(self.workers):
            self._queue.put(None)

    def _behind(self, grid: int, period_ns: float, last: int | None, k: int) -> None:
        """Arrivals due before the cut that this thread never got to (its CPU could not keep the rate:
        it was behind when the run stopped) are issued and not sent, so none goes uncounted."""
        cut = self._cut_ns if self._cut_ns is not None else time.perf_counter_ns()
        due = max(0, math.ceil((cut - grid) / period_ns))  # arrivals k with grid + k * period < cut
        n = (due if last is None else min(due, last)) - k
        if n > 0:
            self.recorder.issue(n)
            self.recorder.not_sent(
                n, "due while the client's scheduler was behind; its CPU could not keep the rate"
            )

    def _open_worker(self) -> None:
        while True:
            due = self._queue.get()
            if due is None:
                return
            if self._stop.is_set():
                self.recorder.not_sent(1, "still in the client's backlog when the run ended")
            elif time.perf_counter_ns() - due >= self.timeout_s * 1e9:
                why = f"waited in the client's backlog past the {self.timeout_s:g} s timeout"
                self.recorder.not_sent(1, why)
            else:
                self._one(due)

    def _closed_worker(self) -> None:
        while not self._stop.is_set() and (self._end_ns is None or time.perf_counter_ns() < self._end_ns):
            self.recorder.issue()
            self._one(time.perf_counter_ns())

    def finish(self, at_end: bool = False) -> None:
        """Stop issuing: arrivals still in the backlog are not sent; requests in flight go on.
        ``at_end``: the run reached its duration, so every arrival due before the end counts as issued
        (a scheduler that fell behind counts the rest as not sent), else those due before now."""
        self._cut_ns = self._end_ns if at_end and self._end_ns is not None else time.perf_counter_ns()
        self._stop.set()
        if self.rate is None:
            return
        self._threads[0].join(1.0)  # the scheduler: it stops at once, then queues one None a worker
        left = 0
        try:
            while True:
                left += self._queue.get_nowait() is not None
        except queue.Empty:
            pass
        self.recorder.not_sent(left, "still in the client's backlog when the run ended")
        for _ in range(self.workers):
            self._queue.put(None)

    def stop(self, timeout: float | None = None) -> int:
        """Stop issuing and wait for the requests in flight (each ends by its own timeout; ``timeout``
        defaults to the request timeout and a little more); returns those still unanswered."""
        self._stop.set()
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout_s + 5.0)
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return self.recorder.pending

    @property
    def busy(self) -> bool:
        """Whether any load thread still runs (requests in flight after ``finish``)."""
        return any(t.is_alive() for t in self._threads)
