"""A taken port is one clear line: ``serve`` with ``--port``, ``--grpc-port`` or ``--metrics-port`` on a
port in use exits 2 with one message naming the flag, releases what it had bound (the other two ports
are free again at once) and prints no traceback (grpcio's "Event loop is closed" finaliser included)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

FLAGS = ("--port", "--grpc-port", "--metrics-port")
WHAT = {"--port": "HTTP", "--grpc-port": "gRPC", "--metrics-port": "metrics"}


def _listening() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(build: Path, ports: dict[str, int]) -> subprocess.CompletedProcess:
    args = [a for flag, port in ports.items() for a in (flag, str(port))]
    return subprocess.run(
        [sys.executable, "-m", "veo_edge.cli.main", "serve", str(build), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
    )


def test_each_taken_port_is_one_line_and_exit_2(nano_build: Path) -> None:
    taken = _listening()
    port = taken.getsockname()[1]
    cases = {flag: {f: port if f == flag else _free_port() for f in FLAGS} for flag in FLAGS}
    try:
        with ThreadPoolExecutor(len(cases)) as pool:  # three processes at once: most of each is imports
            runs = pool.map(lambda ports: _serve(nano_build, ports), cases.values())
            results = dict(zip(cases, runs, strict=True))
    finally:
        taken.close()
    for flag, proc in results.items():
        lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
        assert proc.returncode == 2, (flag, proc.stdout, proc.stderr)
        assert lines == [
            f"error: cannot listen for {WHAT[flag]} on 127.0.0.1:{port}: Address already in use; choose another "
            f"{flag} (0: any free port{'' if flag == '--port' else '; -1: off'})"
        ], (flag, lines)
        for other, p in cases[flag].items():  # what it had bound is released
            if other != flag:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))


def test_binds_that_fail_after_others_release_them_on_the_loop(tmp_path: Path) -> None:
    """Past the CLI's early check (a port taken in between, or serve_async embedded): the metrics port
    taken after HTTP was bound releases HTTP; the gRPC port taken after the models loaded stops the grpcio
    server on the serving loop, so no finaliser runs after the loop has closed."""
    pytest.importorskip("grpc")
    script = tmp_path / "bind.py"
    script.write_text(
        "import asyncio, socket, types\n"
        "from veo_edge.errors import UsageError\n"
        "from veo_edge.serve.grpc_server import GrpcServer\n"
        "from veo_edge.serve.listen import Listeners\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); taken = s.getsockname()[1]\n"
        "f = socket.socket(); f.bind(('127.0.0.1', 0)); free = f.getsockname()[1]; f.close()\n"
        "opts = types.SimpleNamespace(host='127.0.0.1', port=free, grpc_port=None, metrics_port=taken)\n"
        "async def main():\n"
        "    for bind in (lambda: Listeners().bind(opts), lambda: Listeners().bind_grpc(\n"
        "            types.SimpleNamespace(host='127.0.0.1', grpc_port=taken), GrpcServer())):\n"
        "        try:\n"
        "            await bind()\n"
        "        except UsageError as e:\n"
        "            print(e)\n"
        "    socket.create_server(('127.0.0.1', free)).close()  # HTTP was released\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "cannot listen for metrics on 127.0.0.1:" in proc.stdout
    assert (
        "cannot listen for gRPC on 127.0.0.1:" in proc.stdout and "choose another --grpc-port" in proc.stdout
    )
    assert "Traceback" not in proc.stderr and "Event loop is closed" not in proc.stderr, proc.stderr


def test_two_flags_on_one_port_are_one_line_before_any_bind(nano_build: Path) -> None:
    port = _free_port()
    proc = _serve(nano_build, {"--port": _free_port(), "--grpc-port": port, "--metrics-port": port})
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert proc.returncode == 2 and lines == [
        f"error: --grpc-port and --metrics-port are both {port}; give each its own port"
    ], lines


def test_a_port_below_1024_that_cannot_be_bound_says_why(nano_build: Path) -> None:
    """EACCES on a low port names the capability and the sysctl (a non-root server in a container gets
    no CAP_NET_BIND_SERVICE from --cap-add); as root, run without that capability (setpriv)."""
    import shutil

    floor = int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text())
    if floor <= 81:
        pytest.skip(f"net.ipv4.ip_unprivileged_port_start is {floor} here: anyone may bind port 81")
    prefix = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root here, and no setpriv to drop CAP_NET_BIND_SERVICE")
        prefix = ["setpriv", "--bounding-set=-net_bind_service"]
    argv = [sys.executable, "-m", "veo_edge.cli.main", "serve", str(nano_build), "--port", "81"]
    r = subprocess.run([*prefix, *argv, "--grpc-port", "-1", "--metrics-port", "-1"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "cannot listen for HTTP on 127.0.0.1:81: Permission denied (a port below 1024 needs" in r.stderr
    assert "net.ipv4.ip_unprivileged_port_start at 81 or lower" in r.stderr, r.stderr
