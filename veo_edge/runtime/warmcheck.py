"""The warm-up a standby backend passes before it takes any traffic: the build's golden canary, repeated to
the largest batch the build serves, each answer held to the canary rule of the precision the backend
computes at (an int8 build's ONNX Runtime standby computes f32 and meets the f32 rule).

One batch does both jobs: the backend sets up its largest shape before a retry or a switch needs it, and
a backend that answers wrongly is skipped with the reason instead of taking traffic.
"""

from __future__ import annotations

import threading

import numpy as np

from veo_edge.builddir import BuildDir
from veo_edge.export.canary import Canary, CanaryResult, compare_rows, golden_canary
from veo_edge.runtime.backends.base import Runner


class WarmCheck:
    """``check(name, runner)`` for :class:`~veo_edge.runtime.fallback.Fallback` over ``build``."""

    def __init__(self, build: BuildDir, input_name: str, output_name: str) -> None:
        self.build = build
        self.input_name, self.output_name = input_name, output_name
        self._canaries: dict[str, Canary] = {}  # precision -> the canary with its rule, read once
        self._lock = threading.Lock()

    def canary(self, precision: str) -> Canary:
        with self._lock:
            if precision not in self._canaries:
                self._canaries[precision] = golden_canary(self.build, precision)
            return self._canaries[precision]

    def __call__(self, name: str, runner: Runner) -> CanaryResult:
        precision = str(runner.describe().get("precision") or "f32")
        canary = self.canary(precision)
        batch = runner.max_batch or self.build.max_batch
        dtype = np.dtype(self.build.manifest["inputs"][0]["dtype"])
        x = np.repeat(canary.input, batch, axis=0).astype(dtype, copy=False)
        return compare_rows(runner.infer({self.input_name: x})[self.output_name], canary)
