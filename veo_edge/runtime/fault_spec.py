"""Fault injection: make a real runner fail at start, fail by call count or on a time schedule, or slow down.

Faults are configuration, not mocks: :class:`FaultyRunner` wraps the real OpenVINO / ONNX Runtime /
TensorRT runner and lets it compute every answer it does give (``"error": "wrong"`` changes that answer
after the real runner computed it), so the runtime's fallback paths run end
to end on a CPU-only machine. The configuration maps a backend name (or ``"*"`` for every backend) to a
spec::

    Runtime(build, policy=["onnxruntime", "openvino"], faults={"onnxruntime": {"oom_after": 5}})
    VEO_EDGE_FAULTS='{"openvino": {"fail_at_start": true}}' veo-edge serve ...

Spec keys (all optional):

``fail_at_start`` (a JSON boolean)
    activation raises :class:`~veo_edge.errors.BackendUnavailableError`: the candidate is skipped.
``oom_after`` (int N)
    calls 1..N run, every call after the Nth fails (a persistent out-of-memory, as on a real GPU).
``recover_after`` (int M, with ``oom_after`` N)
    calls N+1..M fail, calls after M run again (a fault that heals: a GPU reset, a freed device).
``dead_after`` (int N)
    calls 1..N of the entry, counted over every runner made for it, run; every later call fails, also on
    a runner activated again by a recovery (a backend gone for good; with ``"*"``, every backend).
``every_nth`` (int N)
    calls N, 2N, 3N ... fail (a transient fault).
``every_s`` (float X)
    one call fails in each X seconds: the first call at or after X, 2X, 3X ... s (a transient fault; a
    period without calls is skipped, not made up for by a burst).
``after_s`` (float X)
    every call from X seconds on fails (a persistent fault).
``once_at_s`` (float X)
    the first call at or after X seconds fails, once (e.g. the GPU lost once).
``slow_ms`` (float, 0 to 600000)
    every call sleeps this long before running.
``leak_bytes_per_call`` (int N, at most 1 GiB)
    every call keeps N more bytes alive (written, so resident) for as long as the runner lives: a planted
    leak of a known rate, for ``veo-edge soak`` to find.
``error`` ("oom" | "device_lost" | "backend" | "wrong", default "oom")
    what an injected failure raises: :class:`InjectedOutOfMemoryError` (a
    :class:`~veo_edge.errors.CudaOutOfMemoryError`, the class the TensorRT path raises for a real CUDA
    OOM), :class:`InjectedDeviceLostError` or a plain :class:`InjectedBackendError`; ``"wrong"`` raises
    nothing: the call answers, wrongly (the real output plus 1 in every value), as a backend with
    corrupt weights in memory or a failing device would, for the golden canary to notice. ``error``
    needs a rule that names the calls (``oom_after``, ``dead_after``, ``every_nth`` or a time rule);
    alone it is refused.

A backend may also take a list of specs, each with its own ``error``::

    {"onnxruntime": [{"every_s": 600, "error": "oom"}, {"once_at_s": 1800, "error": "device_lost"}]}

Times are seconds on the fault clock: by default the monotonic time since the runtime was created
(``Runtime(fault_clock=...)`` gives another, e.g. a soak's run time, so a resumed run keeps its
schedule). The time rules of one entry (a backend name or ``"*"``) keep their state across the runners
the runtime makes for it: a backend that recovers after a fault does not start its schedule over, and a
``"*"`` schedule injects one fault per period into whichever backend is active, not one per backend.
Moments before the clock's reading when the runtime was created have passed: they never fire. Call
counts are per runner (a recovered backend counts from 1 again). Injected failures are raised before the
wrapped runner runs, so a failed call leaves it untouched; a ``"wrong"`` call runs it and adds 1 to its
answer.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from veo_edge.errors import UsageError

ENV_VAR = "VEO_EDGE_FAULTS"
ALL = "*"
_ERRORS = ("oom", "device_lost", "backend", "wrong")
TIME_KEYS = ("every_s", "after_s", "once_at_s")
#: the rules that name the calls an injected failure (``error``) fails
CALL_KEYS = ("oom_after", "dead_after", "every_nth", *TIME_KEYS)
#: the longest ``slow_ms`` taken (10 minutes a call), and the most ``leak_bytes_per_call`` (1 GiB a call)
SLOW_MS_MAX = 600_000
LEAK_MAX = 1 << 30


def _number(v: object) -> bool:
    """A finite JSON number (``true`` and ``false`` are not numbers here)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class FaultSpec:
    fail_at_start: bool = False
    oom_after: int | None = None
    dead_after: int | None = None
    recover_after: int | None = None
    every_nth: int | None = None
    slow_ms: float = 0.0
    leak_bytes_per_call: int = 0
    every_s: float | None = None
    after_s: float | None = None
    once_at_s: float | None = None
    error: str = "oom"

    @classmethod
    def from_dict(cls, backend: str, raw: Mapping[str, Any]) -> FaultSpec:
        if not isinstance(raw, Mapping):
            raise UsageError(
                f"fault spec for {backend!r} is a {type(raw).__name__}, expected an object such as "
                '{"oom_after": 5}'
            )
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(raw) - known)
        if unknown:
            raise UsageError(
                f"unknown fault option(s) {unknown} for {backend!r}; choose from: {', '.join(sorted(known))}"
            )
        spec = cls(**raw)
        for key in ("oom_after", "dead_after", "every_nth", "recover_after"):
            v, least = getattr(spec, key), 0 if key in ("oom_after", "dead_after") else 1
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < least):
                raise UsageError(
                    f"fault option {key}={v!r} for {backend!r} is invalid; expected an integer >= {least}"
                )
        leak = spec.leak_bytes_per_call
        if not isinstance(leak, int) or isinstance(leak, bool) or not 0 <= leak <= LEAK_MAX:
            raise UsageError(
                f"fault option leak_bytes_per_call={leak!r} for {backend!r} is invalid; expected an integer "
                f"from 0 to {LEAK_MAX} (bytes kept alive per call)"
            )
        if spec.recover_after is not None and (
            spec.oom_after is None or spec.recover_after <= spec.oom_after
        ):
            raise UsageError(
                f"fault option recover_after={spec.recover_after} for {backend!r} needs oom_after below it, "
                'e.g. {"oom_after": 5, "recover_after": 8}'
            )
        for key in TIME_KEYS:
            v = getattr(spec, key)
            if v is None:
                continue
            if not _number(v) or not (v > 0 if key == "every_s" else v >= 0):
                raise UsageError(
                    f"fault option {key}={v!r} for {backend!r} is invalid; expected a number of seconds "
                    f"{'> 0' if key == 'every_s' else '>= 0'}"
                )
        slow = spec.slow_ms
        if not _number(slow) or not 0 <= slow <= SLOW_MS_MAX:
            raise UsageError(
                f"fault option slow_ms={slow!r} for {backend!r} is invalid; expected a number of "
                f"milliseconds from 0 to {SLOW_MS_MAX:g}"
            )
        if not isinstance(spec.fail_at_start, bool):
            raise UsageError(
                f"fault option fail_at_start={spec.fail_at_start!r} for {backend!r} is invalid; expected "
                "true or false (a JSON boolean)"
            )
        if not isinstance(spec.error, str) or spec.error not in _ERRORS:
            raise UsageError(
                f"fault option error={spec.error!r} for {backend!r} is unknown; choose one of: {', '.join(_ERRORS)}"
            )
        if "error" in raw and not any(getattr(spec, k) is not None for k in CALL_KEYS):
            raise UsageError(
                f"fault option error={spec.error!r} for {backend!r} names no call to fail; add a rule that "
                f"does ({', '.join(CALL_KEYS)}), e.g. "
                f'{{"{backend}": {{"every_nth": 3, "error": "{spec.error}"}}}}'
            )
        return spec

    @property
    def active(self) -> bool:
        return bool(
            self.fail_at_start
            or self.oom_after is not None
            or self.dead_after is not None
            or self.every_nth
            or self.slow_ms
            or self.leak_bytes_per_call
            or any(getattr(self, k) is not None for k in TIME_KEYS)
        )

    def fails_call(self, n: int) -> bool:
        """Whether call number ``n`` (1-based) fails by its count (the time rules: :class:`FaultSchedule`)."""
        return self.call_rule(n) is not None

    def call_rule(self, n: int) -> str | None:
        """The call-count rule that fails call ``n``, as ``key=value``; ``None`` when none does."""
        healed = self.recover_after is not None and n > self.recover_after
        if self.oom_after is not None and n > self.oom_after and not healed:
            return f"oom_after={self.oom_after}"
        if self.every_nth and n % self.every_nth == 0:
            return f"every_nth={self.every_nth}"
        return None


#: a backend name (or ``"*"``) -> its spec, or its specs when the configuration gave a list
Faults = dict[str, FaultSpec | tuple[FaultSpec, ...]]


def specs_of(value: FaultSpec | Sequence[FaultSpec]) -> tuple[FaultSpec, ...]:
    return (value,) if isinstance(value, FaultSpec) else tuple(value)


def parse_faults(faults: Mapping[str, Any] | str | None, known_backends: tuple[str, ...]) -> Faults:
    """Backend name -> :class:`FaultSpec` from a dict or JSON text; ``None`` reads ``$VEO_EDGE_FAULTS``."""
    source = "faults"
    if faults is None:
        faults = os.environ.get(ENV_VAR) or None
        source = ENV_VAR
        if faults is None:
            return {}
    if isinstance(faults, str):
        try:
            faults = json.loads(faults)
        except ValueError as e:
            raise UsageError(
                f'{source} is not valid JSON ({e}); expected e.g. {{"onnxruntime": {{"oom_after": 5}}}}'
            ) from e
    if not isinstance(faults, Mapping):
        raise UsageError(
            f"{source} must be an object of backend name -> fault spec, got {type(faults).__name__}"
        )
    out = {}
    for backend, raw in faults.items():
        if backend != ALL and backend not in known_backends:
            raise UsageError(
                f"{source} names backend {backend!r}; fault specs are keyed by a backend name "
                f"({', '.join(known_backends)}) or {ALL!r} for all, e.g. "
                '{"onnxruntime": {"every_nth": 3}}'
            )
        if isinstance(raw, list):
            specs = tuple(s for s in (FaultSpec.from_dict(backend, r) for r in raw) if s.active)
            if specs:
                out[backend] = specs
            continue
        spec = FaultSpec.from_dict(backend, raw)
        if spec.active:
            out[backend] = spec
    return out


def spec_for(faults: Mapping[str, Any], backend: str) -> FaultSpec | tuple[FaultSpec, ...] | None:
    return faults.get(backend) or faults.get(ALL)
