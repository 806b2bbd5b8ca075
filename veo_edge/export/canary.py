"""The golden canary rule: a backend reproduces the canary when its output for the canary input is
within ``atol`` (max abs error) of the expected output and their cosine is at least ``min_cosine``.

The build checks every backend with it when it records the canary; the runtime warms a standby backend
with it (the canary input repeated to the largest batch), the server (readiness) and ``veo-edge
healthcheck`` check with it later. Each precision a build serves has its own rule (``canary.precisions``
beside the f32 one): a backend is held to the rule of the precision it computes at.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from veo_edge.builddir import BuildDir
from veo_edge.errors import ArtifactMismatchError, BuildDirError

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


def compare_rows(output: np.ndarray, canary: Canary) -> CanaryResult:
    """The rule on every row of a batch whose every sample is the canary input: the first failing row's
    result, else the worst row's."""
    rows = [compare_canary(output[i : i + 1], canary) for i in range(len(output))]
    failed = [r for r in rows if not r.ok]
    return failed[0] if failed else max(rows, key=lambda r: r.max_abs)


def golden_canary(build: BuildDir, precision: str | None = None) -> Canary:
    """The build's golden canary, its files checked against the manifest's checksums, with the rule of
    ``precision`` (default: the CPU precision the build serves on OpenVINO; f32 where the build records
    no rule of its own for it). A file that differs from the manifest is an
    :class:`ArtifactMismatchError`; a canary that is missing or unreadable a :class:`BuildDirError`."""
    spec = build.manifest.get("canary")
    if not spec:
        raise BuildDirError(f"build {build.path} records no canary; rebuild it with this veo-edge")
    try:
        x = np.load(build.artifact("canary_input"), allow_pickle=False)
        expected = np.load(build.artifact("canary_expected"), allow_pickle=False)
    except ArtifactMismatchError:
        raise
    except (BuildDirError, OSError, ValueError) as e:
        raise BuildDirError(f"the golden canary of {build.path} is unusable: {e}") from e
    if precision is None:
        precision = str((build.manifest.get("cpu_precision") or {}).get("served", {}).get("openvino", "f32"))
    tol = (spec.get("precisions") or {}).get(precision, spec)
    return Canary(x, expected, float(tol["atol"]), float(tol["min_cosine"]))


def canary_sample(loaded: Any, calibration: Any, val: Any, seed: int) -> tuple[np.ndarray, dict[str, Any]]:
    """The canary input ``(1, *input_shape)`` and what the manifest says of it: a real sample where there
    is one, so that a reduced precision's rule (derived from its error on this input) is tight and a
    broken backend cannot pass it. In order: the first sample of a built-in model's test split, of
    ``val``, of ``calibration``; a seeded standard-normal one (stated with its seed) when nothing else
    exists. ``loaded``: the :class:`~veo_edge.export.source.LoadedModel`; ``val``, ``calibration``: the
    :class:`~veo_edge.export.calibration.Data` read from those flags, or ``None``."""
    shape = tuple(loaded.input_shape)
    data = None
    if str(loaded.source).startswith("builtin:"):
        from veo_edge.models.registry import builtin_data

        data = builtin_data(loaded.name)
    if data is not None:
        x, where = data.test_split().x[:1], f"{loaded.name} test split, sample 0 ({data.describe_split()})"
    elif val is not None or calibration is not None:
        flag, data = ("--val", val) if val is not None else ("--calibration", calibration)
        x, where = data.x[:1], f"{flag} {data.source}, sample 0"
    else:
        from veo_edge.export.parity import seeded_inputs

        x = seeded_inputs(shape, 1, seed)
        return x, {
            "source": f"seeded standard-normal input (seed {seed}): the build had no data",
            "seed": seed,
        }
    return np.ascontiguousarray(x, dtype=np.float32), {"source": where}
