"""Shared by the serve benches: a build to serve, and a `veo-edge serve` subprocess on loopback."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np


@contextlib.contextmanager
def build_dir(path: str | None, model: str = "vit-nano") -> Iterator[Path]:
    """``path`` as given, or a fresh build of ``model`` in a temporary directory."""
    if path:
        yield Path(path)
        return
    from veo_edge.export.source import BuiltinSource
    from veo_edge.pipeline.build import BuildOptions, run_build

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / model
        run_build(BuildOptions(source=BuiltinSource(model), out=out, quiet=True))
        yield out


@contextlib.contextmanager
def server(
    build: Path, *args: str, timeout: float = 120.0, env: dict | None = None, ports: bool = False
) -> Iterator[Any]:
    """Start ``veo-edge serve BUILD --port 0 ARGS`` on 127.0.0.1, wait until ready, yield the port; SIGTERM at exit.

    ``env`` is added to the server's environment (``PYTHONPATH`` serves another checkout's code).
    ``ports``: also gRPC and the metrics port on free ports; yields ``{"http", "grpc", "metrics"}`` ports
    and the server's ``pid``."""
    if ports:
        args = ("--grpc-port", "0", "--metrics-port", "0", *args)
    with tempfile.NamedTemporaryFile("w+", suffix=".log") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "veo_edge.cli.main", "serve", str(build), "--port", "0", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        try:
            deadline = time.monotonic() + timeout
            port = None
            while port is None or not _ready(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not come up:\n{Path(log.name).read_text()}")
                m = re.search(r"serving .* on http://127\.0\.0\.1:(\d+)", Path(log.name).read_text())
                port = int(m.group(1)) if m else None
                time.sleep(0.05)
            if ports:
                text = Path(log.name).read_text()
                grpc = re.search(r"gRPC on 127\.0\.0\.1:(\d+)", text)
                metrics = re.search(r"metrics on http://127\.0\.0\.1:(\d+)", text)
                yield {
                    "http": port,
                    "grpc": int(grpc.group(1)),
                    "metrics": int(metrics.group(1)),
                    "pid": proc.pid,
                }
            else:
                yield port
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
            proc.wait(60)


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def sample(build: Path, batch: int = 1, seed: int = 0) -> np.ndarray:
    from veo_edge.builddir import BuildDir
    from veo_edge.export.parity import seeded_inputs

    return seeded_inputs(tuple(BuildDir.open(build).manifest["input_shape"]), batch, seed)


def percentiles(values_s: list[float]) -> dict[str, float]:
    us = np.asarray(values_s) * 1e6
    return {f"p{q}": float(np.percentile(us, q)) for q in (50, 90, 99)} | {"mean": float(us.mean())}


def http_infer(build: Path, port: int) -> Any:
    """A callable that sends one batch-1 binary infer request (as perf_analyzer sends it) to the server
    on ``port`` over one kept-alive connection and returns its latency in ms; ``.close()`` closes it."""
    import http.client

    from veo_edge.builddir import BuildDir
    from veo_edge.serve.protocol import encode_infer_request

    bd = BuildDir.open(build)
    m = bd.manifest
    body, hlen = encode_infer_request(
        {m["inputs"][0]["name"]: sample(build, 1)}, outputs=[m["outputs"][0]["name"]]
    )
    headers = {"Inference-Header-Content-Length": str(hlen), "Content-Type": "application/octet-stream"}
    path = f"/v2/models/{bd.model_name}/infer"
    conn = http.client.HTTPConnection("127.0.0.1", port)

    def once() -> float:
        t = time.perf_counter_ns()
        conn.request("POST", path, body, headers)
        r = conn.getresponse()
        r.read()
        if r.status != 200:
            raise RuntimeError(f"the server on port {port} answered {r.status}")
        return (time.perf_counter_ns() - t) / 1e6

    once.close = conn.close  # type: ignore[attr-defined]
    return once


def median_ci(values: list[float], seed: int = 0, draws: int = 400) -> tuple[float, float, float]:
    """(median, low, high): the median of ``values`` and its bootstrap 95 % interval."""
    import random
    import statistics

    rng = random.Random(seed)
    boot = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return statistics.median(values), boot[int(0.025 * draws)], boot[int(0.975 * draws) - 1]
