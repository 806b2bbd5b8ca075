"""Soak test helpers: the built memory pool library, and a `veo-edge serve` subprocess on a free port."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.net import free_port
from veo_edge import nativelib
from veo_edge.runtime import mempool


@pytest.fixture(scope="session")
def pool_lib() -> Path:
    lib = nativelib.DEFAULT_BUILD_DIR / mempool.LIB_NAME
    if not lib.is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{lib} is missing; CI must build it (`make plugins`)")
        pytest.skip(f"{lib} is missing; run `make plugins`")
    return lib


def _ready(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/v2/health/ready")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


@pytest.fixture
def server(tmp_path: Path):
    """Factory: ``server(build, env=...)`` starts `veo-edge serve` on a free loopback port and returns its
    URL once ready; every server is stopped by PID (SIGTERM) at teardown. Only the protocol is used."""
    procs: list[subprocess.Popen] = []

    def _start(build: Path, env: dict | None = None, grpc: bool = False, args: tuple[str, ...] = ()) -> str:
        """The server's http:// URL, or its grpc:// URL with ``grpc=True`` (``_start.http``: the same
        server's http:// URL, whose /metrics a gRPC soak may read)."""
        port, grpc_port = free_port(), free_port()
        log = open(tmp_path / f"serve-{len(procs)}.log", "w")  # noqa: SIM115 - the child's log
        ports = ["--port", str(port), "--grpc-port", str(grpc_port), "--metrics-port", "-1"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "veo_edge.cli.main", "serve", str(build), *ports, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        log.close()
        procs.append(proc)
        deadline = time.monotonic() + 90
        while not _ready(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"veo-edge serve did not get ready:\n{(tmp_path / 'serve-0.log').read_text()}"
                )
            time.sleep(0.1)
        _start.http = f"http://127.0.0.1:{port}"
        _start.proc = proc  # the last server started, for a test that stops it mid-run
        return f"grpc://127.0.0.1:{grpc_port}" if grpc else _start.http

    yield _start
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
