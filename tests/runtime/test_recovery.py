"""The recovery clock (``recover_interval_s``): a standby whose warm-up failed is warmed again once its
fault may have healed, and a recovery warms the backend it returns to while the traffic keeps running on
the active one. Real ONNX Runtime and OpenVINO runners; the faults are injected configuration."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from veo_edge.errors import UsageError
from veo_edge.runtime.faults import InjectedDeviceLostError
from veo_edge.runtime.recovery import BACKOFF_MAX, Backoff
from veo_edge.runtime.runtime import Runtime

CPU_CHAIN = ["onnxruntime", "openvino"]
X = np.random.default_rng(5).standard_normal((1, 3, 32, 32)).astype(np.float32)


class Clock:
    """A fault clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def statuses(rt: Runtime) -> dict[str, str]:
    return {c.name: c.status for c in rt.state.candidates}


def wait_for(what: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not what() and time.monotonic() < deadline:
        time.sleep(0.02)
    return what()


# openvino's warm-up as a standby fails once (at 0 s); onnxruntime loses its device once, at 10 s
FAULTS = {"openvino": {"once_at_s": 0}, "onnxruntime": {"once_at_s": 10, "error": "device_lost"}}


def test_a_standby_whose_warm_up_failed_is_warmed_again_and_answers_the_next_lost_device(
    nano_build: Path,
) -> None:
    clock = Clock()
    with Runtime(
        nano_build, policy=CPU_CHAIN, faults=FAULTS, fault_clock=clock, recover_interval_s=0.2
    ) as rt:
        assert rt.state.skipped[0]["backend"] == "openvino"
        assert rt.state.skipped[0]["reason"].startswith("warm-up failed: InjectedOutOfMemoryError")
        assert wait_for(lambda: statuses(rt) == {"onnxruntime": "active", "openvino": "standby"})
        assert rt.stats()["standby_backend"] == "openvino"
        clock.t = 10
        y = rt.infer(X)  # the device is lost on onnxruntime: re-run on the re-warmed standby
        assert y.shape == (1, 10) and rt.active_backend == "openvino"
        stats = rt.stats()
        assert stats["requests_failure"] == 0 and stats["retries"] == {"openvino": {"ok": 1}}
        assert stats["faults"] == {"onnxruntime": {"device_lost": 1}, "openvino": {"oom": 1}}


def test_without_the_recovery_clock_the_failed_standby_stays_skipped(nano_build: Path) -> None:
    """The same faults with no recovery interval: nothing re-warms openvino, so the lost device fails
    its batch (no retry where a device was lost) and only the switch after it tries openvino again."""
    clock = Clock()
    with Runtime(nano_build, policy=CPU_CHAIN, faults=FAULTS, fault_clock=clock) as rt:
        time.sleep(0.5)
        assert statuses(rt) == {"onnxruntime": "active", "openvino": "skipped"}
        assert rt.stats()["standby_backend"] is None
        clock.t = 10
        with pytest.raises(InjectedDeviceLostError):
            rt.infer(X)
        assert rt.active_backend == "openvino" and rt.infer(X).shape == (1, 10)


def test_a_recovery_warms_its_backend_while_batches_run_on_the_active_one(nano_build: Path) -> None:
    """onnxruntime loses its device on its first call and every one of its calls takes 1.5 s: while the
    recovery warms it again, batches keep running on openvino; then traffic moves back."""
    faults = {"onnxruntime": [{"once_at_s": 0, "error": "device_lost"}, {"slow_ms": 1500}]}
    with Runtime(nano_build, policy=CPU_CHAIN, faults=faults, fault_clock=lambda: 0.0) as rt:
        rt.infer(X)  # lost on onnxruntime, answered by openvino, which takes the traffic
        assert rt.active_backend == "openvino"
        moved: list[bool] = []
        recovery = threading.Thread(target=lambda: moved.append(rt.try_recover()))
        recovery.start()
        during = []
        while recovery.is_alive():
            y = rt.infer(X)
            if recovery.is_alive():
                during.append(y.shape)
        recovery.join()
        assert moved == [True] and rt.active_backend == "onnxruntime"
        assert len(during) >= 3 and set(during) == {(1, 10)}
        assert statuses(rt) == {"onnxruntime": "active", "openvino": "standby"}
        assert rt.state.switches[-1]["reason"] == "recovered"


@pytest.mark.parametrize("interval", [0, -1.0])
def test_a_recovery_interval_must_be_positive(nano_build: Path, interval: float) -> None:
    with pytest.raises(UsageError, match="recover_interval_s must be > 0 seconds"):
        Runtime(nano_build, recover_interval_s=interval)


def test_a_dropped_standby_is_warmed_again_on_the_recovery_clock(nano_build: Path) -> None:
    """openvino (active) fails every 2nd call, each time answered by its own second try; onnxruntime
    (the standby) fails calls 2-4 of each runner, so the retries drop it after 3 in a row. The clock warms
    a new onnxruntime runner (its call 1, the warm-up, runs) as the standby again; without it, none."""
    faults = {"openvino": {"every_nth": 2}, "onnxruntime": {"oom_after": 1, "recover_after": 4}}
    for interval in (0.2, None):
        with Runtime(nano_build, policy=CPU_CHAIN[::-1], faults=faults, recover_interval_s=interval) as rt:
            for _ in range(4):
                assert rt.infer(X).shape == (1, 10)
            stats = rt.stats()
            assert stats["requests_failure"] == 0
            assert stats["retries"] == {"onnxruntime": {"failed": 3}, "openvino": {"ok": 3}}
            if interval is None:
                time.sleep(0.5)
                assert statuses(rt)["onnxruntime"] == "failed" and rt.stats()["standby_backend"] is None
            else:
                assert wait_for(lambda: statuses(rt) == {"openvino": "active", "onnxruntime": "standby"})
                assert rt.stats()["standby_backend"] == "onnxruntime"


def test_the_backoff_doubles_each_wait_up_to_its_cap_and_a_success_forgets() -> None:
    clock = Clock()
    backoff = Backoff(30.0, clock=clock)
    waits = [backoff.failed("tensorrt") for _ in range(6)]
    assert waits == [30.0 * min(2**k, BACKOFF_MAX) for k in range(6)] and waits[-1] == 30.0 * BACKOFF_MAX
    assert backoff.pending("tensorrt") and backoff.waiting("tensorrt") and not backoff.due("tensorrt")
    clock.t = waits[-1]
    assert backoff.due("tensorrt") and not backoff.waiting("tensorrt")
    backoff.clear("tensorrt")
    assert not backoff.pending("tensorrt") and backoff.failed("tensorrt") == 30.0  # starts over
    never = Backoff(None, clock=clock)
    assert never.failed("tensorrt") is None and not never.pending("tensorrt")


def test_a_backend_ahead_that_stays_down_is_tried_less_and_less_often(nano_build: Path) -> None:
    """onnxruntime (first) fails every call from 10 s on the fault clock with a lost device: traffic moves
    to openvino, and the clock (0.1 s) tries onnxruntime again and again, each warm-up failing. The waits
    between attempts double (0.1, 0.2, 0.4 s, ...), where every tick would try it without the backoff.
    Once it heals, readiness's try_recover (no backoff) moves traffic back at once."""
    clock = Clock()
    faults = {"onnxruntime": {"after_s": 10, "error": "device_lost"}}
    interval = 0.1
    with Runtime(
        nano_build, policy=CPU_CHAIN, faults=faults, fault_clock=clock, recover_interval_s=interval
    ) as rt:
        clock.t = 10
        assert rt.infer(X).shape == (1, 10) and rt.active_backend == "openvino"

        def attempts() -> int:  # each failed warm-up of onnxruntime counts one lost device
            return rt.stats()["faults"]["onnxruntime"]["device_lost"] - 1  # the first: the batch

        seen, times, end = 0, [], time.monotonic() + 2.5
        while time.monotonic() < end:
            if attempts() > seen:
                seen = attempts()
                times.append(time.monotonic())
            time.sleep(0.005)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert len(times) >= 4 and max(gaps) >= 0.75 * interval * BACKOFF_MAX, times
        # lower bounds only (a slow machine waits longer); a quarter of slack for the warm-up's own time
        for k, gap in enumerate(gaps):
            assert gap >= 0.75 * interval * min(2**k, BACKOFF_MAX), gaps
        assert len(times) <= 8  # a tick each 0.1 s would have tried about 15 times
        assert rt.active_backend == "openvino" and rt.stats()["requests_failure"] == 0
        # healed just after an attempt failed (its next one 0.8 s away): readiness's path tries at once.
        # True says this call moved traffic itself: one that honoured the backoff would answer False, and
        # one that waited for the clock would find the clock's attempt (healed by then) had moved first.
        # No time bound: the warm-up it runs took 0.75 s under the suite's load once.
        assert wait_for(lambda: attempts() > seen, timeout=5)
        clock.t = 0
        assert rt.try_recover() and rt.active_backend == "onnxruntime"
