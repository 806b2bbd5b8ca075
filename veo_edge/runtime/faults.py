"""Fault injection: make a real runner fail at start, fail after N calls or every Nth call, or slow down.

Faults are configuration, not mocks: :class:`FaultyRunner` wraps the real OpenVINO / ONNX Runtime /
TensorRT runner and lets it compute every answer it does give, so the runtime's fallback paths run end
to end on a CPU-only machine. The configuration maps a backend name (or ``"*"`` for every backend) to a
spec::

    Runtime(build, policy=["onnxruntime", "openvino"], faults={"onnxruntime": {"oom_after": 5}})
    VEO_EDGE_FAULTS='{"openvino": {"fail_at_start": true}}' veo-edge serve ...

Spec keys (all optional):

``fail_at_start`` (bool)
    activation raises :class:`~veo_edge.errors.BackendUnavailableError`: the candidate is skipped.
``oom_after`` (int N)
    calls 1..N run, every call after the Nth fails (a persistent out-of-memory, as on a real GPU).
``recover_after`` (int M, with ``oom_after`` N)
    calls N+1..M fail, calls after M run again (a fault that heals: a GPU reset, a freed device).
``every_nth`` (int N)
    calls N, 2N, 3N ... fail (a transient fault).
``slow_ms`` (float)
    every call sleeps this long before running.
``leak_bytes_per_call`` (int N)
    every call keeps N more bytes alive (written, so resident) for as long as the runner lives: a planted
    leak of a known rate, for ``veo-edge soak`` to find.
``error`` ("oom" | "device_lost" | "backend", default "oom")
    what an injected failure raises: :class:`InjectedOutOfMemoryError` (a
    :class:`~veo_edge.errors.CudaOutOfMemoryError`, the class the TensorRT path raises for a real CUDA
    OOM), :class:`InjectedDeviceLostError` or a plain :class:`InjectedBackendError`.

Injected faults are raised before the wrapped runner runs, so a failed call leaves it untouched.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from veo_edge.errors import (
    BackendError,
    BackendUnavailableError,
    CudaOutOfMemoryError,
    DeviceLostError,
    UsageError,
)
from veo_edge.runtime.backends.base import Runner, TensorMeta

ENV_VAR = "VEO_EDGE_FAULTS"
ALL = "*"
_ERRORS = ("oom", "device_lost", "backend")


class InjectedOutOfMemoryError(CudaOutOfMemoryError):
    """An out-of-memory injected by the fault configuration (looks like a real CUDA OOM)."""


class InjectedDeviceLostError(DeviceLostError):
    """A lost device injected by the fault configuration."""


class InjectedBackendError(BackendError):
    """A backend failure injected by the fault configuration."""


@dataclass(frozen=True)
class FaultSpec:
    fail_at_start: bool = False
    oom_after: int | None = None
    recover_after: int | None = None
    every_nth: int | None = None
    slow_ms: float = 0.0
    leak_bytes_per_call: int = 0
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
        for key in ("oom_after", "every_nth", "recover_after"):
            v = getattr(spec, key)
            if v is not None and (
                not isinstance(v, int) or isinstance(v, bool) or v < (0 if key == "oom_after" else 1)
            ):
                raise UsageError(
                    f"fault option {key}={v!r} for {backend!r} is invalid; expected an integer "
                    f">= {0 if key == 'oom_after' else 1}"
                )
        leak = spec.leak_bytes_per_call
        if not isinstance(leak, int) or isinstance(leak, bool) or leak < 0:
            raise UsageError(
                f"fault option leak_bytes_per_call={leak!r} for {backend!r} is invalid; expected an integer "
                ">= 0 (bytes kept alive per call)"
            )
        if spec.recover_after is not None and (
            spec.oom_after is None or spec.recover_after <= spec.oom_after
        ):
            raise UsageError(
                f"fault option recover_after={spec.recover_after} for {backend!r} needs oom_after below it, "
                'e.g. {"oom_after": 5, "recover_after": 8}'
            )
        if not isinstance(spec.slow_ms, int | float) or spec.slow_ms < 0:
            raise UsageError(f"fault option slow_ms={spec.slow_ms!r} for {backend!r} must be a number >= 0")
        if spec.error not in _ERRORS:
            raise UsageError(
                f"fault option error={spec.error!r} for {backend!r} is unknown; choose one of: {', '.join(_ERRORS)}"
            )
        return spec

    @property
    def active(self) -> bool:
        return bool(
            self.fail_at_start
            or self.oom_after is not None
            or self.every_nth
            or self.slow_ms
            or self.leak_bytes_per_call
        )

    def fails_call(self, n: int) -> bool:
        """Whether call number ``n`` (1-based) fails."""
        healed = self.recover_after is not None and n > self.recover_after
        if self.oom_after is not None and n > self.oom_after and not healed:
            return True
        return bool(self.every_nth) and n % self.every_nth == 0


def parse_faults(
    faults: Mapping[str, Any] | str | None, known_backends: tuple[str, ...]
) -> dict[str, FaultSpec]:
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
        spec = FaultSpec.from_dict(backend, raw)
        if spec.active:
            out[backend] = spec
    return out


def spec_for(faults: Mapping[str, FaultSpec], backend: str) -> FaultSpec | None:
    return faults.get(backend) or faults.get(ALL)


class FaultyRunner(Runner):
    """A real runner with faults injected in front of it (see the module docstring)."""

    def __init__(self, inner: Runner, spec: FaultSpec, label: str | None = None) -> None:
        super().__init__(inner.max_batch)
        self.inner = inner
        self.spec = spec
        self.name = inner.name
        self.label = label or inner.name
        self.calls = 0
        self.injected = 0
        self.leaked: list[np.ndarray] = []  # leak_bytes_per_call: kept alive as long as the runner
        self._lock = threading.Lock()

    def _activate(self) -> None:
        if self.spec.fail_at_start:
            raise BackendUnavailableError(
                f"injected start-up failure of {self.label} (fault configuration fail_at_start); "
                f"remove it from the faults or ${ENV_VAR} to use this backend"
            )
        self.inner.activate()

    def _deactivate(self) -> None:
        self.inner.deactivate()

    def input_metadata(self) -> list[TensorMeta]:
        return self.inner.input_metadata()

    def output_metadata(self) -> list[TensorMeta]:
        return self.inner.output_metadata()

    def infer(self, feed: dict[str, np.ndarray] | np.ndarray) -> dict[str, np.ndarray]:
        self._require_active()
        with self._lock:
            self.calls += 1
            n = self.calls
            if self.spec.leak_bytes_per_call:  # np.full writes every page: the leak is resident
                self.leaked.append(np.full(self.spec.leak_bytes_per_call, 0x5A, dtype=np.uint8))
        if self.spec.slow_ms:
            time.sleep(self.spec.slow_ms / 1e3)
        if self.spec.fails_call(n):
            with self._lock:
                self.injected += 1
            rule = (
                f"oom_after={self.spec.oom_after}"
                if self.spec.oom_after is not None and n > self.spec.oom_after
                else f"every_nth={self.spec.every_nth}"
            )
            msg = f"{self.label}: injected fault on call {n} ({rule})"
            if self.spec.error == "oom":
                raise InjectedOutOfMemoryError(f"CUDA out of memory: {msg}")
            if self.spec.error == "device_lost":
                raise InjectedDeviceLostError(f"device lost: {msg}")
            raise InjectedBackendError(msg)
        return self.inner.infer(feed)

    def _infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:  # pragma: no cover
        return self.inner.infer(feed)

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "faults": {k: v for k, v in vars(self.spec).items() if v}}
