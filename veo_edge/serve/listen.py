"""The server's ports, bound before any model loads: HTTP (a socket uvicorn serves), the separate
Prometheus port, and gRPC (checked free then, bound once the models are loaded). A port that cannot be bound is one :class:`~veo_edge.errors.UsageError` line
(exit 2) naming the flag to change, after everything already bound is released on the serving loop (so
no grpcio finaliser runs after the loop has closed).
"""

from __future__ import annotations

import errno
import socket
from typing import Any

from veo_edge.errors import UsageError


def bind_http(
    host: str, port: int, backlog: int = 1024, what: str = "HTTP", flag: str = "--port"
) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: any free port), as uvicorn would bind it."""
    try:
        family, *_, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port}: {e}; choose another --host") from e
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError as e:
        sock.close()
        low = (
            f" (a port below 1024 needs CAP_NET_BIND_SERVICE in effect, as root has it, or "
            f"net.ipv4.ip_unprivileged_port_start at {port} or lower; --cap-add NET_BIND_SERVICE does not "
            "give it to a non-root process in a container)"
            if e.errno == errno.EACCES and 0 < port < 1024
            else ""
        )
        raise UsageError(
            f"cannot listen for {what} on {host}:{port}: {e.strerror or e}{low}; {_choose(flag)}"
        ) from e
    return sock


def _choose(flag: str) -> str:
    return f"choose another {flag} (0: any free port{'' if flag == '--port' else '; -1: off'})"


def check_free(host: str, ports: dict[str, int | None]) -> None:
    """Fail at once, before any build is read, when a port (flag -> port; 0 or None: nothing to check) is
    taken; the binds that follow stay the real test (and clean up after themselves)."""
    what = {"--port": "HTTP", "--grpc-port": "gRPC", "--metrics-port": "metrics"}
    given = [(flag, port) for flag, port in ports.items() if port and port > 0]
    for i, (flag, port) in enumerate(given):
        for other, same in given[i + 1 :]:
            if same == port:
                raise UsageError(f"{flag} and {other} are both {port}; give each its own port")
    for flag, port in ports.items():
        if port and port > 0:  # -1: the metrics port is off
            bind_http(host, port, what=what.get(flag, flag), flag=flag).close()


class _Forward:
    """A collector that reads the service's registry once the service exists (the metrics port is bound
    before the models load)."""

    def __init__(self) -> None:
        self.registry: Any = None

    def collect(self):
        if self.registry is not None:
            yield from self.registry.collect()


class Listeners:
    """The bound ports of one server; :meth:`close` releases whatever is bound."""

    def __init__(self) -> None:
        self.http: socket.socket | None = None
        self.grpc: Any = None
        self.metrics: Any = None
        self._metrics_source = _Forward()

    async def bind(self, options: Any) -> None:
        """Bind HTTP and metrics, and check that the gRPC port is free (it is bound by :meth:`bind_grpc`
        once the models are loaded: OpenVINO forks a telemetry process while it loads, and grpcio warns
        of a fork beside its threads); on a failure, release all."""
        try:
            self.http = bind_http(options.host, options.port)
            if options.grpc_port:
                bind_http(options.host, options.grpc_port, what="gRPC", flag="--grpc-port").close()
            if options.metrics_port is not None:
                self.metrics = _start_metrics(self._metrics_source, options.host, options.metrics_port)
        except BaseException:
            await self.close()
            raise

    async def bind_grpc(self, options: Any, grpc_server: Any) -> None:
        """Bind the gRPC server; on a failure (the port was taken since :meth:`bind`), release all."""
        self.grpc = grpc_server
        try:
            await grpc_server.bind(options.host, options.grpc_port)
        except BaseException:
            await self.close()
            raise

    def serve_metrics(self, registry: Any) -> None:
        """From now on the metrics port answers with ``registry``."""
        self._metrics_source.registry = registry

    @property
    def http_port(self) -> int:
        assert self.http is not None
        return int(self.http.getsockname()[1])

    @property
    def metrics_port(self) -> int:
        return int(self.metrics.server_port)

    async def close(self) -> None:
        if self.grpc is not None:
            await self.grpc.stop(None)
            self.grpc = None
        if self.metrics is not None:
            self.metrics.shutdown()
            self.metrics.server_close()
            self.metrics = None
        if self.http is not None:
            self.http.close()
            self.http = None


def _start_metrics(source: Any, host: str, port: int) -> Any:
    """Prometheus on its own port (Triton's metrics port), in a daemon thread; the HTTP server object."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(source)
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise UsageError(
            f"cannot listen for metrics on {host}:{port}: {e.strerror or e}; {_choose('--metrics-port')}"
        ) from e
    return server
