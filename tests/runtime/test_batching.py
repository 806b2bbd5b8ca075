"""The dynamic batcher on its own: a deterministic batch function, real threads, no wall-clock asserts."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from veo_edge.errors import OverloadedError, UsageError
from veo_edge.runtime.batching import Batcher

SHAPE = (3, 4)


def double(x: np.ndarray) -> np.ndarray:
    return x.reshape(len(x), -1) * 2.0


def test_concurrent_callers_get_exactly_their_own_rows() -> None:
    b = Batcher(double, SHAPE, "float32", max_batch=8, max_delay_ms=1.0, max_queue=1024)
    rng = np.random.default_rng(0)
    samples = rng.standard_normal((16, 25, *SHAPE)).astype(np.float32)
    results: dict[tuple[int, int], np.ndarray] = {}

    def caller(t: int) -> None:
        futs = [b.submit(samples[t, i]) for i in range(samples.shape[1])]
        for i, f in enumerate(futs):
            results[t, i] = f.result(timeout=30)

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    b.close()
    assert len(results) == 16 * 25
    for (t, i), got in results.items():
        np.testing.assert_array_equal(got, double(samples[t, i][None])[0])  # unbatched reference
    s = b.stats()
    assert s.requests_success == 400 and s.requests_failure == 0
    assert sum(k * v for k, v in s.batch_size_counts.items()) == 400  # nothing run twice
    assert max(s.batch_size_counts) <= 8


def test_a_full_batch_goes_at_once_without_waiting_for_the_delay() -> None:
    b = Batcher(double, SHAPE, "float32", max_batch=4, max_delay_ms=600_000, max_queue=16)
    futs = [b.submit(np.full(SHAPE, i, np.float32)) for i in range(4)]
    assert [float(f.result(timeout=30)[0]) for f in futs] == [0.0, 2.0, 4.0, 6.0]
    assert b.stats().batch_size_counts == {4: 1}
    b.close()


def test_a_lone_request_closes_its_batch_at_once() -> None:
    """Nothing else pending or arriving: the batch goes without waiting for the (10-minute) window."""
    b = Batcher(double, SHAPE, "float32", max_batch=8, max_delay_ms=600_000, max_queue=16)
    for i in range(5):  # one client, back to back
        assert float(b.submit(np.full(SHAPE, i, np.float32)).result(timeout=30)[0]) == 2.0 * i
    s = b.stats()
    b.close()
    assert s.batch_size_counts == {1: 5}


def test_a_partial_batch_waits_for_announced_arrivals_then_goes_at_the_delay() -> None:
    delay_ms = 200.0
    b = Batcher(double, SHAPE, "float32", max_batch=8, max_delay_ms=delay_ms, max_queue=16)
    with b.expect(5) as arrival:  # five samples announced, three come
        futs = [b.submit(np.zeros(SHAPE, np.float32), arrival) for _ in range(3)]
        for f in futs:
            f.result(timeout=30)
    s = b.stats()
    b.close()
    assert s.batch_size_counts == {3: 1}
    # dispatch never precedes the deadline of the batch's first sample (a lower bound, not a timing)
    assert s.max_wait_us >= delay_ms * 1e3 * 0.999


def test_announced_arrivals_fill_the_batch() -> None:
    b = Batcher(double, SHAPE, "float32", max_batch=8, max_delay_ms=600_000, max_queue=16)
    arrival = b.expect(3)
    first = b.submit(np.ones(SHAPE, np.float32), arrival)
    assert b.arriving == 2  # the first sample waits for the other two, not for the window
    rest = [b.submit(np.ones(SHAPE, np.float32), arrival) for _ in range(2)]
    for f in [first, *rest]:
        assert float(f.result(timeout=30)[0]) == 2.0
    b.close()
    assert b.stats().batch_size_counts == {3: 1} and b.arriving == 0


def test_a_withdrawn_arrival_releases_the_waiting_batch() -> None:
    b = Batcher(double, SHAPE, "float32", max_batch=8, max_delay_ms=600_000, max_queue=16)
    with b.expect(2) as arrival:
        fut = b.submit(np.ones(SHAPE, np.float32), arrival)
        # the second sample never comes (its request was rejected): leaving the block withdraws it
    assert float(fut.result(timeout=30)[0]) == 2.0
    b.close()
    assert b.stats().batch_size_counts == {1: 1}


def test_samples_queued_while_the_slot_is_busy_fill_the_next_batches() -> None:
    started, release = threading.Event(), threading.Event()

    def gated(x: np.ndarray) -> np.ndarray:
        started.set()
        release.wait(30)
        return double(x)

    # these callers never send again: the last batch waits for them within the window, then goes
    b = Batcher(gated, SHAPE, "float32", max_batch=4, max_delay_ms=200, max_queue=16)
    first = b.submit(np.ones(SHAPE, np.float32))
    assert started.wait(30)  # the lone first sample runs at once, alone
    queued = [b.submit(np.full(SHAPE, i, np.float32)) for i in range(7)]
    release.set()
    assert float(first.result(timeout=30)[0]) == 2.0
    assert [float(f.result(timeout=30)[0]) for f in queued] == [2.0 * i for i in range(7)]
    b.close()
    s = b.stats()
    assert s.batch_size_counts == {1: 1, 4: 1, 3: 1} and s.batches == 3
    # the last batch waited for its callers' return (the window: no earlier) until it passed
    assert s.close_reasons["full"] == 1 and sum(s.close_reasons.values()) == 3
    assert s.max_wait_us >= 200e3 * 0.999


def closed_loop(b: Batcher, clients: int, rounds: int, together: bool = False) -> None:
    """``clients`` threads, each sending its next sample as soon as it has the answer to the last.
    ``together``: their first samples are announced at once (one :meth:`Batcher.expect`), so the first
    batch holds every client and they stay in step; otherwise one thread may start a round or two ahead
    of the others (threads start when the scheduler lets them)."""
    start = threading.Barrier(clients, timeout=30)
    first = b.expect(clients) if together else None

    def client(c: int) -> None:
        start.wait()
        for r in range(rounds):
            x = np.full(SHAPE, c * 1000 + r, np.float32)
            got = b.submit(x, first if r == 0 else None).result(timeout=60)
            assert float(got[0]) == 2.0 * (c * 1000 + r)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_answered_callers_are_waited_for_so_concurrent_batches_fill() -> None:
    """Four closed-loop clients on one slot, in step from their first (announced) samples: the slot
    waits (within the window) for the callers it has just answered instead of running whoever is back
    first, so every batch holds all four. Without the returning expectation each batch would go with
    the first caller back (batches of 1)."""
    b = Batcher(double, SHAPE, "float32", max_batch=8, max_delay_ms=60_000, max_queue=64)
    rounds = 12
    closed_loop(b, clients=4, rounds=rounds, together=True)
    b.close()
    s = b.stats()
    assert s.batch_size_counts == {4: rounds}, s.batch_size_counts
    assert "deadline" not in s.close_reasons, s.close_reasons  # each closed as its fourth sample came


def test_two_slots_share_four_closed_loop_clients_evenly() -> None:
    """Two slots (parallel streams), four closed-loop clients: each slot takes its share of the samples
    in the system (two), not all it could wait for; so the two batches in flight stay balanced."""
    b = Batcher(double, SHAPE, "float32", max_batch=8, max_delay_ms=2_000, max_queue=64, slots=2)
    closed_loop(b, clients=4, rounds=30)
    b.close()
    s = b.stats()
    assert sum(k * v for k, v in s.batch_size_counts.items()) == 120
    assert max(s.batch_size_counts) <= 2, s.batch_size_counts


def test_a_lone_request_of_many_samples_is_one_batch_on_any_number_of_slots() -> None:
    b = Batcher(double, SHAPE, "float32", max_batch=8, max_delay_ms=600_000, max_queue=16, slots=2)
    x = np.arange(8 * 12, dtype=np.float32).reshape(8, *SHAPE)
    got = np.stack([f.result(timeout=30) for f in b.submit_many(list(x))])
    b.close()
    np.testing.assert_array_equal(got, double(x))
    assert b.stats().batch_size_counts == {8: 1}


def test_one_closed_loop_client_never_waits_for_itself() -> None:
    """The caller just answered is expected back, but once it is back nothing else is: its batch goes
    at once (a 10-minute window would show as a hang)."""
    b = Batcher(double, SHAPE, "float32", max_batch=8, max_delay_ms=600_000, max_queue=16)
    closed_loop(b, clients=1, rounds=50)
    b.close()
    s = b.stats()
    assert s.batch_size_counts == {1: 50} and s.close_reasons == {"nothing_expected": 50}


def test_a_requests_samples_are_queued_at_once_and_share_a_batch() -> None:
    b = Batcher(double, SHAPE, "float32", max_batch=8, max_delay_ms=0, max_queue=8)
    x = np.arange(8 * 12, dtype=np.float32).reshape(8, *SHAPE)
    futs = b.submit_many(list(x))
    got = np.stack([f.result(timeout=30) for f in futs])
    np.testing.assert_array_equal(got, double(x))
    assert b.stats().batch_size_counts == {8: 1}  # no window: all eight were queued before any ran
    with pytest.raises(
        OverloadedError, match=r"queue is full \(0 pending of 8; this request has 9 samples\)"
    ):
        b.submit_many(list(np.zeros((9, *SHAPE), np.float32)))  # all or nothing
    assert b.pending == 0
    b.close()


def test_slots_run_batches_in_parallel() -> None:
    """Two slots: the second batch runs while the first is still running (a barrier both must reach)."""
    barrier, started = threading.Barrier(2, timeout=30), threading.Event()

    def meet(x: np.ndarray) -> np.ndarray:
        started.set()
        barrier.wait()  # breaks (and fails both batches) unless two batches run at once
        return double(x)

    b = Batcher(meet, SHAPE, "float32", max_batch=4, max_delay_ms=600_000, max_queue=16, slots=2)
    first = b.submit(np.ones(SHAPE, np.float32))
    assert started.wait(30)  # the first batch runs (and waits at the barrier)
    second = b.submit(np.ones(SHAPE, np.float32))  # a free slot takes it at once
    assert float(first.result(timeout=60)[0]) == float(second.result(timeout=60)[0]) == 2.0
    b.close()
    assert b.stats().batch_size_counts == {1: 2}


def test_configuration_is_validated() -> None:
    with pytest.raises(UsageError, match="max_batch must be >= 1, got 0"):
        Batcher(double, SHAPE, "float32", max_batch=0)
    with pytest.raises(UsageError, match="max_queue must be >= 1, got 0"):
        Batcher(double, SHAPE, "float32", max_batch=1, max_queue=0)
    with pytest.raises(UsageError, match="slots must be >= 1, got 0"):
        Batcher(double, SHAPE, "float32", max_batch=1, slots=0)


def test_steady_state_allocates_nothing_that_stays() -> None:
    """Once every batch size has been seen, hundreds more batches leave the Python heap where it was
    (one input buffer per slot, of max_batch samples; futures and output rows are freed)."""
    import tracemalloc

    b = Batcher(double, SHAPE, "float32", max_batch=8, max_delay_ms=2.0, max_queue=64)
    rng = np.random.default_rng(0)
    sample = np.ones(SHAPE, np.float32)

    def rounds(n: int) -> None:
        for k in rng.integers(1, 9, size=n):
            for f in [b.submit(sample) for _ in range(k)]:
                f.result(timeout=30)

    for k in range(1, 9):  # warm every batch size once
        for f in [b.submit(sample) for _ in range(k)]:
            f.result(timeout=30)
    rounds(50)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        rounds(300)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        b.close()
    assert [len(buf) for buf in b._buffers] == [8]  # one buffer per slot, of max_batch samples
    # the last batch's futures are still referenced (~15 KiB); a leak of one future per request would be
    # hundreds of KiB over these ~1,300 requests
    assert grown < 64 << 10, f"{grown} bytes stayed allocated after 300 batches"


def test_a_caller_that_reads_the_stats_after_its_answer_sees_its_batch() -> None:
    """The stats count a batch before its callers are answered: a done-callback (which runs as the
    answer is set, on the batching thread) already sees it."""
    go = threading.Event()

    def gated(x: np.ndarray) -> np.ndarray:
        go.wait(30)
        return double(x)

    b = Batcher(gated, SHAPE, "float32", max_batch=4, max_delay_ms=0, max_queue=16)
    counted: list[tuple[int, int]] = []

    def count(_) -> None:
        s = b.stats()  # one snapshot
        counted.append((s.requests_success, s.batches))

    for _ in range(3):
        go.clear()
        f = b.submit(np.ones(SHAPE, np.float32))
        f.add_done_callback(count)
        go.set()
        f.result(timeout=30)
    b.close()
    assert counted == [(1, 1), (2, 2), (3, 3)]


def test_run_alone_runs_a_lone_sample_on_the_callers_thread_and_refuses_while_busy() -> None:
    """run_alone: the sample runs here (no hand-off), counted as a batch closed "alone"; while anything
    else is queued, running or announced it refuses (None) and nothing runs."""
    threads: list[int] = []
    release, running = threading.Event(), threading.Event()

    def record(x: np.ndarray) -> np.ndarray:
        threads.append(threading.get_ident())
        if len(threads) == 2:  # the second batch (a submitted one) holds its slot until released
            running.set()
            assert release.wait(30)
        return double(x)

    b = Batcher(record, SHAPE, "float32", max_batch=8, max_delay_ms=600_000, max_queue=16)
    x = np.full(SHAPE, 3.0, np.float32)
    with b.expect() as arrival:  # this request's own announcement does not count as another
        done = b.run_alone(x, arrival)
    assert done is not None and done.done() and float(done.result()[0]) == 6.0
    assert threads == [threading.get_ident()] and b.arriving == 0

    busy = b.submit(x)  # runs on the batching thread and holds it
    assert running.wait(30)
    assert b.run_alone(x) is None  # a batch is running
    release.set()
    assert float(busy.result(timeout=30)[0]) == 6.0
    other = b.expect()  # another request on its way
    assert b.run_alone(x) is None
    other.done()
    assert b.run_alone(x) is not None
    b.close()
    assert b.run_alone(x) is None  # closed
    s = b.stats()
    assert s.close_reasons["alone"] == 2 and s.batch_size_counts == {1: 3}
    assert len(threads) == 3 and threads[1] != threading.get_ident() and threads[2] == threads[0]
