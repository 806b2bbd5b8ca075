"""A response's head and body in one send.

uvicorn writes a response's head and its body with two ``transport.write`` calls, so on loopback the
server makes two sends and the client wakes for the head alone, then again for the body. :class:`OneSend`
stands in for the transport of one request's cycle (``serve.transport`` installs it) and holds the head
until the body comes. Measured (docs/benchmarks.md): a client receives one TCP segment per answer
instead of two, and perf_analyzer's turnaround between an answer and its next request fell from
163-205 µs to 74-158 µs at one client (``bench/serve.py trace``).
"""

from __future__ import annotations

from typing import Any


class OneSend:
    """The transport of one request's cycle: the first write after the response started (its head) is
    held until the next (its body) or the response's end (a HEAD has no body), then both go in one send."""

    #: a body up to this size goes out joined with the head; a larger one after it (a copy would cost more)
    JOIN_BYTES = 64 << 10

    def __init__(self, transport: Any, cycle: Any) -> None:
        self._transport, self._cycle = transport, cycle
        self._head: bytes | None = None
        self._held = False
        self._on_response, cycle.on_response = cycle.on_response, self._complete

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            if len(data) <= self.JOIN_BYTES:
                self._transport.write(head + data)
                return
            self._transport.write(head)
        elif self._cycle.response_started and not self._held:
            self._head, self._held = data, True
            return
        self._transport.write(data)

    def _flush(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            self._transport.write(head)

    def _complete(self) -> None:
        self._flush()
        self._on_response()

    def close(self) -> None:
        self._flush()  # closed before a body came: the head as uvicorn would have sent it
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
