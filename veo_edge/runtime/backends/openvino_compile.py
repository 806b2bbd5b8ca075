"""How veo-edge compiles an IR with OpenVINO, wherever it does (the runner, the build's checks, tests,
benchmarks): every compile states its inference precision and its performance hint, the precision a
build may serve and what this CPU runs natively, and a batch-1 copy of a model for the static compiles.

The runner that serves the compiles is :mod:`veo_edge.runtime.backends.openvino`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from veo_edge.errors import UsageError

# OpenVINO's names for the execution precisions veo-edge asks for. Every compile states one: left to
# itself the CPU plugin picks bf16 on CPUs with AVX512-BF16 or AMX, and the results change with the machine.
INFERENCE_PRECISIONS = {"f32": "f32", "bf16": "bf16"}


def compile_config(
    precision: str = "f32", threads: int | None = None, hint: str = "LATENCY"
) -> dict[str, Any]:
    """The config of every OpenVINO compile in veo-edge (runtime, build checks, tests): precision stated."""
    if precision not in INFERENCE_PRECISIONS:
        raise ValueError(
            f"unknown OpenVINO inference precision {precision!r}; choose one of: {', '.join(INFERENCE_PRECISIONS)}"
        )
    if hint not in ("LATENCY", "THROUGHPUT"):
        raise ValueError(f"OpenVINO compiles with LATENCY or THROUGHPUT, not {hint!r}")
    config: dict[str, Any] = {
        "INFERENCE_PRECISION_HINT": INFERENCE_PRECISIONS[precision],
        "PERFORMANCE_HINT": hint,
    }
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    return config


#: what a build may serve on the CPU: "int8" is an NNCF-quantized IR whose other ops run at f32
SERVED_PRECISIONS = ("f32", "bf16", "int8")


def native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX), as OpenVINO's CPU plugin reports it."""
    import openvino as ov

    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def resolve_precision(
    requested: str, has_native_bf16: Callable[[], bool] | None = None
) -> tuple[str, str | None]:
    """(the precision to run at, a note when it is not the one requested): bf16 falls back to f32 on a
    CPU without native BF16, where OpenVINO would emulate it slowly or ignore the hint.
    ``has_native_bf16`` is the capability probe (default: :func:`native_bf16`)."""
    if requested not in SERVED_PRECISIONS:
        raise UsageError(
            f"unknown CPU precision {requested!r}; choose one of: {', '.join(SERVED_PRECISIONS)}"
        )
    if requested != "bf16":
        return requested, None
    probe = has_native_bf16 or native_bf16
    if probe():
        return "bf16", None
    return "f32", "bf16 was asked for, but this CPU has no native BF16 (AVX512-BF16 or AMX): running f32"


def compiled_precision(compiled: Any) -> str:
    """The inference precision a compiled model really runs at, as OpenVINO reports it (e.g. "f32")."""
    value = compiled.get_property("INFERENCE_PRECISION_HINT")
    return value.get_type_name() if hasattr(value, "get_type_name") else str(value)


def batch_of_one(model: Any) -> Any:
    """A copy of ``model`` with its batch axis fixed at 1: OpenVINO runs a static shape faster than the
    dynamic batch (0.46 ms of 17 on vit-tiny, paired in one process; README)."""
    one = model.clone()
    one.reshape({p.get_any_name(): [1, *p.get_partial_shape()[1:]] for p in one.inputs})
    return one
