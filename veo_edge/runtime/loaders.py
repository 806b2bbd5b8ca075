"""Runners for a build directory's artifacts, one per backend name (cheap: nothing loads until activate)."""

from __future__ import annotations

import logging

from veo_edge.builddir import BuildDir
from veo_edge.errors import UsageError
from veo_edge.runtime.backends.base import Runner

CPU_BACKENDS = ("openvino", "onnxruntime")

log = logging.getLogger("veo_edge.runtime")


def cpu_runner(
    build: BuildDir,
    backend: str,
    threads: int | None = None,
    performance_hint: str = "LATENCY",
    max_batch: int | None = None,
    measure_batching: bool = False,
) -> Runner:
    """The CPU runner ``backend`` over ``build``'s plain artifacts (``performance_hint``: OpenVINO's;
    ``max_batch``: the largest batch it runs, default the build's; ``measure_batching``: OpenVINO
    ADAPTIVE measures whether batches pay, see :mod:`veo_edge.runtime.backends.openvino_batching`)."""
    max_batch = max_batch or build.max_batch
    if backend == "openvino":
        from veo_edge.runtime.backends.openvino import OpenVinoRunner

        precision = served_precision(build, "openvino")
        if precision == "int8":
            warn_if_int8_is_slow(build)
        xml = build.artifact("openvino_int8_xml" if precision == "int8" else "openvino_xml")
        return OpenVinoRunner(
            xml,
            max_batch=max_batch,
            threads=threads,
            precision=precision,
            hint=performance_hint,
            measure_batching=measure_batching,
        )
    if backend == "onnxruntime":
        from veo_edge.runtime.backends.onnxruntime import OnnxRuntimeRunner

        return OnnxRuntimeRunner(build.artifact("onnx"), max_batch=max_batch, threads=threads)
    raise UsageError(f"unknown CPU backend {backend!r}; choose one of: {', '.join(CPU_BACKENDS)}")


def served_precision(build: BuildDir, backend: str) -> str:
    """The CPU precision the build chose for ``backend`` (manifest ``cpu_precision``; f32 before it)."""
    return str((build.manifest.get("cpu_precision") or {}).get("served", {}).get(backend, "f32"))


def warn_if_int8_is_slow(build: BuildDir) -> None:
    """Log a warning when this CPU has no VNNI or AMX, where int8 runs slower than f32 (the measured
    reason: :func:`veo_edge.runtime.probes.probe_int8`)."""
    from veo_edge.runtime.probes import probe_int8

    probe = probe_int8()
    if not probe.ok:
        log.warning("%s serves int8 on openvino, but %s", build.path, probe.reason)
