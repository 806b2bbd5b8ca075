"""Dynamic batching: concurrent callers submit one sample each; one thread groups them into batches.

A batch closes when it holds ``max_batch`` samples or when its first sample has waited
``max_delay_ms``, whichever comes first. The batch is stacked into an input buffer kept per batch size
(steady state allocates no new input buffers), run through ``run_batch``, and each caller's future is
resolved with its own row of the output, copied so that no caller holds a view of a shared array.

Every accepted sample is answered exactly once: with its output, or with the exception that the batch
raised. The queue is bounded; a full queue rejects at once with :class:`~veo_edge.errors.OverloadedError`.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from veo_edge.errors import OverloadedError, UsageError, VeoEdgeError


class ClosedError(VeoEdgeError):
    """The runtime or batcher is closed and accepts no more requests."""

    exit_code = 11


@dataclass
class _Item:
    sample: np.ndarray
    future: Future
    enqueued_ns: int


@dataclass
class BatchRecord:
    """What one batch was: its size, how long its first sample waited, and how long it ran."""

    size: int
    wait_us: float  # first sample's enqueue -> dispatch
    compute_us: float
    ok: bool


@dataclass
class BatcherStats:
    requests_success: int = 0
    requests_failure: int = 0
    batches: int = 0
    batch_size_counts: dict[int, int] = field(default_factory=dict)
    request_us_total: float = 0.0
    queue_us_total: float = 0.0
    compute_us_total: float = 0.0
    max_wait_us: float = 0.0  # the longest any batch's first sample waited before dispatch


class Batcher:
    """Groups single samples into batches of at most ``max_batch`` and runs them on one thread."""

    def __init__(
        self,
        run_batch: Callable[[np.ndarray], np.ndarray],
        sample_shape: tuple[int, ...],
        dtype: str | np.dtype,
        max_batch: int,
        max_delay_ms: float = 2.0,
        max_queue: int = 256,
        name: str = "veo-edge-batcher",
    ) -> None:
        if max_batch < 1:
            raise UsageError(f"max_batch must be >= 1, got {max_batch}")
        if max_delay_ms < 0:
            raise UsageError(f"max_queue_delay_ms must be >= 0, got {max_delay_ms}")
        if max_queue < 1:
            raise UsageError(f"max_queue must be >= 1, got {max_queue}")
        self.run_batch = run_batch
        self.sample_shape = tuple(sample_shape)
        self.dtype = np.dtype(dtype)
        self.max_batch = max_batch
        self.max_delay_ms = float(max_delay_ms)
        self.max_queue = max_queue
        self._queue: collections.deque[_Item] = collections.deque()
        self._cond = threading.Condition()
        self._accepting = True
        self._stop = False
        self._buffers: dict[int, np.ndarray] = {}
        self._stats = BatcherStats()
        self._stats_lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # -- callers ----------------------------------------------------------------------------------
    def submit(self, sample: np.ndarray) -> Future:
        """Queue one sample (already checked by the caller); its future resolves to its output row."""
        fut: Future = Future()
        with self._cond:
            if not self._accepting:
                raise ClosedError("the runtime is closed and accepts no more requests; start a new one")
            if len(self._queue) >= self.max_queue:
                # samples whose callers gave up (a multi-sample request rejected halfway) hold no slot
                live = [it for it in self._queue if not it.future.cancelled()]
                if len(live) < len(self._queue):
                    self._queue = collections.deque(live)
            if len(self._queue) >= self.max_queue:
                raise OverloadedError(
                    f"request queue is full ({self.max_queue} pending); retry later, lower the request "
                    "rate, or raise max_queue"
                )
            self._queue.append(_Item(sample, fut, time.perf_counter_ns()))
            self._cond.notify()
        return fut

    @property
    def pending(self) -> int:
        return len(self._queue)

    def stats(self) -> BatcherStats:
        with self._stats_lock:
            s = self._stats
            return BatcherStats(**{**vars(s), "batch_size_counts": dict(s.batch_size_counts)})

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop accepting. With ``drain`` every queued sample is still run; otherwise queued samples
        are answered with :class:`ClosedError`. Returns once the thread has stopped (or ``timeout``)."""
        with self._cond:
            self._accepting = False
            if not drain:
                dropped = list(self._queue)
                self._queue.clear()
            else:
                dropped = []
            self._stop = True
            self._cond.notify_all()
        for item in dropped:
            if item.future.set_running_or_notify_cancel():
                item.future.set_exception(
                    ClosedError("the runtime closed without draining before this request ran; retry it")
                )
        self._thread.join(timeout)

    # -- the batching thread ----------------------------------------------------------------------
    def _take_batch(self) -> list[_Item] | None:
        """Block for the next batch; ``None`` once stopped and empty."""
        delay_ns = int(self.max_delay_ms * 1e6)
        with self._cond:
            while not self._queue:
                if self._stop:
                    return None
                self._cond.wait()
            deadline = self._queue[0].enqueued_ns + delay_ns
            while len(self._queue) < self.max_batch and not self._stop:
                remaining = deadline - time.perf_counter_ns()
                if remaining <= 0:
                    break
                self._cond.wait(remaining / 1e9)
            n = min(self.max_batch, len(self._queue))
            return [self._queue.popleft() for _ in range(n)]

    def _loop(self) -> None:
        while True:
            items = self._take_batch()
            if items is None:
                return
            # callers may have cancelled their futures while queued: those are not run
            items = [it for it in items if it.future.set_running_or_notify_cancel()]
            if items:
                self._run(items)

    def _buffer(self, n: int) -> np.ndarray:
        buf = self._buffers.get(n)
        if buf is None:
            buf = self._buffers[n] = np.empty((n, *self.sample_shape), self.dtype)
        return buf

    def _run(self, items: list[_Item]) -> None:
        start = time.perf_counter_ns()
        x = self._buffer(len(items))
        for i, it in enumerate(items):
            x[i] = it.sample
        try:
            y = self.run_batch(x)
            error: BaseException | None = None
        except Exception as e:  # answered to every caller of this batch
            y, error = None, e
        end = time.perf_counter_ns()
        for i, it in enumerate(items):
            if error is None:
                it.future.set_result(np.array(y[i], copy=True))
            else:
                it.future.set_exception(error)
        queue_ns = sum(start - it.enqueued_ns for it in items)
        request_ns = sum(end - it.enqueued_ns for it in items)
        with self._stats_lock:
            s = self._stats
            s.batches += 1
            s.batch_size_counts[len(items)] = s.batch_size_counts.get(len(items), 0) + 1
            if error is None:
                s.requests_success += len(items)
            else:
                s.requests_failure += len(items)
            s.queue_us_total += queue_ns / 1e3
            s.request_us_total += request_ns / 1e3
            s.compute_us_total += (end - start) / 1e3
            s.max_wait_us = max(s.max_wait_us, (start - items[0].enqueued_ns) / 1e3)
