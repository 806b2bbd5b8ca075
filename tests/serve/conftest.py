"""A real ``veo-edge serve`` subprocess on a free loopback port, stopped by PID (SIGTERM) at teardown."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

STARTUP_TIMEOUT_S = 90.0
_LISTENING = re.compile(r"serving (.+?) on http://127\.0\.0\.1:(\d+)")
#: the gRPC and metrics ports on free ones, not the defaults 8001/8002 (which another server may hold)
QUIET_PORTS = ("--grpc-port", "0", "--metrics-port", "0")
_GRPC = re.compile(r"gRPC on 127\.0\.0\.1:(\d+)")
_METRICS = re.compile(r"metrics on http://127\.0\.0\.1:(\d+)")


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    port: int
    log: Path
    grpc_port: int | None = None
    metrics_port: int | None = None

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        """(status, headers, body) of one request on a fresh connection."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def get_json(self, path: str) -> tuple[int, dict]:
        status, _, body = self.request("GET", path)
        return status, json.loads(body)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)


def serve_to_exit(build: Path, *args: str, env: dict | None = None, cwd: Path | None = None):
    """``veo-edge serve BUILD --port 0 ARGS`` run to its end (a start the test expects refused): the
    finished process, its output captured. ``env``: the whole environment (default: this one)."""
    return subprocess.run(
        [sys.executable, "-m", "veo_edge.cli.main", "serve", str(build), "--port", "0", *QUIET_PORTS, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ if env is None else env,
        cwd=cwd,
    )


def start_server(
    build: Path | list[Path],
    log: Path,
    *args: str,
    env: dict | None = None,
    wait_ready: bool = True,
    python: str = sys.executable,
):
    """Start ``veo-edge serve BUILD [BUILD ...] --port 0`` (with ``python``); wait for its port (and
    readiness, bounded)."""
    builds = [str(b) for b in (build if isinstance(build, list) else [build])]
    out = open(log, "w")  # noqa: SIM115 - the child writes to it for its whole life
    proc = subprocess.Popen(
        [python, "-m", "veo_edge.cli.main", "serve", *builds, "--port", "0", *QUIET_PORTS, *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        cwd=log.parent,  # not the checkout: `python -m veo_edge` must import the installed package
    )
    out.close()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    port = None
    while port is None:
        m = _LISTENING.search(log.read_text())
        if m:
            port = int(m.group(2))
        elif proc.poll() is not None:
            raise RuntimeError(f"veo-edge serve exited with {proc.returncode}:\n{log.read_text()}")
        elif time.monotonic() > deadline:
            os.kill(proc.pid, signal.SIGKILL)
            raise RuntimeError(
                f"veo-edge serve did not listen within {STARTUP_TIMEOUT_S} s:\n{log.read_text()}"
            )
        else:
            time.sleep(0.05)
    text = log.read_text()
    grpc_port, metrics_port = _GRPC.search(text), _METRICS.search(text)
    server = ServerProcess(
        proc,
        port,
        log,
        int(grpc_port.group(1)) if grpc_port else None,
        int(metrics_port.group(1)) if metrics_port else None,
    )
    while wait_ready and server.request("GET", "/v2/health/ready")[0] != 200:
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(
                f"veo-edge serve was not ready within {STARTUP_TIMEOUT_S} s:\n{log.read_text()}"
            )
        time.sleep(0.05)
    return server


@pytest.fixture(scope="session")
def nano_server(nano_build: Path, tmp_path_factory: pytest.TempPathFactory):
    """One vit-nano server for the read-only tests of the session (they must leave it healthy)."""
    server = start_server(nano_build, tmp_path_factory.mktemp("serve") / "nano.log")
    yield server
    assert server.stop() == 0, server.log.read_text()


#: the edge server's caps: small, so that the memory-bound test's bombs stay quick
EDGE_MAX_REQUEST = 8 << 20
EDGE_MAX_BUFFERED = 16 << 20


@pytest.fixture(scope="session")
def edge_server(nano_build: Path, tmp_path_factory: pytest.TempPathFactory):
    """A vit-nano server with shared memory on and small body caps (shared-memory and memory-bound tests)."""
    server = start_server(
        nano_build,
        tmp_path_factory.mktemp("serve") / "edge.log",
        "--shared-memory",
        "--max-request-bytes",
        str(EDGE_MAX_REQUEST),
        "--max-buffered-bytes",
        str(EDGE_MAX_BUFFERED),
    )
    yield server
    assert server.stop() == 0, server.log.read_text()


@pytest.fixture
def serve(tmp_path: Path):
    """Factory: ``serve(build, *args, env=..., wait_ready=...)`` starts a server; all stop at teardown."""
    servers: list[ServerProcess] = []

    def _start(build: Path | list[Path], *args: str, **kw) -> ServerProcess:
        server = start_server(build, tmp_path / f"serve-{len(servers)}.log", *args, **kw)
        servers.append(server)
        return server

    yield _start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def serve_module(tmp_path_factory: pytest.TempPathFactory):
    """Like ``serve``, for servers that a whole test module shares; all stop when the module ends."""
    servers: list[ServerProcess] = []
    logs = tmp_path_factory.mktemp("serve-module")

    def _start(build: Path | list[Path], *args: str, **kw) -> ServerProcess:
        server = start_server(build, logs / f"serve-{len(servers)}.log", *args, **kw)
        servers.append(server)
        return server

    yield _start
    codes = [server.stop() for server in servers]
    assert codes == [0] * len(servers), [s.log.read_text() for s in servers]
