"""A SIGTERM (or SIGINT) while `veo-edge serve` starts, before HTTP serves: during the model load, the
warm-up, or with gRPC already accepting. The server stops in order: exit 0, one line saying it stopped
before it took a request, no start line after it, its ports released, no leaked resources (before, the
signal killed it: exit 143, nothing logged, multiprocessing's resource tracker warning of leaked
semaphores). A real server process; the signal is sent when its own log line shows the point reached."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serve.conftest import QUIET_PORTS


@pytest.mark.parametrize(
    ("at", "sig"),
    [
        ("warmed batch", signal.SIGTERM),
        ("veo-edge gRPC on", signal.SIGTERM),
        ("veo-edge gRPC on", signal.SIGINT),
    ],
)
def test_a_signal_during_start_up_stops_in_order(nano_build: Path, tmp_path: Path, at: str, sig) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "veo_edge.cli.main", "serve", str(nano_build), "--port", "0", *QUIET_PORTS],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
    )
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # blocks on the server's own output: the point is its log line
            seen.append(line)
            if at in line:
                os.kill(proc.pid, sig)
                break
            assert "veo-edge serving" not in line, f"{at!r} never logged before serving:\n{''.join(seen)}"
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = "".join(seen) + rest
    assert proc.returncode == 0, log
    stops = [line for line in log.splitlines() if "stops before it took a request" in line]
    assert len(stops) == 1, log  # the start-up's own stop, or the HTTP server's drain if it was that far
    after = log[log.index("stops before it took a request") :]
    assert "veo-edge serving" not in log and "ready: yes" not in after, log
    assert "leaked" not in log and "Traceback" not in log, log
    for port in _ports(log):  # whatever was bound is released
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def _ports(log: str) -> list[int]:
    return [int(p) for p in re.findall(r"(?:gRPC on|metrics on http://)127\.0\.0\.1:(\d+)", log)]
