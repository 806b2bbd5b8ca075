"""Fault injection at run time: :class:`FaultyRunner` wraps a real runner and fails, slows or leaks by the
rules of a fault configuration (what the keys mean and how they are parsed: :mod:`veo_edge.runtime.fault_spec`,
whose names this module re-exports); :class:`FaultSchedule` keeps an entry's state across the runners made
for it, :class:`FaultPlan` wraps each runner a runtime makes. Injected failures are raised before the
wrapped runner runs, so a failed call leaves it untouched; a ``"wrong"`` call runs it and adds 1 to its
answer.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from veo_edge.errors import BackendError, BackendUnavailableError, CudaOutOfMemoryError, DeviceLostError
from veo_edge.runtime.backends.base import Runner, TensorMeta
from veo_edge.runtime.fault_spec import (
    ALL,
    ENV_VAR,
    TIME_KEYS,
    Faults,
    FaultSpec,
    parse_faults,
    spec_for,
    specs_of,
)

__all__ = [
    "ALL",
    "ENV_VAR",
    "FaultPlan",
    "FaultSchedule",
    "FaultSpec",
    "Faults",
    "FaultyRunner",
    "InjectedBackendError",
    "InjectedDeviceLostError",
    "InjectedOutOfMemoryError",
    "parse_faults",
    "spec_for",
]


class InjectedOutOfMemoryError(CudaOutOfMemoryError):
    """An out-of-memory injected by the fault configuration (looks like a real CUDA OOM)."""


class InjectedDeviceLostError(DeviceLostError):
    """A lost device injected by the fault configuration."""


class InjectedBackendError(BackendError):
    """A backend failure injected by the fault configuration."""


class FaultSchedule:
    """The rules of one fault entry and the state they keep across runners: which time periods and
    one-off moments have fired, and how many faults each rule injected."""

    def __init__(
        self, specs: FaultSpec | Sequence[FaultSpec], clock: Callable[[], float] | None = None
    ) -> None:
        self.specs = specs_of(specs)
        if clock is None:
            origin = time.monotonic()

            def clock() -> float:
                return time.monotonic() - origin

        self.clock = clock
        self.start = clock()
        # every_s: the last period that fired (the periods up to the start have passed)
        self._period = [math.floor(self.start / s.every_s) if s.every_s else 0 for s in self.specs]
        self._once_done = [s.once_at_s is not None and s.once_at_s < self.start for s in self.specs]
        self.counts: dict[tuple[str, str], int] = {}
        self.calls = 0  # calls of the entry over all its runners (dead_after)
        self._lock = threading.Lock()

    @property
    def timed(self) -> bool:
        return any(getattr(s, k) is not None for s in self.specs for k in TIME_KEYS)

    def check(self, n: int) -> tuple[FaultSpec, str] | None:
        """The spec and rule (with the moment, for a time rule) that fail call ``n`` of a runner now
        (counted), or ``None``."""
        with self._lock:
            t = self.clock() if self.timed else None
            self.calls += 1
            for i, spec in enumerate(self.specs):
                rule = spec.call_rule(n)
                if rule is None and spec.dead_after is not None and self.calls > spec.dead_after:
                    rule = f"dead_after={spec.dead_after}"
                moment = ""
                if rule is None and t is not None:
                    rule = self._time_rule(i, spec, t)
                    moment = f" at {t:.1f} s"
                if rule is not None:
                    key = (spec.error, rule)
                    self.counts[key] = self.counts.get(key, 0) + 1
                    return spec, rule + moment
        return None

    def _time_rule(self, i: int, spec: FaultSpec, t: float) -> str | None:
        if spec.after_s is not None and t >= spec.after_s:
            return f"after_s={spec.after_s:g}"
        if spec.once_at_s is not None and not self._once_done[i] and t >= spec.once_at_s:
            self._once_done[i] = True
            return f"once_at_s={spec.once_at_s:g}"
        if spec.every_s:
            period = math.floor(t / spec.every_s)
            if period > self._period[i]:
                self._period[i] = period
                return f"every_s={spec.every_s:g}"
        return None

    def injected(self) -> dict[str, int]:
        """``"error rule"`` -> faults injected so far."""
        with self._lock:
            return {f"{error} {rule}": n for (error, rule), n in self.counts.items()}


class FaultPlan:
    """The faults of one runtime: wraps each runner it makes, keeps each entry's schedule across them."""

    def __init__(self, faults: Mapping[str, Any], clock: Callable[[], float] | None = None) -> None:
        self.schedules = {key: FaultSchedule(value, clock) for key, value in faults.items()}

    def wrap(self, runner: Runner, backend: str) -> Runner:
        key = backend if backend in self.schedules else ALL
        schedule = self.schedules.get(key)
        if schedule is None:
            return runner
        return FaultyRunner(runner, schedule.specs, label=backend, schedule=schedule)

    def injected(self) -> dict[str, int]:
        """``"entry: error rule"`` -> faults injected so far, e.g. ``{"onnxruntime: oom every_s=600": 3}``."""
        return {
            f"{key}: {label}": n
            for key, schedule in self.schedules.items()
            for label, n in schedule.injected().items()
        }


class FaultyRunner(Runner):
    """A real runner with faults injected in front of it (see the module docstring)."""

    def __init__(
        self,
        inner: Runner,
        spec: FaultSpec | Sequence[FaultSpec],
        label: str | None = None,
        schedule: FaultSchedule | None = None,
    ) -> None:
        super().__init__(inner.max_batch)
        self.inner = inner
        self.spec = spec
        self.specs = specs_of(spec)
        self.schedule = schedule if schedule is not None else FaultSchedule(self.specs)
        self.name = inner.name
        self.label = label or inner.name
        self.calls = 0
        self.injected = 0
        self.leaked: list[np.ndarray] = []  # leak_bytes_per_call: kept alive as long as the runner
        self._lock = threading.Lock()

    def _activate(self) -> None:
        if any(s.fail_at_start for s in self.specs):
            raise BackendUnavailableError(
                f"injected start-up failure of {self.label} (fault configuration fail_at_start); "
                f"remove it from the faults or ${ENV_VAR} to use this backend"
            )
        self.inner.activate()
        self.max_batch = self.inner.max_batch  # a backend may settle on less when it activates

    def _deactivate(self) -> None:
        self.inner.deactivate()

    def input_metadata(self) -> list[TensorMeta]:
        return self.inner.input_metadata()

    def output_metadata(self) -> list[TensorMeta]:
        return self.inner.output_metadata()

    def infer(self, feed: dict[str, np.ndarray] | np.ndarray) -> dict[str, np.ndarray]:
        self._require_active()
        leak = sum(s.leak_bytes_per_call for s in self.specs)
        with self._lock:
            self.calls += 1
            n = self.calls
            if leak:  # np.full writes every page: the leak is resident
                self.leaked.append(np.full(leak, 0x5A, dtype=np.uint8))
        slow_ms = sum(s.slow_ms for s in self.specs)
        if slow_ms:
            time.sleep(slow_ms / 1e3)
        fired = self.schedule.check(n)
        if fired is not None:
            spec, rule = fired
            with self._lock:
                self.injected += 1
            if spec.error == "wrong":  # it answers, wrongly: only a canary (readiness, warm-up) notices
                return {k: v + 1.0 for k, v in self.inner.infer(feed).items()}
            msg = f"{self.label}: injected fault on call {n} ({rule})"
            if spec.error == "oom":
                raise InjectedOutOfMemoryError(f"CUDA out of memory: {msg}")
            if spec.error == "device_lost":
                raise InjectedDeviceLostError(f"device lost: {msg}")
            raise InjectedBackendError(msg)
        return self.inner.infer(feed)

    def measured_batch_limit(self) -> int | None:
        return self.inner.measured_batch_limit()

    def warm_up(self, sizes: Sequence[int], in_flight: int = 1) -> int:
        # straight to the real runner: warming is not traffic, so it neither counts toward nor fires a fault
        return self.inner.warm_up(sizes, in_flight)

    def _infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:  # pragma: no cover
        return self.inner.infer(feed)

    def describe(self) -> dict[str, Any]:
        faults = [{k: v for k, v in vars(s).items() if v} for s in self.specs]
        return {**self.inner.describe(), "faults": faults[0] if len(faults) == 1 else faults}
