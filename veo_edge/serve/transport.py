"""HTTP/1.1 on uvicorn with httptools (llhttp): the well-kept parser frames every request; this module
adds only the limits uvicorn leaves to the application, and the server's lifecycle.

It subclasses uvicorn's *private* ``HttpToolsProtocol`` (``PROTOCOL_HOOKS``): an ASGI middleware cannot
see a request head before it is whole (431, the head deadline) nor answer a malformed one in JSON, and
uvicorn's public config has no such limits, so the alternative is our own HTTP/1.1 protocol on
httptools. Until that exists, the tested uvicorn range is pinned in ``pyproject.toml``
(``UVICORN_TESTED``, both ends run the serve tests in CI) and any other uvicorn is refused at start.

What llhttp rejects by itself (each a 400 and a closed connection): two ``Content-Length`` headers (even
equal ones), a ``Content-Length`` that is not all digits (``+50``, ``4_8``, ``5, 5``), ``Content-Length``
with ``Transfer-Encoding``, a ``Transfer-Encoding`` other than a final ``chunked``, a bare LF or CR in the
request line or a header, obs-folded headers, a space before a header colon, NUL bytes, a malformed
chunk size, an HTTP version that is not ``1.x``/``2.0``/``0.9`` digits.

What :class:`GuardedProtocol` adds, because uvicorn's httptools protocol has no such limit:

- a request head larger than ``max_head_bytes`` or with more than ``max_headers`` headers: 431 (uvicorn
  would buffer a multi-megabyte header line in full);
- HTTP versions other than 1.0 and 1.1 (``HTTP/2.0`` or ``HTTP/0.9`` in an HTTP/1 request line): 400;
- a request not received whole within ``read_timeout_s`` of its first byte: 408 (uvicorn has no read
  deadline, so a slow client could hold a connection and its buffers forever);
- an idle new connection is closed after the keep-alive timeout (uvicorn arms that timer only after a
  first response); connections beyond ``max_connections`` get a JSON 503;
- parser errors answered as JSON ``{"error": ...}`` naming llhttp's reason, like every other error.

A response's head goes out with its body in one send (:class:`veo_edge.serve.onesend.OneSend`). Bodies,
their per-request and global caps, decompression and routing live in :mod:`veo_edge.serve.http`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from veo_edge.errors import VeoEdgeError
from veo_edge.serve.onesend import OneSend

log = logging.getLogger("veo_edge.serve")


@dataclass(frozen=True)
class Limits:
    """Caps and timeouts of the server; every request that breaks one gets a 4xx/503 and a reason."""

    max_body_bytes: int = 64 << 20
    #: request bodies held in memory across all connections at once (a request over it gets 503)
    max_buffered_bytes: int = 256 << 20
    max_head_bytes: int = 16 << 10
    max_headers: int = 100
    #: a request must arrive whole within this many seconds of its first byte (slow clients are cut off)
    read_timeout_s: float = 30.0
    #: an idle keep-alive connection is closed after this many seconds
    keepalive_timeout_s: float = 60.0
    #: open connections beyond this get 503 and are closed
    max_connections: int = 1024
    #: JSON request heads larger than this are decoded in a worker process, off the event loop
    offload_json_bytes: int = 1 << 20
    #: body bytes a connection buffers before the application reads them (reading pauses above it);
    #: uvicorn's 64 KiB turns a 600 KB tensor into ten pause/resume round trips through the event loop
    read_high_water_bytes: int = 1 << 20


#: how long a rejected connection keeps draining the client's input before it closes
LINGER_S = 2.0


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


class _Reject(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


#: the uvicorn releases GuardedProtocol was tested with, both ends (CI runs the serve tests on each):
#: pyproject.toml pins exactly this range, and a uvicorn outside it is refused at start
UVICORN_TESTED = (">=0.30", "<0.56")
#: the methods of uvicorn's HttpToolsProtocol that GuardedProtocol overrides or calls (its private API)
PROTOCOL_HOOKS = (
    "connection_made", "connection_lost", "eof_received", "data_received", "on_response_complete",
    "on_message_begin", "on_url", "on_header", "on_headers_complete", "on_body", "on_message_complete",
    "timeout_keep_alive_handler", "_unset_keepalive_if_required", "_should_upgrade",
)  # fmt: skip


def check_protocol_base(base: type, version: str) -> None:
    """Refuse a uvicorn outside the tested range, or whose httptools protocol lacks a hook this module
    builds on (one line: which, and what to install)."""
    from packaging.specifiers import SpecifierSet

    tested = ",".join(UVICORN_TESTED)
    install = f"install the tested range: pip install 'uvicorn{tested}'"
    if version not in SpecifierSet(tested):
        raise VeoEdgeError(
            f"uvicorn {version} is outside the range veo-edge's HTTP limits were tested with ({tested}); "
            f"they build on its private HttpToolsProtocol: {install}"
        )
    missing = [name for name in PROTOCOL_HOOKS if not callable(getattr(base, name, None))]
    if missing:
        raise VeoEdgeError(
            f"uvicorn {version}'s HttpToolsProtocol has no {', '.join(missing)}, which veo-edge's HTTP "
            f"limits build on; {install}"
        )


def _protocol_base() -> type:
    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    check_protocol_base(HttpToolsProtocol, uvicorn.__version__)
    return HttpToolsProtocol


def make_protocol(limits: Limits, on_reject: Callable[[int], None]) -> type:
    """A uvicorn httptools protocol class bound to ``limits``; ``on_reject(status)`` counts rejections."""
    import httptools

    base = _protocol_base()
    phrases = {
        400: "Bad Request",
        408: "Request Timeout",
        431: "Request Header Fields Too Large",
        503: "Service Unavailable",
    }

    class GuardedProtocol(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._in_head = True  # waiting for (the rest of) a request head
            self._head_size = 0  # bytes of the current head seen through the parser's callbacks
            self._streamed = 0  # bytes received while a head is incomplete (a head still being sent)
            self._header_count = 0
            self._eof = False
            self._discard = False
            self._deadline: asyncio.TimerHandle | None = None

        # -- connection -------------------------------------------------------------------------
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                self._reject(503, f"too many connections (limit {limits.max_connections}); retry")
                return
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_deadline()
            super().connection_lost(exc)

        def eof_received(self) -> bool | None:
            # a half-closed client (shutdown(SHUT_WR)) still gets the answers to the requests it sent
            # whole; uvicorn would close at once and drop them
            self._eof = True
            if self._discard:
                return None
            cycle = self.cycle
            busy = bool(self.pipeline) or (cycle is not None and not cycle.response_complete)
            incomplete = self._streamed > 0 or (cycle is not None and cycle.more_body)
            return True if busy and not incomplete else None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            done = self.cycle is None or self.cycle.response_complete  # the last request parsed is answered
            if self._eof and done and not self.pipeline and not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._discard:
                return  # rejected: what the client still sends is dropped until the close
            self._unset_keepalive_if_required()
            if self._in_head:
                self._streamed += len(data)
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                pass  # no protocol upgrades: the request is served as plain HTTP/1.1
            except httptools.HttpParserError as e:
                cause = e.__context__
                if isinstance(cause, _Reject):
                    self._reject(cause.status, str(cause))
                else:
                    self._reject(400, f"malformed HTTP/1.1 request: {e}")
                return
            if self._in_head and self._streamed > limits.max_head_bytes:
                self._reject(431, f"the request head exceeds {limits.max_head_bytes} bytes")

        # -- parser callbacks -------------------------------------------------------------------
        def on_body(self, body: bytes) -> None:
            # uvicorn's own, with a higher read high-water mark (Limits.read_high_water_bytes)
            cycle = self.cycle
            if cycle.response_complete or (self.parser.should_upgrade() and self._should_upgrade()):
                return
            cycle.body += body
            if len(cycle.body) > limits.read_high_water_bytes:
                self.flow.pause_reading()
            cycle.message_event.set()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head, self._head_size, self._header_count = True, 0, 0
            if self._deadline is None:
                self._deadline = self.loop.call_later(limits.read_timeout_s, self._read_timeout)

        def on_url(self, url: bytes) -> None:
            self._head_size += len(url)
            if self._head_size > limits.max_head_bytes:
                raise _Reject(431, f"the request head exceeds {limits.max_head_bytes} bytes")
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._head_size += len(name) + len(value) + 4
            self._header_count += 1
            if self._head_size > limits.max_head_bytes:
                raise _Reject(431, f"the request head exceeds {limits.max_head_bytes} bytes")
            if self._header_count > limits.max_headers:
                raise _Reject(431, f"the request has more than {limits.max_headers} header lines")
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head, self._streamed = False, 0
            version = self.parser.get_http_version()
            if version not in ("1.1", "1.0"):
                raise _Reject(400, f"HTTP version {version!r} is not supported; send HTTP/1.1")
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is not None and not isinstance(cycle.transport, OneSend):
                cycle.transport = OneSend(self.transport, cycle)

        def on_message_complete(self) -> None:
            self._cancel_deadline()
            self._in_head = True
            super().on_message_complete()

        # -- limits -----------------------------------------------------------------------------
        def _cancel_deadline(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _read_timeout(self) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            if (
                self.flow.read_paused
            ):  # we stopped reading (a pipelined request waits): not the client's fault
                self._deadline = self.loop.call_later(limits.read_timeout_s, self._read_timeout)
                return
            self._reject(408, f"the request did not arrive within {limits.read_timeout_s:g} s")

        def _reject(self, status: int, message: str) -> None:
            """Answer ``status`` and close; the parser's state is past saving after any of these."""
            on_reject(status)
            self.flow.pause_reading()
            cycle = self.cycle
            if cycle is not None and cycle.response_started and not cycle.response_complete:
                cycle.keep_alive = False  # a response is being written: finish it, then close
                return
            body = error_body(message)
            head = (
                f"HTTP/1.1 {status} {phrases[status]}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
            ).encode("latin-1")
            if cycle is not None and not cycle.response_complete:
                cycle.response_started = True  # the application's own answer, if any, is dropped
            self.transport.write(head + body)
            self._linger()

        def _linger(self) -> None:
            """Close after the client has read the answer: closing with unread input would send a TCP
            reset that can destroy the answer in flight, so read and drop its input for a moment."""
            self._discard = True
            self._cancel_deadline()
            self._unset_keepalive_if_required()
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.flow.resume_reading()
            self.loop.call_later(LINGER_S, self.transport.close)

    return GuardedProtocol


class _Server:
    """uvicorn's Server, with our signal handling: the first SIGTERM/SIGINT starts the drain (and calls
    ``on_exit``); nothing is re-raised afterwards, so a clean drain exits 0."""

    def __init__(self, config: Any, on_exit: Callable[[], None]) -> None:
        import uvicorn

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                if not self.should_exit:
                    on_exit()
                super().handle_exit(sig, frame)

            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, self.handle_exit, sig, None)
                try:
                    yield
                finally:
                    for sig in (signal.SIGTERM, signal.SIGINT):
                        loop.remove_signal_handler(sig)

        self.server = Server(config)


class HttpServer:
    """Serve an ASGI ``app`` with uvicorn on ``host:port`` until SIGTERM/SIGINT, then drain."""

    def __init__(self, app: Any, limits: Limits, on_reject: Callable[[int], None]) -> None:
        self.app = app
        self.limits = limits
        self.on_reject = on_reject
        self.draining = False
        self._uvicorn: Any = None

    def _config(self, drain_timeout_s: float) -> Any:
        import uvicorn

        return uvicorn.Config(
            self.app,
            http=make_protocol(self.limits, self.on_reject),
            ws="none",
            lifespan="off",
            interface="asgi3",
            log_config=None,
            access_log=False,
            server_header=False,
            proxy_headers=False,  # nothing reads the client's address: its middleware is a call a request
            timeout_keep_alive=self.limits.keepalive_timeout_s,  # type: ignore[arg-type]
            timeout_graceful_shutdown=max(1, round(drain_timeout_s)),
            backlog=1024,
        )

    async def serve(
        self, sock: Any, drain_timeout_s: float, on_listening: Callable[[int], None], on_drain: Any
    ) -> None:
        """Serve on the listening socket ``sock`` (see :func:`veo_edge.serve.listen.bind_http`); call
        ``on_listening(port)``; serve until a signal; ``on_drain()`` when the drain begins."""

        def begin_drain() -> None:
            self.draining = True
            on_drain()

        self._uvicorn = _Server(self._config(drain_timeout_s), begin_drain).server
        task = asyncio.ensure_future(self._uvicorn.serve(sockets=[sock]))
        while not self._uvicorn.started:
            if task.done():  # start-up failed: uvicorn logged why
                await task
                return
            await asyncio.sleep(0.01)
        on_listening(int(sock.getsockname()[1]))
        await task

    def stop(self) -> None:
        """Begin the drain as a signal would (tests, embedding)."""
        if self._uvicorn is not None:
            self._uvicorn.handle_exit(signal.SIGTERM, None)
