"""A small HTTP/1.1 server on asyncio's protocol layer: keep-alive, pipelining, ``Expect: 100-continue``,
bounded heads and bodies, read deadlines, write backpressure, and a drain that answers every request it
has begun to read before it closes.

It knows nothing about inference: it hands each complete :class:`Request` to an async handler and
writes the :class:`Response` it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

log = logging.getLogger("veo_edge.serve")

_HEAD_END = b"\r\n\r\n"


@dataclass(frozen=True)
class Limits:
    """Caps and timeouts of the server; every request that breaks one gets a 4xx and a reason."""

    max_body_bytes: int = 64 << 20
    max_head_bytes: int = 16 << 10
    max_headers: int = 100
    #: a request must arrive whole within this many seconds of its first byte (slow clients are cut off)
    read_timeout_s: float = 30.0
    #: an idle keep-alive connection is closed after this many seconds
    keepalive_timeout_s: float = 60.0
    max_connections: int = 1024


@dataclass
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Response:
    status: int
    body: list[bytes | memoryview] = field(default_factory=list)
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


class HttpError(Exception):
    """Raised while reading a request; answered with ``status`` and the connection is closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


Handler = Callable[[Request], Awaitable[Response]]
ErrorBody = Callable[[int, str], bytes]


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise HttpError(415, f"Content-Encoding {encoding!r} is not supported; use gzip, deflate or none")
    d = zlib.decompressobj(zlib.MAX_WBITS | 16 if encoding == "gzip" else zlib.MAX_WBITS)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as e:
        raise HttpError(400, f"the {encoding} request body is corrupt: {e}") from e
    if len(out) > limit:
        raise HttpError(413, f"the decompressed request body exceeds the {limit}-byte limit")
    if not d.eof:
        raise HttpError(400, f"the {encoding} request body is truncated")
    return out


class _Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: Any = None
        self.buf = bytearray()
        self.head: tuple[str, str, str, dict[str, str], int, bool] | None = None
        self.busy = False
        self.closing = False
        self.timer: asyncio.TimerHandle | None = None
        self.can_write: asyncio.Future | None = None
        self.eof = False

    # -- asyncio callbacks ----------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if len(self.server.connections) >= self.server.limits.max_connections:
            self._send_error(503, f"too many connections (limit {self.server.limits.max_connections}); retry")
            return
        self.server.connections.add(self)
        self._arm(self.server.limits.keepalive_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.closing = True
        if self.timer:
            self.timer.cancel()
        if self.can_write and not self.can_write.done():
            self.can_write.set_result(None)

    def pause_writing(self) -> None:
        self.can_write = self.loop.create_future()

    def resume_writing(self) -> None:
        if self.can_write and not self.can_write.done():
            self.can_write.set_result(None)
        self.can_write = None

    def eof_received(self) -> bool:
        # a half-closed client (shutdown(SHUT_WR)) still gets the answers to what it sent
        self.eof = True
        if self.busy:
            return True
        self._advance()
        return not self.closing

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        if not self.buf and self.head is None and not self.busy:
            self._arm(self.server.limits.read_timeout_s)  # first byte of a request: its read deadline
        self.buf += data
        if self.busy:
            if len(self.buf) > self.server.limits.max_body_bytes + self.server.limits.max_head_bytes:
                self.transport.pause_reading()  # a pipelining client far ahead of us
            return
        self._advance()

    # -- request reading ------------------------------------------------------------------------
    def _arm(self, seconds: float) -> None:
        if self.timer:
            self.timer.cancel()
        self.timer = self.loop.call_later(seconds, self._timeout)

    def _timeout(self) -> None:
        if self.busy or self.closing:
            return
        if self.buf or self.head is not None:
            self._send_error(408, f"the request did not arrive within {self.server.limits.read_timeout_s} s")
        else:
            self.transport.close()  # idle keep-alive connection

    def _advance(self) -> None:
        try:
            request = self._take_request()
        except HttpError as e:
            self._send_error(e.status, str(e))
            return
        if request is None:
            if self.eof or (self.server.draining and not self.buf and self.head is None):
                self.closing = True
                self.transport.close()
            return
        self.busy = True
        if self.timer:
            self.timer.cancel()
        self.server.in_flight += 1
        self.loop.create_task(self._respond(request))

    def _take_request(self) -> tuple[Request, bool] | None:
        limits = self.server.limits
        if self.head is None:
            end = self.buf.find(_HEAD_END)
            if end < 0:
                if len(self.buf) > limits.max_head_bytes:
                    raise HttpError(431, f"the request head exceeds {limits.max_head_bytes} bytes")
                return None
            if end > limits.max_head_bytes:
                raise HttpError(431, f"the request head exceeds {limits.max_head_bytes} bytes")
            raw = bytes(self.buf[:end])
            del self.buf[: end + 4]
            self.head = self._parse_head(raw)
            method, _, _, headers, length, _ = self.head
            if headers.get("expect", "").lower() == "100-continue" and length > len(self.buf):
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        method, path, query, headers, length, keep_alive = self.head
        if len(self.buf) < length:
            return None
        body = bytes(self.buf[:length])
        del self.buf[:length]
        self.head = None
        body = _decompress(body, headers.get("content-encoding", "").strip().lower(), limits.max_body_bytes)
        return Request(method, path, query, headers, body), keep_alive

    def _parse_head(self, raw: bytes) -> tuple[str, str, str, dict[str, str], int, bool]:
        limits = self.server.limits
        try:
            text = raw.decode("latin-1")
        except UnicodeDecodeError as e:  # pragma: no cover - latin-1 decodes every byte
            raise HttpError(400, "the request head is not text") from e
        lines = text.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise HttpError(
                400, f"malformed request line {lines[0][:100]!r}; expected 'METHOD /path HTTP/1.1'"
            )
        method, target, version = parts
        if len(lines) - 1 > limits.max_headers:
            raise HttpError(431, f"more than {limits.max_headers} header lines")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise HttpError(400, f"malformed header line {line[:100]!r}")
            headers[name.lower()] = value.strip()
        if "transfer-encoding" in headers:
            raise HttpError(411, "Transfer-Encoding is not supported; send the body with a Content-Length")
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError as e:
            raise HttpError(400, f"Content-Length {headers['content-length']!r} is not an integer") from e
        if length < 0:
            raise HttpError(400, f"Content-Length {length} is negative")
        if length > limits.max_body_bytes:
            raise HttpError(
                413,
                f"the request body has {length} bytes, the limit is {limits.max_body_bytes} "
                "(--max-request-bytes)",
            )
        conn = headers.get("connection", "").lower()
        keep_alive = "close" not in conn and (version == "HTTP/1.1" or "keep-alive" in conn)
        path, _, query = target.partition("?")
        return method, path, query, headers, length, keep_alive

    # -- responding -----------------------------------------------------------------------------
    async def _respond(self, item: tuple[Request, bool]) -> None:
        request, keep_alive = item
        try:
            try:
                response = await self.server.handler(request)
            except Exception as e:  # a bug in a handler must not take the connection's peers down
                log.exception("handler failed on %s %s", request.method, request.path)
                response = Response(
                    500, [self.server.error_body(500, f"internal error: {type(e).__name__}: {e}")]
                )
            keep_alive = keep_alive and not self.server.draining
            await self._write(response, keep_alive)
        finally:
            self.server.in_flight -= 1
            self.busy = False
        if not keep_alive or self.closing:
            self.transport.close()
            return
        self.transport.resume_reading()
        self._arm(self.server.limits.keepalive_timeout_s)
        self._advance()

    async def _write(self, response: Response, keep_alive: bool) -> None:
        if self.closing:
            return
        length = sum(len(c) for c in response.body)
        head = [
            f"HTTP/1.1 {response.status} {_reason(response.status)}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {length}",
            "Connection: keep-alive" if keep_alive else "Connection: close",
        ]
        head += [f"{k}: {v}" for k, v in response.headers]
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        for chunk in response.body:
            self.transport.write(chunk)
        if self.can_write is not None:
            await self.can_write

    def _send_error(self, status: int, message: str) -> None:
        body = self.server.error_body(status, message)
        self.server.protocol_errors += 1
        head = (
            f"HTTP/1.1 {status} {_reason(status)}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        self.closing = True
        self.transport.write(head.encode("latin-1") + body)
        self.transport.close()


class HttpServer:
    """Serve ``handler`` on ``host:port``; :meth:`drain` stops accepting and answers what was begun."""

    def __init__(self, handler: Handler, error_body: ErrorBody, limits: Limits | None = None) -> None:
        self.handler = handler
        self.error_body = error_body
        self.limits = limits or Limits()
        self.connections: set[_Connection] = set()
        self.in_flight = 0
        self.protocol_errors = 0
        self.draining = False
        self._server: asyncio.base_events.Server | None = None
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]

    async def start(self, host: str, port: int) -> int:
        """Bind and listen; returns the bound port (useful with ``port=0``)."""
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(
            lambda: _Connection(self), host, port, reuse_address=True, backlog=1024
        )
        return self._server.sockets[0].getsockname()[1]

    async def drain(self, timeout: float = 30.0) -> bool:
        """Stop accepting; close idle connections; wait until every request begun is answered.

        Returns False when ``timeout`` passed with requests still unanswered."""
        self.draining = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if not conn.busy and not conn.buf and conn.head is None:
                conn.transport.close()
        deadline = time.monotonic() + timeout
        while (self.in_flight or self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        ok = self.in_flight == 0
        for conn in list(self.connections):
            with contextlib.suppress(Exception):
                conn.transport.close()
        return ok
