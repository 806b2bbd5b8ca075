"""Dynamic batching: concurrent callers submit one sample each; one thread groups them into batches.

Batching costs nothing when it cannot help. A free slot takes what is queued at once, unless more
samples are *expected* and the batch is not full: only then does it wait, until the batch is full, the
expected samples are in (or no longer expected), or it has waited ``max_delay_ms`` (counted from its
first sample's arrival, or from when the slot came free for samples that queued while it was busy: the
window bounds the time batching adds, not the time spent queued behind a busy slot). Two kinds of
samples are expected:

- *arriving*: announced with :meth:`Batcher.expect` by a transport that has begun receiving a request;
- *returning*: the callers of the batches answered within the last ``max_delay_ms`` who have not sent
  again. A closed-loop client sends its next request as soon as it has its answer; waiting for it (it is
  on its way back while the batch forms) is what fills batches under concurrency. Every sample that
  comes (or is announced) stands for one of them, whoever sent it.

A lone request therefore never waits for the window: when it comes, nothing else is queued. Under
concurrency batches fill: samples queue up while the slots are busy, and the callers just answered come
back within the window.

``slots`` batches may run at once (one thread each), for backends that run several infer requests in
parallel (OpenVINO's THROUGHPUT streams); one slot forms a batch at a time, of at most its share of the
samples in the system (queued, expected and running, divided by the slots), so that concurrent batches
stay balanced (four closed-loop clients on two slots: two batches of two, not one of three and one of
one); the samples of one request (:meth:`Batcher.submit_many`) stay in one batch where ``max_batch``
allows. The batch is stacked into the leading rows of its slot's input buffer (one per slot, of
``max_batch`` samples: steady state allocates no new input buffers; a batch of one runs from its
sample's own array, its caller waiting for the answer), run through ``run_batch``, and
each caller's future is resolved with its own row of the output, copied so that no caller holds a view
of a shared array.

A caller may also run a lone sample on its own thread (:meth:`Batcher.run_alone`) when nothing is
queued, running or on its way: the batch of one is run and counted as any other (close reason
``alone``), without the hand-off to a batching thread and back (the event loop of ``veo-edge serve``
at one client: see :mod:`veo_edge.serve.alone`).

Every accepted sample is answered exactly once: with its output, or with the exception that the batch
raised. The queue is bounded; a full queue rejects at once with :class:`~veo_edge.errors.OverloadedError`.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
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
    request: int  # the samples of one submit_many share it


@dataclass
class BatcherStats:
    requests_success: int = 0
    requests_failure: int = 0
    batches: int = 0
    batch_size_counts: dict[int, int] = field(default_factory=dict)
    request_us_total: float = 0.0
    queue_us_total: float = 0.0
    compute_us_total: float = 0.0
    #: batch size -> total time (us) the batches of that size ran (the call that runs them, gathering
    #: excluded): Triton's batch_stats; each of a batch's samples carries the same time on its future
    batch_compute_us: dict[int, float] = field(default_factory=dict)
    max_wait_us: float = 0.0  # the longest any batch's first sample waited before dispatch
    #: why batches closed: "full" (max_batch, or with several slots this slot's share of the samples
    #: queued, expected and running), "nothing_expected" (at once, or once the expected samples came or
    #: their window passed) or "deadline" (the slot waited max_delay_ms for the batch to fill)
    close_reasons: dict[str, int] = field(default_factory=dict)


class Arrival:
    """Samples a transport has begun to receive; a waiting batch may wait for them (see the module doc).

    Use as a context manager around receiving and submitting a request: the announcement is withdrawn at
    exit (or as each sample is submitted through :meth:`Batcher.submit` with ``arrival=``)."""

    def __init__(self, batcher: Batcher, n: int) -> None:
        self._batcher = batcher
        self.left = n

    def done(self, n: int | None = None) -> None:
        """``n`` of the announced samples came (or will not come); all of them when ``None``."""
        if not self.left:
            return  # all came (the usual end of a request): nothing to withdraw, no one to wake
        b = self._batcher
        with b._cond:
            k = self.left if n is None else min(n, self.left)
            self.left -= k
            b._arriving -= k
            b._cond.notify()

    def __enter__(self) -> Arrival:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.left:
            self.done()


class Batcher:
    """Groups single samples into batches of at most ``max_batch`` and runs them on ``slots`` threads."""

    def __init__(
        self,
        run_batch: Callable[[np.ndarray], np.ndarray],
        sample_shape: tuple[int, ...],
        dtype: str | np.dtype,
        max_batch: int,
        max_delay_ms: float = 2.0,
        max_queue: int = 256,
        name: str = "veo-edge-batcher",
        slots: int = 1,
    ) -> None:
        if max_batch < 1:
            raise UsageError(f"max_batch must be >= 1, got {max_batch}")
        if max_delay_ms < 0:
            raise UsageError(f"max_queue_delay_ms must be >= 0, got {max_delay_ms}")
        if max_queue < 1:
            raise UsageError(f"max_queue must be >= 1, got {max_queue}")
        if slots < 1:
            raise UsageError(f"slots must be >= 1, got {slots}")
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
        self.slots = slots
        self._arriving = 0  # samples announced by expect() and not yet submitted or withdrawn
        self._returning = 0  # callers answered within max_delay_ms who have not come back (module doc)
        self._returning_until_ns = 0
        self._running = 0  # samples in batches being run
        self._requests = 0  # submit_many calls so far: each queued sample carries its call's number
        self._forming = threading.Lock()  # one slot forms a batch at a time; the others wait here
        #: per slot, one input buffer of max_batch samples; a batch of n stacks into its first n rows
        self._buffers: list[np.ndarray | None] = [None] * slots
        self._stats = BatcherStats()
        self._stats_lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._loop, args=(i,), name=f"{name}-{i}", daemon=True)
            for i in range(slots)
        ]
        for t in self._threads:
            t.start()

    # -- callers ----------------------------------------------------------------------------------
    def expect(self, n: int = 1) -> Arrival:
        """Announce ``n`` samples that are on their way (a request being received): a partial batch
        may wait for them, within ``max_delay_ms``. Withdrawn when the :class:`Arrival` exits."""
        with self._cond:
            self._arriving += n
            self._consume_returning(n)
        return Arrival(self, n)

    def submit(self, sample: np.ndarray, arrival: Arrival | None = None) -> Future:
        """Queue one sample (already checked by the caller); its future resolves to its output row.
        ``arrival``: the announcement this sample fulfils (one of its samples is counted as come)."""
        return self.submit_many([sample], arrival)[0]

    def submit_many(self, samples: Sequence[np.ndarray], arrival: Arrival | None = None) -> list[Future]:
        """Queue the samples of one request at once (all or, when the queue cannot hold them, none), so
        that a batch forming meanwhile sees all of them; one future per sample."""
        futures: list[Future] = [Future() for _ in samples]
        with self._cond:
            announced = self._fulfil(arrival, len(samples))
            if not self._accepting:
                raise ClosedError("the runtime is closed and accepts no more requests; start a new one")
            if len(self._queue) + len(samples) > self.max_queue:
                # samples whose callers gave up hold no slot
                live = [it for it in self._queue if not it.future.cancelled()]
                if len(live) < len(self._queue):
                    self._queue = collections.deque(live)
            if len(self._queue) + len(samples) > self.max_queue:
                also = f"; this request has {len(samples)} samples" if len(samples) > 1 else ""
                raise OverloadedError(
                    f"request queue is full ({len(self._queue)} pending of {self.max_queue}{also}); retry "
                    "later, lower the request rate, or raise max_queue (serve --max-queue)"
                )
            self._consume_returning(len(samples) - announced)  # announced ones consumed at expect()
            now = time.perf_counter_ns()
            self._requests += 1
            rid = self._requests
            self._queue.extend(_Item(x, f, now, rid) for x, f in zip(samples, futures, strict=True))
            self._cond.notify()
        return futures

    def run_alone(self, sample: np.ndarray, arrival: Arrival | None = None) -> Future | None:
        """Run one sample on the calling thread now, if nothing else is queued, running or announced
        (``arrival``: this sample's own announcement); returns its future, already resolved, or ``None``
        when the batcher is busy (then :meth:`submit` it). The batch is counted like any other."""
        with self._cond:
            own = 1 if arrival is not None and arrival.left else 0
            if not self._accepting or self._queue or self._running or self._arriving - own > 0:
                return None
            self._consume_returning(1 - self._fulfil(arrival, 1))
            self._running += 1
            self._requests += 1
            item = _Item(sample, Future(), time.perf_counter_ns(), self._requests)
        item.future.set_running_or_notify_cancel()
        self._run([item], reason="alone")
        return item.future

    def _fulfil(self, arrival: Arrival | None, n: int) -> int:
        """Count up to ``n`` of ``arrival``'s announced samples as come; how many were. Under _cond."""
        announced = min(n, arrival.left) if arrival is not None else 0
        if announced:
            arrival.left -= announced
            self._arriving -= announced
        return announced

    def _consume_returning(self, n: int) -> None:
        """``n`` samples came (or were announced): each stands for one caller expected back. Under _cond."""
        if self._returning:
            self._returning = max(0, self._returning - n)

    @property
    def pending(self) -> int:
        return len(self._queue)

    @property
    def arriving(self) -> int:
        return self._arriving

    @property
    def alive(self) -> bool:
        """Whether any batching thread still runs (after a close that timed out while draining)."""
        return any(t.is_alive() for t in self._threads)

    def stats(self) -> BatcherStats:
        with self._stats_lock:
            s = self._stats
            return BatcherStats(**{k: dict(v) if isinstance(v, dict) else v for k, v in vars(s).items()})

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop accepting. With ``drain`` every queued sample is still run; otherwise queued samples
        are answered with :class:`ClosedError`. Returns once the threads have stopped (or ``timeout``)."""
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
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    # -- the batching thread ----------------------------------------------------------------------
    def _take_batch(self) -> tuple[list[_Item], str] | None:
        """Block for the next batch and say why it closed; ``None`` once stopped and empty. Called under
        ``_forming``."""
        delay_ns = int(self.max_delay_ms * 1e6)
        free_ns = time.perf_counter_ns()
        with self._cond:
            while not self._queue:
                if self._stop:
                    return None
                self._cond.wait()
            # wait only while the batch can still fill: it is not full and more samples are expected;
            # the slot idles at most max_delay_ms for it (from the first sample's arrival, or from when
            # the slot came free for samples that queued while it was busy)
            deadline = max(self._queue[0].enqueued_ns, free_ns) + delay_ns
            while True:
                now = time.perf_counter_ns()
                returning = self._returning if now < self._returning_until_ns else 0
                expected = max(0, self._arriving) + returning
                # this slot's share of the samples in the system (slots that share them run in
                # parallel), never splitting one request's samples (see below)
                share = -(-(len(self._queue) + expected + self._running) // self.slots)
                target = min(self.max_batch, max(1, share))
                if len(self._queue) >= target:  # full, or all there is when nothing more is expected
                    full = expected > 0 or len(self._queue) >= self.max_batch
                    reason = "full" if full else "nothing_expected"
                    break
                if deadline - now <= 0:
                    reason = "deadline"
                    break
                if self._stop or expected <= 0:
                    reason = "nothing_expected"
                    break
                until = min(deadline, self._returning_until_ns) if returning else deadline
                self._cond.wait(max(until - now, 1000) / 1e9)
            n = min(target, len(self._queue))
            queue, most = self._queue, min(self.max_batch, len(self._queue))
            while n < most and queue[n].request == queue[n - 1].request:
                n += 1  # the rest of a request's samples go with it: one request, one batch
            self._running += n
            return [self._queue.popleft() for _ in range(n)], reason

    def _loop(self, slot: int) -> None:
        while True:
            with self._forming:
                taken = self._take_batch()
            if taken is None:
                return
            taken_items, reason = taken
            # callers may have cancelled their futures while queued: those are not run
            items = [it for it in taken_items if it.future.set_running_or_notify_cancel()]
            if len(items) < len(taken_items):
                with self._cond:
                    self._running -= len(taken_items) - len(items)
            if items:
                self._run(items, slot, reason)
            # hold no sample while waiting for the next batch: a sample may be a view of a request's
            # body or of a shared-memory region that its owner is about to release
            del taken, taken_items, items

    def _buffer(self, n: int, slot: int) -> np.ndarray:
        buf = self._buffers[slot]
        if buf is None:
            buf = self._buffers[slot] = np.empty((self.max_batch, *self.sample_shape), self.dtype)
        return buf[:n]  # the leading rows of a C-contiguous array: contiguous, no copy

    def warm_up(self) -> None:
        """Allocate every slot's input buffer now, its pages written (resident), instead of at the
        first batches: the memory the batcher keeps is held from the start."""
        for slot in range(self.slots):
            self._buffer(self.max_batch, slot).fill(0)

    def _run(self, items: list[_Item], slot: int = 0, reason: str = "full") -> None:
        """Run ``items`` as one batch, gathered in ``slot``'s buffer; a batch of one runs from the
        sample's own array (its caller waits for the answer; the copy was 75 µs of 602 kB)."""
        start = time.perf_counter_ns()
        if len(items) == 1:
            x = np.ascontiguousarray(items[0].sample[None])
        else:
            x = self._buffer(len(items), slot)
            for i, it in enumerate(items):
                x[i] = it.sample
        run_start = time.perf_counter_ns()
        try:
            y = self.run_batch(x)
            error: BaseException | None = None
        except Exception as e:  # answered to every caller of this batch
            y, error = None, e
        end = time.perf_counter_ns()
        with self._cond:  # before any caller has its answer: each one is expected back from now on
            self._running -= len(items)
            if end >= self._returning_until_ns:
                self._returning = 0
            self._returning += len(items)
            self._returning_until_ns = end + int(self.max_delay_ms * 1e6)
        # counted before anyone is answered: a caller that reads the stats once it has its answer
        # (or a done-callback, which runs as the answer is set) sees its batch
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
            s.batch_compute_us[len(items)] = s.batch_compute_us.get(len(items), 0.0) + (end - run_start) / 1e3
            s.max_wait_us = max(s.max_wait_us, (start - items[0].enqueued_ns) / 1e3)
            s.close_reasons[reason] = s.close_reasons.get(reason, 0) + 1
        for i, it in enumerate(items):
            # what the sample waited and the batch it ran in took: a server counts its requests by them
            it.future.timing = (start - it.enqueued_ns, end - run_start)  # type: ignore[attr-defined]
            if error is None:
                it.future.set_result(np.array(y[i], copy=True))
            else:
                it.future.set_exception(error)
