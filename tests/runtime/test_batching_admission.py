"""The dynamic batcher's admission and endings: overload refused at once, a failing batch answering each of
its callers, close draining or rejecting, cancelled requests neither run nor holding queue slots. A
deterministic batch function, real threads, no wall-clock asserts."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError

import numpy as np
import pytest

from veo_edge.errors import OverloadedError
from veo_edge.runtime.batching import Batcher, ClosedError

SHAPE = (3, 4)


def double(x: np.ndarray) -> np.ndarray:
    return x.reshape(len(x), -1) * 2.0


def test_overload_is_rejected_at_once_and_accepted_work_completes() -> None:
    started, release = threading.Event(), threading.Event()

    def blocked(x: np.ndarray) -> np.ndarray:
        started.set()
        release.wait(30)
        return double(x)

    b = Batcher(blocked, SHAPE, "float32", max_batch=1, max_delay_ms=0, max_queue=2)
    first = b.submit(np.ones(SHAPE, np.float32))
    assert started.wait(30)  # the first sample is running, the queue is empty
    queued = [b.submit(np.ones(SHAPE, np.float32)) for _ in range(2)]
    with pytest.raises(OverloadedError, match=r"request queue is full \(2 pending of 2\); retry later"):
        b.submit(np.ones(SHAPE, np.float32))
    release.set()
    for f in [first, *queued]:
        assert float(f.result(timeout=30)[0]) == 2.0
    b.close()
    assert b.stats().requests_success == 3


def test_a_failing_batch_answers_each_of_its_callers_with_the_error() -> None:
    def boom(x: np.ndarray) -> np.ndarray:
        raise RuntimeError("kaput")

    b = Batcher(boom, SHAPE, "float32", max_batch=4, max_delay_ms=600_000, max_queue=8)
    futs = [b.submit(np.zeros(SHAPE, np.float32)) for _ in range(4)]
    for f in futs:
        with pytest.raises(RuntimeError, match="kaput"):
            f.result(timeout=30)
    b.close()
    assert b.stats().requests_failure == 4


def test_close_drains_or_rejects_and_then_refuses() -> None:
    release = threading.Event()

    def slow(x: np.ndarray) -> np.ndarray:
        release.wait(30)
        return double(x)

    b = Batcher(slow, SHAPE, "float32", max_batch=1, max_delay_ms=0, max_queue=8)
    futs = [b.submit(np.ones(SHAPE, np.float32)) for _ in range(3)]
    release.set()
    b.close(drain=True)
    assert all(float(f.result(timeout=0)[0]) == 2.0 for f in futs)
    with pytest.raises(ClosedError, match="closed and accepts no more requests"):
        b.submit(np.ones(SHAPE, np.float32))

    gate = threading.Event()
    b2 = Batcher(lambda x: (gate.wait(30), double(x))[1], SHAPE, "float32", 1, 0, 8)
    futs = [b2.submit(np.ones(SHAPE, np.float32)) for _ in range(4)]
    closer = threading.Thread(target=b2.close, kwargs={"drain": False})
    closer.start()
    while b2._accepting:  # close() has cleared the queue once it stops accepting
        threading.Event().wait(0.001)
    gate.set()
    closer.join()
    outcomes = []
    for f in futs:
        try:
            f.result(timeout=30)
            outcomes.append("ok")
        except ClosedError:
            outcomes.append("closed")
    assert len(outcomes) == 4 and outcomes.count("closed") >= 3  # each answered once


def test_cancelled_requests_are_not_run() -> None:
    gate = threading.Event()
    b = Batcher(lambda x: (gate.wait(30), double(x))[1], SHAPE, "float32", 1, 0, 8)
    first = b.submit(np.ones(SHAPE, np.float32))
    second = b.submit(np.ones(SHAPE, np.float32))
    assert second.cancel()
    gate.set()
    first.result(timeout=30)
    b.close()
    with pytest.raises(CancelledError):
        second.result(timeout=0)
    assert b.stats().requests_success == 1


def test_cancelled_requests_do_not_hold_queue_slots() -> None:
    """A caller that gives up (the server cancels the queued samples of a request it rejected halfway)
    must not keep later callers out of a full queue."""
    gate = threading.Event()
    b = Batcher(lambda x: (gate.wait(30), double(x))[1], SHAPE, "float32", 1, 0, max_queue=1)
    running = b.submit(np.ones(SHAPE, np.float32))
    for _ in range(3000):  # bounded wait until the batching thread has taken it off the queue
        if b.pending == 0:
            break
        threading.Event().wait(0.01)
    assert b.pending == 0
    queued = b.submit(np.ones(SHAPE, np.float32))
    with pytest.raises(OverloadedError, match=r"request queue is full \(1 pending of 1\)"):
        b.submit(np.ones(SHAPE, np.float32))
    assert queued.cancel()
    later = b.submit(np.full(SHAPE, 3.0, np.float32))  # the cancelled sample's slot is free again
    gate.set()
    assert float(running.result(timeout=30)[0]) == 2.0
    assert float(later.result(timeout=30)[0]) == 6.0
    b.close()
    assert b.stats().requests_success == 2
