"""Fault configuration and the faulty runner wrapped around a real ONNX Runtime runner."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

from veo_edge.builddir import BuildDir
from veo_edge.errors import BackendError, BackendUnavailableError, CudaOutOfMemoryError, UsageError
from veo_edge.runtime.faults import (
    FaultPlan,
    FaultSchedule,
    FaultSpec,
    FaultyRunner,
    InjectedBackendError,
    InjectedDeviceLostError,
    InjectedOutOfMemoryError,
    parse_faults,
)
from veo_edge.runtime.loaders import cpu_runner
from veo_edge.runtime.policy import BACKENDS
from veo_edge.runtime.runtime import Runtime


class Clock:
    """A fault clock the test moves by hand (the schedule reads it; nothing sleeps)."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_specs_parse_from_dict_json_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_faults({"onnxruntime": {"oom_after": 5}}, BACKENDS) == {
        "onnxruntime": FaultSpec(oom_after=5)
    }
    assert parse_faults('{"*": {"slow_ms": 50}}', BACKENDS) == {"*": FaultSpec(slow_ms=50)}
    monkeypatch.setenv("VEO_EDGE_FAULTS", '{"openvino": {"fail_at_start": true}}')
    assert parse_faults(None, BACKENDS) == {"openvino": FaultSpec(fail_at_start=True)}
    monkeypatch.delenv("VEO_EDGE_FAULTS")
    assert parse_faults(None, BACKENDS) == {}
    assert parse_faults({"openvino": {}}, BACKENDS) == {}  # an empty spec injects nothing
    assert parse_faults('{"openvino": {"every_nth": 2, "error": "wrong"}}', BACKENDS) == {
        "openvino": FaultSpec(every_nth=2, error="wrong")
    }


@pytest.mark.parametrize(
    ("faults", "match"),
    [
        ({"every_nth": 3}, r"names backend 'every_nth'; fault specs are keyed by a backend name"),
        ({"openvino": {"oom_afer": 3}}, r"unknown fault option\(s\) \['oom_afer'\] for 'openvino'"),
        ({"openvino": {"every_nth": 0}}, r"every_nth=0 for 'openvino' is invalid; expected an integer >= 1"),
        ({"openvino": {"oom_after": -1}}, r"oom_after=-1 .* expected an integer >= 0"),
        (
            {"openvino": {"error": "segfault"}},
            r"error='segfault' .* choose one of: oom, device_lost, backend",
        ),
        ({"openvino": 3}, r"fault spec for 'openvino' is a int, expected an object"),
        ({"openvino": {"leak_bytes_per_call": -1}}, r"leak_bytes_per_call=-1 .* expected an integer from 0"),
        (
            {"openvino": {"leak_bytes_per_call": 1.5}},
            r"leak_bytes_per_call=1.5 .* expected an integer from 0",
        ),
        ("{nope", r"faults is not valid JSON"),
        (
            {"openvino": {"every_s": 0}},
            r"every_s=0 for 'openvino' is invalid; expected a number of seconds > 0",
        ),
        ({"openvino": {"after_s": -1}}, r"after_s=-1 .* seconds >= 0"),
        ({"openvino": {"once_at_s": "10m"}}, r"once_at_s='10m' .* expected a number of seconds >= 0"),
        ({"openvino": [{"every_s": 5}, {"evry_s": 1}]}, r"unknown fault option\(s\) \['evry_s'\]"),
        # an error with no rule naming the calls would inject nothing: refused, as other bad specs are
        (
            {"openvino": {"error": "wrong"}},
            r"error='wrong' for 'openvino' names no call to fail; .*every_nth",
        ),
        ({"openvino": {"slow_ms": 5, "error": "oom"}}, r"error='oom' .* names no call to fail"),
        ({"openvino": {"slow_ms": math.nan}}, r"slow_ms=nan .* expected a number of milliseconds from 0"),
        ({"openvino": {"slow_ms": math.inf}}, r"slow_ms=inf .* milliseconds from 0 to 600000"),
        ({"openvino": {"slow_ms": 1e12}}, r"slow_ms=1000000000000.0 .* milliseconds from 0 to 600000"),
        ({"openvino": {"slow_ms": True}}, r"slow_ms=True .* expected a number of milliseconds"),
        ({"openvino": {"slow_ms": "5"}}, r"slow_ms='5' .* expected a number of milliseconds"),
        ({"openvino": {"fail_at_start": "no"}}, r"fail_at_start='no' .* expected true or false"),
        ({"openvino": {"fail_at_start": 1}}, r"fail_at_start=1 .* expected true or false"),
        ({"openvino": {"after_s": True}}, r"after_s=True .* expected a number of seconds >= 0"),
        ({"openvino": {"every_nth": True}}, r"every_nth=True .* expected an integer >= 1"),
        ({"openvino": {"leak_bytes_per_call": 1 << 40}}, r"leak_bytes_per_call=1099511627776 .* from 0 to"),
        ({"openvino": {"every_nth": 2, "error": ["oom"]}}, r"error=\['oom'\] .* choose one of"),
    ],
)
def test_bad_specs_say_what_to_write(faults: object, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        parse_faults(faults, BACKENDS)  # type: ignore[arg-type]


def test_which_calls_fail() -> None:
    assert [FaultSpec(oom_after=2).fails_call(n) for n in range(1, 6)] == [False, False, True, True, True]
    assert [FaultSpec(every_nth=3).fails_call(n) for n in range(1, 7)] == [False, False, True] * 2
    assert not any(FaultSpec(slow_ms=1).fails_call(n) for n in range(1, 10))
    healing = FaultSpec(oom_after=1, recover_after=3)
    assert [healing.fails_call(n) for n in range(1, 6)] == [False, True, True, False, False]
    with pytest.raises(UsageError, match="recover_after=2 for 'openvino' needs oom_after below it"):
        parse_faults({"openvino": {"recover_after": 2}}, BACKENDS)


def test_faulty_runner_wraps_a_real_runner(nano_build: Path) -> None:
    build = BuildDir.open(nano_build)
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with cpu_runner(build, "onnxruntime") as real:
        want = real.infer(x)["logits"]
    runner = FaultyRunner(cpu_runner(build, "onnxruntime"), FaultSpec(oom_after=1), label="onnxruntime")
    with runner:
        np.testing.assert_array_equal(runner.infer(x)["logits"], want)
        with pytest.raises(
            InjectedOutOfMemoryError, match=r"CUDA out of memory: .* call 2 \(oom_after=1\)"
        ) as e:
            runner.infer(x)
        assert isinstance(e.value, CudaOutOfMemoryError) and isinstance(e.value, BackendError)
        assert runner.calls == 2 and runner.injected == 1
    start = FaultyRunner(cpu_runner(build, "openvino"), FaultSpec(fail_at_start=True), label="openvino")
    with pytest.raises(BackendUnavailableError, match="injected start-up failure of openvino"):
        start.activate()
    assert not start.is_active and not start.inner.is_active
    plain = FaultyRunner(cpu_runner(build, "onnxruntime"), FaultSpec(every_nth=1, error="backend"))
    with plain, pytest.raises(InjectedBackendError, match=r"injected fault on call 1 \(every_nth=1\)"):
        plain.infer(x)


def test_planted_leak_keeps_n_bytes_per_call_and_still_answers(nano_build: Path) -> None:
    build = BuildDir.open(nano_build)
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    assert parse_faults({"onnxruntime": {"leak_bytes_per_call": 4096}}, BACKENDS) == {
        "onnxruntime": FaultSpec(leak_bytes_per_call=4096)
    }
    with cpu_runner(build, "onnxruntime") as real:
        want = real.infer(x)["logits"]
    runner = FaultyRunner(cpu_runner(build, "onnxruntime"), FaultSpec(leak_bytes_per_call=4096))
    with runner:
        for _ in range(3):
            np.testing.assert_array_equal(runner.infer(x)["logits"], want)
    assert [a.nbytes for a in runner.leaked] == [4096] * 3 and runner.injected == 0
    assert all(int(a.min()) == int(a.max()) == 0x5A for a in runner.leaked)  # written: resident


def test_time_keys_parse_alone_or_as_a_list() -> None:
    assert parse_faults({"*": {"every_s": 600}}, BACKENDS) == {"*": FaultSpec(every_s=600)}
    both = [{"every_s": 600}, {"once_at_s": 1800, "error": "device_lost"}]
    assert parse_faults({"onnxruntime": both}, BACKENDS) == {
        "onnxruntime": (FaultSpec(every_s=600), FaultSpec(once_at_s=1800, error="device_lost"))
    }
    assert parse_faults({"onnxruntime": [{}]}, BACKENDS) == {}


def test_time_rules_on_a_real_runner(nano_build: Path) -> None:
    build = BuildDir.open(nano_build)
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    with cpu_runner(build, "onnxruntime") as real:
        want = real.infer(x)["logits"]
    clock = Clock()
    specs = (FaultSpec(every_s=10), FaultSpec(once_at_s=25, error="device_lost"), FaultSpec(after_s=50))
    runner = FaultyRunner(
        cpu_runner(build, "onnxruntime"), specs, label="onnxruntime", schedule=FaultSchedule(specs, clock)
    )

    def outcome(t: float) -> str:
        clock.t = t
        try:
            np.testing.assert_array_equal(runner.infer(x)["logits"], want)
        except InjectedOutOfMemoryError:
            return "oom"
        except InjectedDeviceLostError:
            return "lost"
        return "ok"

    with runner:
        got = [outcome(t) for t in (1, 9.9, 10, 10.5, 19, 20, 25, 25.1, 31, 35, 44, 50, 51)]
    # one OOM per 10 s period (its first call), the device lost once at 25 s, every call from 50 s (at
    # 50 s the period's OOM comes first, the persistent rule fails the next call)
    assert got == ["ok", "ok", "oom", "ok", "ok", "oom", "lost", "ok", "oom", "ok", "oom", "oom", "oom"]
    assert runner.schedule.injected() == {
        "oom every_s=10": 5,
        "device_lost once_at_s=25": 1,
        "oom after_s=50": 1,
    }
    assert runner.injected == 7 and runner.calls == 13
    clock.t = 52
    with runner, pytest.raises(InjectedOutOfMemoryError, match=r"call 14 \(after_s=50 at 52.0 s\)"):
        runner.infer(x)


def test_a_period_without_calls_fires_once_and_moments_before_the_start_have_passed() -> None:
    clock = Clock(95.0)  # e.g. a soak resumed at 95 s
    schedule = FaultSchedule((FaultSpec(every_s=10), FaultSpec(once_at_s=30, error="backend")), clock)
    clock.t = 99
    assert schedule.check(1) is None  # the 90 s period began before the start
    clock.t = 135  # 100..130 passed without a call: one fault, not four
    assert schedule.check(2) == (FaultSpec(every_s=10), "every_s=10 at 135.0 s")
    assert schedule.check(3) is None
    assert schedule.injected() == {"oom every_s=10": 1}  # once_at_s=30 lay before the start


def test_a_runtime_keeps_the_schedule_across_fallback_and_recovery(nano_build: Path) -> None:
    clock = Clock()
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    faults = {"onnxruntime": [{"every_s": 10}, {"once_at_s": 15, "error": "device_lost"}]}
    with Runtime(
        nano_build,
        policy=["onnxruntime", "openvino"],
        faults=faults,
        recover_interval_s=0.2,
        fault_clock=clock,
    ) as rt:
        active = []
        for t in (1, 10, 11, 15, 16, 20, 21):
            clock.t = t
            assert rt.infer(x).shape[0] == 1  # a failed batch is re-run on openvino, the standby
            active.append(rt.active_backend)
            deadline = time.monotonic() + 30
            while rt.active_backend != "onnxruntime" and time.monotonic() < deadline:
                time.sleep(0.02)  # the recovery clock (every 0.2 s) brings onnxruntime back
        # an OOM (10 s, 20 s) is transient: onnxruntime keeps the traffic; the lost device (15 s) moves it
        # to openvino; the recovery clock brings onnxruntime back before the next call, with its schedule
        # (20 s fires on the new runner)
        ort, ov = "onnxruntime", "openvino"
        assert active == [ort, ort, ort, ov, ort, ort, ort]
        assert rt.injected_faults() == {
            "onnxruntime: oom every_s=10": 2,
            "onnxruntime: device_lost once_at_s=15": 1,
        }
        assert rt.stats()["fallback_switches"] == 1
        assert rt.stats()["retries"] == {"openvino": {"ok": 3}}


def test_a_star_schedule_injects_one_fault_per_period_whatever_the_backend(nano_build: Path) -> None:
    plan = FaultPlan(parse_faults({"*": {"every_s": 10}}, BACKENDS), clock=Clock(10.0))
    build = BuildDir.open(nano_build)
    ort = plan.wrap(cpu_runner(build, "onnxruntime"), "onnxruntime")
    ov = plan.wrap(cpu_runner(build, "openvino"), "openvino")
    assert isinstance(ort, FaultyRunner) and ort.schedule is ov.schedule
    assert ort.schedule.check(1) is None  # 10 s: the clock's start, a period that has begun
    plan.schedules["*"].clock.t = 20  # type: ignore[attr-defined]
    assert ort.schedule.check(2) is not None and ov.schedule.check(1) is None
    assert plan.injected() == {"*: oom every_s=10": 1}
