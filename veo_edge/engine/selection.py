"""Which TensorRT engine to serve: the one with veo-edge's plugins or TensorRT's own, without TensorRT.

Our kernels run on CUDA cores in FP32 while TensorRT has its own fused attention and tensor-core
convolutions, so the plugin engine is not faster by construction. ``veo-edge engine build`` builds both
engines, runs both on the same seeded inputs, times both trtexec-style (warm-up runs, then the median of N
timed runs, at batch 1 and at the max batch) and keeps, with ``--engine fastest`` (the default), the
plugin engine only when its outputs are equivalent to the plain engine's and it is faster at every batch
timed; a tie goes to the plain engine. The decision and both timings are recorded next to the engines
(:class:`veo_edge.engine.cache.ChoiceRecord`) and shown by ``veo-edge inspect``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from veo_edge.errors import UsageError

ENGINE_MODES = ("fastest", "plugins", "plain")
DEFAULT_MODE = "fastest"
VARIANTS = ("plugins", "plain")
#: trtexec's defaults are 200 ms of warm-up and 10 timed iterations; ours are counted, not timed
WARMUP_RUNS = 10
TIMED_RUNS = 50
#: equivalence of the plugin engine to the plain one, FlashAttention-style: its error against the
#: float32 ONNX Runtime reference may be at most K times the plain engine's, plus a floor relative to
#: the reference's magnitude
EQUIVALENCE_K = 2.0
EQUIVALENCE_FLOOR = {"fp32": 1e-5, "fp16": 1e-3}


def check_mode(mode: str) -> str:
    if mode not in ENGINE_MODES:
        raise UsageError(f"unknown engine choice {mode!r}; choose one of: {', '.join(ENGINE_MODES)}")
    return mode


def variants_to_build(mode: str, has_plugins: bool) -> list[str]:
    """The engines ``mode`` needs: both for ``fastest`` (the plain one alone when the build has no
    plugin graph), one otherwise. Forcing ``plugins`` on a build without them is an error."""
    check_mode(mode)
    if mode == "plugins":
        if not has_plugins:
            raise UsageError(
                "--engine plugins: this build has no plugins_onnx artifact (built with --no-plugins, or "
                "nothing matched); use --engine plain or fastest, or rebuild with plugins"
            )
        return ["plugins"]
    if mode == "plain" or not has_plugins:
        return ["plain"]
    return ["plugins", "plain"]


def median_ms(run: Callable[[], float], warmup: int = WARMUP_RUNS, reps: int = TIMED_RUNS) -> float:
    """trtexec-style timing: ``warmup`` untimed calls, then the median of ``reps`` calls of ``run``, each
    returning the milliseconds it measured (CUDA events around one enqueue, on a GPU)."""
    if warmup < 0 or reps < 1:
        raise UsageError(f"timing needs warmup >= 0 and reps >= 1, got {warmup} and {reps}")
    for _ in range(warmup):
        run()
    return float(statistics.median(run() for _ in range(reps)))


@dataclass(frozen=True)
class Measurement:
    """One engine on the seeded inputs: its median milliseconds per batch size, and its largest error
    against the float32 ONNX Runtime reference over those batches (with the reference's magnitude)."""

    variant: str
    median_ms: dict[int, float]
    max_abs_err: float
    ref_scale: float

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["median_ms"] = {str(k): v for k, v in self.median_ms.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Measurement:
        return cls(
            variant=d["variant"],
            median_ms={int(k): float(v) for k, v in d["median_ms"].items()},
            max_abs_err=float(d["max_abs_err"]),
            ref_scale=float(d["ref_scale"]),
        )


@dataclass(frozen=True)
class Decision:
    mode: str
    chosen: str  # "plugins" | "plain"
    reason: str
    measurements: dict[str, Measurement] = field(default_factory=dict)
    tolerance: float | None = None  # the plugin engine's allowed error, when both were compared

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "chosen": self.chosen,
            "reason": self.reason,
            "tolerance": self.tolerance,
            "measurements": {k: m.to_dict() for k, m in self.measurements.items()},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Decision:
        return cls(
            mode=d["mode"],
            chosen=d["chosen"],
            reason=d["reason"],
            tolerance=d.get("tolerance"),
            measurements={k: Measurement.from_dict(m) for k, m in (d.get("measurements") or {}).items()},
        )

    def lines(self) -> list[str]:
        """Human-readable: the choice and why, then one line per engine."""
        out = [f"engine: {self.chosen} ({self.mode}): {self.reason}"]
        for name in VARIANTS:
            m = self.measurements.get(name)
            if m is not None:
                times = ", ".join(f"batch {b}: {ms:.3f} ms" for b, ms in sorted(m.median_ms.items()))
                out.append(
                    f"  {name}: {times}; max abs err {m.max_abs_err:.3g} (ref scale {m.ref_scale:.3g})"
                )
        return out


def tolerance(plain: Measurement, precision: str) -> float:
    return EQUIVALENCE_K * plain.max_abs_err + EQUIVALENCE_FLOOR[precision] * plain.ref_scale


def decide(mode: str, measurements: Sequence[Measurement], precision: str) -> Decision:
    """The engine to serve for ``mode`` from what was measured (one or both variants)."""
    check_mode(mode)
    if precision not in EQUIVALENCE_FLOOR:
        raise UsageError(f"unknown precision {precision!r}; choose one of: {', '.join(EQUIVALENCE_FLOOR)}")
    by = {m.variant: m for m in measurements}
    unknown = set(by) - set(VARIANTS)
    if unknown:
        raise UsageError(f"unknown engine variant(s) {sorted(unknown)}; expected {', '.join(VARIANTS)}")
    if mode != "fastest":
        if mode not in by:
            raise UsageError(f"--engine {mode}: no {mode} engine was measured")
        return Decision(mode, mode, f"--engine {mode} was asked for", by)
    if "plain" not in by:
        raise UsageError("--engine fastest needs the plain engine measured (TensorRT's own is the baseline)")
    plain = by["plain"]
    if "plugins" not in by:
        return Decision(mode, "plain", "the build has no plugin graph: TensorRT's own engine", by)
    plug = by["plugins"]
    tol = tolerance(plain, precision)
    if not plug.max_abs_err <= tol:  # a NaN error is never equivalent
        return Decision(
            mode,
            "plain",
            f"the plugin engine's outputs are not equivalent: max abs err {plug.max_abs_err:.3g} > "
            f"{tol:.3g} ({EQUIVALENCE_K:g} x the plain engine's {plain.max_abs_err:.3g} + floor)",
            by,
            tol,
        )
    batches = sorted(set(plain.median_ms) & set(plug.median_ms))
    if not batches or set(batches) != set(plain.median_ms) | set(plug.median_ms):
        raise UsageError(
            f"the two engines were timed at different batch sizes ({sorted(plug.median_ms)} vs "
            f"{sorted(plain.median_ms)}); time both at the same ones"
        )
    slower = [b for b in batches if not plug.median_ms[b] < plain.median_ms[b]]
    if slower:
        b = slower[0]
        return Decision(
            mode,
            "plain",
            f"the plugin engine is not faster at batch {b} ({plug.median_ms[b]:.3f} ms vs "
            f"{plain.median_ms[b]:.3f} ms): TensorRT's own engine is kept",
            by,
            tol,
        )
    gains = ", ".join(f"batch {b}: {plain.median_ms[b] / plug.median_ms[b]:.2f}x" for b in batches)
    return Decision(mode, "plugins", f"equivalent and faster at every batch timed ({gains})", by, tol)
