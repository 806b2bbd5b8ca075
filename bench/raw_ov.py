"""Raw OpenVINO in the bench's own process: the IR a build serves, compiled as the runtime compiles it
(f32 stated), run sync back to back or kept full.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from report import percentiles, timed


def served_ir(build: Path) -> tuple[str, str]:
    """(precision, IR path) of what the build serves on the CPU: f32, or its int8 IR."""
    from veo_edge.builddir import BuildDir
    from veo_edge.runtime.loaders import served_precision

    bd = BuildDir.open(build)
    precision = served_precision(bd, "openvino")
    return precision, str(bd.artifact("openvino_int8_xml" if precision == "int8" else "openvino_xml"))


def compile_ir(ir: Any, hint: str, static: bool = False) -> Any:
    """``ir`` (a path or an ``ov.Model``) compiled for the CPU at f32 with ``hint``; ``static``: its batch
    axis fixed at 1 first, as ADAPTIVE compiles it."""
    import openvino as ov

    from veo_edge.runtime.backends.openvino_compile import batch_of_one, compile_config

    core = ov.Core()
    model = core.read_model(str(ir)) if isinstance(ir, (str, Path)) else ir
    return core.compile_model(
        batch_of_one(model) if static else model, "CPU", compile_config("f32", hint=hint)
    )


def sync_request(ir: Any, static: bool = False) -> Any:
    """One infer request on a LATENCY compile of ``ir``: raw sync batch 1."""
    return compile_ir(ir, "LATENCY", static).create_infer_request()


def time_sync(request: Any, x: np.ndarray, seconds: float) -> dict:
    """``request`` run on ``x`` back to back for ``seconds`` (after 5 unmeasured runs)."""
    for _ in range(5):
        request.infer(x)
    lat, stop = [], time.perf_counter() + seconds
    while time.perf_counter() < stop:
        lat.append(timed(lambda: request.infer(x)))
    return {"rate": len(lat) * len(x) / (sum(lat) / 1e3), **percentiles(lat)}


def keep_full(compiled: Any, x: np.ndarray, seconds: float, requests: int | None = None) -> dict:
    """Samples/s of an ``AsyncInferQueue`` on ``compiled`` kept full of ``x`` for ``seconds`` (``requests``
    infer requests; default OpenVINO's optimal number)."""
    import openvino as ov

    nreq = requests or int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
    queue = ov.AsyncInferQueue(compiled, nreq)
    for _ in range(2 * nreq):
        queue.start_async(x)
    queue.wait_all()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        queue.start_async(x)  # blocks while every infer request is busy
        n += 1
    queue.wait_all()
    return {"rate": n * len(x) / (time.perf_counter() - start), "requests": nreq}


def raw_limit(xml: str, x1: np.ndarray, batch: int, seconds: float, static: bool = False) -> dict:
    """A THROUGHPUT compile kept full at ``batch``; ``static``: batch 1 fixed in the model, two infer
    requests per stream (one queued behind each running one)."""
    compiled = compile_ir(xml, "THROUGHPUT", static)
    nreq = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")) * (2 if static else 1)
    return keep_full(compiled, np.ascontiguousarray(np.repeat(x1, batch, 0)), seconds, nreq)
