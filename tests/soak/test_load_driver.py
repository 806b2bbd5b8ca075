"""The open-loop driver's accounting when its own scheduler falls behind: a client whose CPU cannot keep
the offered rate (a slow CI machine at 20 000 requests/s) still counts every arrival due before the end
of the run as issued, the ones it never got to as not sent, and none due after it."""

from __future__ import annotations

import sys
import time

import numpy as np

from veo_edge.soak.load import ERRORS_KEPT, LoadDriver, Recorder


class _Answers:
    """A target that answers at once: the load is all on the client's side."""

    def call(self, batch: np.ndarray, timeout_s: float) -> None:
        return None


def _hold_the_interpreter(seconds: float) -> None:
    """Keep the GIL from every other thread for ``seconds``: the scheduler cannot run, as on a starved CPU."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds * 10)
    try:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    finally:
        sys.setswitchinterval(before)


def test_a_scheduler_that_fell_behind_counts_every_arrival_due_before_the_end():
    rec = Recorder()
    rate, duration = 1000, 0.5
    driver = LoadDriver(_Answers(), np.zeros((1,), np.float32), rec, rate=rate, workers=2, timeout_s=2.0)
    driver.start(duration)
    _hold_the_interpreter(duration + 0.3)  # the whole run passes with the scheduler starved
    driver.finish(at_end=True)
    assert driver.stop(5.0) == 0
    row, messages = rec.roll(0.0, 1.0)
    assert row["issued"] == rate * duration  # every arrival due before the end, none after it
    assert row["ok"] + row["errors"] + row["timeouts"] + row["not_sent"] == row["issued"]
    assert row["not_sent"] > rate * duration / 2  # the client's own shortfall, not the server's errors
    assert any("scheduler was behind" in m for _, m in messages), messages


def test_a_run_stopped_early_counts_the_arrivals_due_by_the_stop_not_those_after_it():
    rec = Recorder()
    rate = 1000
    driver = LoadDriver(_Answers(), np.zeros((1,), np.float32), rec, rate=rate, workers=2, timeout_s=2.0)
    driver.start(10.0)
    _hold_the_interpreter(0.4)
    t = time.perf_counter()
    driver.finish()
    assert driver.stop(5.0) == 0
    row, _ = rec.roll(0.0, 1.0)
    due = rate * (t - driver._t0_ns / 1e9)
    assert (
        due - 5 <= row["issued"] <= due + 250
    )  # due by the stop (plus a preempted moment), far below 10 000
    assert row["ok"] + row["not_sent"] == row["issued"] and row["errors"] == row["timeouts"] == 0


def test_arrivals_not_sent_are_counted_by_reason_and_leave_the_error_messages_their_slots():
    rec = Recorder()
    rec.issue(12 + 100 + 6)
    for _ in range(12):  # many small shortfalls, as a scheduler that keeps finding its backlog full
        rec.not_sent(1, "backlog full")
    rec.not_sent(100, "still queued at the end")
    for i in range(6):
        rec.complete(1.0, "error", f"HTTP 503 number {i}")
    row, messages = rec.roll(0.0, 1.0)
    assert row["not_sent"] == 112 and row["not_sent_why"] == {
        "backlog full": 12,
        "still queued at the end": 100,
    }
    assert sum(row["not_sent_why"].values()) == row["not_sent"]
    errors = [m for kind, m in messages if kind == "error"]
    assert errors == [f"HTTP 503 number {i}" for i in range(ERRORS_KEPT)]  # not crowded out by the backlog
    assert ("backlog", "12 not sent: backlog full") in messages
    assert ("backlog", "100 not sent: still queued at the end") in messages
