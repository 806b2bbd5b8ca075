"""The golden canary rule: a backend reproduces the canary when its output for the canary input is
within ``atol`` (max abs error) of the expected output and their cosine is at least ``min_cosine``.

The build checks every backend with it when it records the canary; the server (readiness) and
``veo-edge healthcheck`` check with it later.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

#: the cosine every backend's canary output must reach (recorded in the manifest)
MIN_COSINE = 0.999


@dataclass(frozen=True)
class Canary:
    input: np.ndarray  # with the batch axis, batch 1
    expected: np.ndarray  # with the batch axis, batch 1
    atol: float
    min_cosine: float


@dataclass(frozen=True)
class CanaryResult:
    ok: bool
    max_abs: float
    cosine: float
    atol: float
    min_cosine: float
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_canary(output: np.ndarray, canary: Canary) -> CanaryResult:
    """Max abs error and cosine of ``output`` against the golden output."""
    got = np.asarray(output, dtype=np.float64)
    want = canary.expected.astype(np.float64)
    if got.shape != want.shape:
        return CanaryResult(
            False,
            float("inf"),
            0.0,
            canary.atol,
            canary.min_cosine,
            f"canary output has shape {list(got.shape)}, the golden one {list(want.shape)}",
        )
    max_abs = float(np.abs(got - want).max()) if got.size else 0.0
    denom = float(np.linalg.norm(got) * np.linalg.norm(want))
    cosine = float(np.dot(got.ravel(), want.ravel()) / denom) if denom else float(max_abs == 0.0)
    if not np.isfinite(max_abs):
        max_abs, cosine = float("inf"), 0.0
    reason = None
    if max_abs > canary.atol:
        reason = f"canary max abs error {max_abs:.3g} > tolerance {canary.atol:.3g}"
    elif cosine < canary.min_cosine:
        reason = f"canary cosine {cosine:.6f} < {canary.min_cosine}"
    return CanaryResult(reason is None, max_abs, cosine, canary.atol, canary.min_cosine, reason)
