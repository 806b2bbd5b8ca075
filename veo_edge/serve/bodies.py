"""Request bodies within a memory bound that holds: read (``Content-Length`` or chunked), inflated
(gzip/deflate) and assembled into one buffer, each byte counted against the per-request cap
(``--max-request-bytes``, 413) and against the bytes held across all connections
(``--max-buffered-bytes``, 503) as it lands in the buffer, never afterwards.

- A body that arrives in one message is used as it came (no copy).
- Otherwise it is written into one buffer of its final size (``Content-Length``), or, for chunked and
  compressed bodies whose size shows only as they arrive, into one anonymous mapping of the per-request
  cap, whose pages exist only once written and go back to the kernel with the body.
  No body is assembled twice, and the parser reads the tensor bytes where they lie.
- A body whose JSON head may be decoded in the worker process (over ``Limits.offload_json_bytes``) is
  assembled in :class:`veo_edge.serve.decoder.SharedPages` (a memfd, pages again only once written),
  which the worker maps: it is never pickled to it (that held two more copies, outside the cap).
- Compressed bodies are inflated as they arrive, ``INFLATE_STEP`` bytes at a time on the event loop
  (which serves others between steps): a gzip bomb is refused once its inflated bytes reach a cap.

So peak memory above idle stays within ``--max-buffered-bytes`` plus, per connection reading a body,
what the transport holds before the application reads it (``Limits.read_high_water_bytes``, 1 MiB,
and uvicorn's copy of it while it appends): ``BODY_MARGIN_PER_CONNECTION``; one inflate step is in
hand at a time (inflating runs on the loop, a step at a time). docs/serving.md states the bound;
tests/serve/test_memory_bound.py holds the server to it.
"""

from __future__ import annotations

import asyncio
import mmap
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from veo_edge.serve.decoder import SHARED_PAGES, SharedPages
from veo_edge.serve.transport import Limits

#: bytes inflated per zlib call (~1 ms of the event loop's time; it serves others between steps): the
#: most a compressed body holds beyond what is counted, and only one step is in hand at a time
INFLATE_STEP = 256 << 10
#: what one connection reading a body may hold beyond the counted bytes (see the module's docstring)
BODY_MARGIN_PER_CONNECTION = 2 << 20
#: once the bytes held fall back to none after reaching this many, and stay none for TRIM_DELAY_S (the
#: connections' own buffers go too), the heap's free pages go back to the kernel (glibc's malloc_trim,
#: under 1 ms): without it the idle RSS climbed 37 MiB over 80 bomb waves, with it 8
TRIM_AFTER_BYTES = 8 << 20
TRIM_DELAY_S = 1.0


class HttpError(Exception):
    """Answered with ``status``; ``close`` when the request's body was not read (the connection closes)."""

    def __init__(self, status: int, message: str, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.close = close


class Disconnected(Exception):
    pass


class BodyBudget:
    """Request-body bytes held now across all connections, against ``max_buffered_bytes``."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.held = 0
        self.high = 0  # the most held since the heap was last trimmed

    def take(self, n: int, request_holds: int, check_only: bool = False) -> None:
        """Count ``n`` more bytes of a request that holds ``request_holds``; 503 (and close) over the cap.

        Bytes are counted as they land, never as declared, so connections that announce large bodies
        and send nothing cannot lock the budget; a declared length that cannot fit now is refused at
        once (``check_only``), before its bytes are read."""
        cap = self.limits.max_buffered_bytes
        if self.held + n > cap:
            raise HttpError(
                503,
                f"the server holds {self.held} bytes of request bodies and this request needs "
                f"{request_holds + n}; the limit across all connections is {cap} (--max-buffered-bytes); "
                "retry later",
                close=True,
            )
        if not check_only:
            self.held += n
            self.high = max(self.high, self.held)

    def give(self, n: int) -> None:
        self.held -= n
        if self.held == 0 and self.high >= TRIM_AFTER_BYTES:  # a burst of large bodies has ended
            self.high = 0
            try:
                asyncio.get_running_loop().call_later(TRIM_DELAY_S, self._trim_if_idle)
            except RuntimeError:  # no event loop in this thread
                release_heap()

    def _trim_if_idle(self) -> None:
        if self.held == 0:
            release_heap()


_malloc_trim: Any = None


def release_heap() -> None:
    """Give the free pages inside the heap back to the kernel (glibc's ``malloc_trim``; elsewhere nothing).
    glibc returns only the heap's top on its own, so the pages freed between what a burst left in use
    stayed with the process: idle RSS ratcheted up with each burst of large bodies, Python objects flat."""
    global _malloc_trim
    if _malloc_trim is None:
        import ctypes

        _malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", False)  # musl has none
    if _malloc_trim:
        _malloc_trim(0)


class _Sink:
    """The one buffer a body is assembled in; every byte is counted in the budget before it is written.
    A body of declared length gets a buffer of that length from the allocator; one whose size shows only
    as it arrives (chunked, compressed) an anonymous mapping of the per-request cap, whose pages the
    kernel provides only as they are written and takes back the moment the body is dropped. A body the
    JSON decoding worker may read (``shared``) goes into shared pages of the same kind, which it maps."""

    def __init__(
        self,
        budget: BodyBudget,
        capacity: int,
        limit: int,
        what: str,
        exact: bool = False,
        shared: bool = False,
    ) -> None:
        self.budget, self.limit, self.what, self.exact, self.shared = budget, limit, what, exact, shared
        self.buf: np.ndarray | None = None
        self.capacity = capacity
        self.size = 0  # bytes written, all counted in the budget

    def write(self, data: bytes | memoryview) -> None:
        n = len(data)
        if self.size + n > self.limit:
            raise HttpError(413, f"the {self.what} exceeds {self.limit} bytes (--max-request-bytes)", True)
        self.budget.take(n, self.size)
        self.size += n
        if self.buf is None:
            self.buf = self._allocate()
        self.buf[self.size - n : self.size] = np.frombuffer(data, np.uint8)

    def body(self) -> Any:
        return self.buf[: self.size] if self.buf is not None else b""

    def _allocate(self) -> np.ndarray:
        if self.shared and self.capacity > self.budget.limits.offload_json_bytes and SHARED_PAGES:
            return np.frombuffer(SharedPages.create(self.capacity), np.uint8)
        if self.exact:  # a declared length: the whole buffer is written; the allocator's reused pages are
            return np.empty(self.capacity, np.uint8)  # 20x faster than fresh ones (13 vs 240 us, 600 kB)
        return np.frombuffer(mmap.mmap(-1, max(self.capacity, 1)), np.uint8)


async def read_body(scope: dict, receive: Callable, limits: Limits, budget: BodyBudget) -> tuple[Any, int]:
    """The whole (inflated) body of a request and the bytes counted for it in ``budget`` (give them back
    when the request ends). The body is ``bytes`` or a uint8 numpy array; both are buffers."""
    length = encoding = None
    shared = True  # the body may go to the JSON decoding worker: assembled where it can map it
    for k, v in scope["headers"]:
        if k == b"content-length":
            length = int(v)  # llhttp accepts only digits, and only one Content-Length
        elif k == b"content-encoding":
            encoding = v.decode("latin-1").strip().lower()
        elif k == b"inference-header-content-length":
            shared = not v.isdigit() or int(v) > limits.offload_json_bytes
    limit = limits.max_body_bytes
    if length is not None and length > limit:
        raise HttpError(
            413, f"the request body has {length} bytes, the limit is {limit} (--max-request-bytes)", True
        )
    if scope["method"] in ("GET", "HEAD") and not length:
        return b"", 0
    compressed = encoding not in (None, "", "identity")
    if compressed and encoding not in ("gzip", "deflate"):
        raise HttpError(415, f"Content-Encoding {encoding!r} is not supported; use gzip, deflate or none")
    if length and not compressed:
        budget.take(length, 0, check_only=True)
    sink: _Sink | None = None
    inflater = _Inflater(encoding, budget, limit, shared) if compressed else None
    try:
        first = True
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise Disconnected
            chunk, more = msg.get("body", b""), msg.get("more_body", False)
            if inflater is not None:
                if chunk:
                    await inflater.feed(chunk)
            elif first and not more:  # the common case: the whole body in one message, no copy
                if len(chunk) > limit:
                    raise HttpError(
                        413, f"the chunked request body exceeds {limit} bytes (--max-request-bytes)", True
                    )
                budget.take(len(chunk), 0)
                return chunk, len(chunk)
            elif chunk:
                if sink is None:
                    what, exact = "chunked request body", bool(length)
                    sink = _Sink(budget, length or limit, limit, what, exact=exact, shared=shared)
                sink.write(chunk)
            first = False
            if not more:
                break
        if inflater is not None:
            return inflater.finish(), inflater.sink.size
        return (sink.body(), sink.size) if sink is not None else (b"", 0)
    except BaseException:
        budget.give(inflater.sink.size if inflater is not None else sink.size if sink is not None else 0)
        raise


class _Inflater:
    """gzip/deflate inflated as it arrives, one step at a time, into a counted sink."""

    def __init__(self, encoding: str, budget: BodyBudget, limit: int, shared: bool) -> None:
        self.encoding = encoding
        wbits = zlib.MAX_WBITS | 16 if encoding == "gzip" else zlib.MAX_WBITS
        self.d = zlib.decompressobj(wbits)
        self.sink = _Sink(budget, limit, limit, "decompressed request body", shared=shared)

    def _step(self, data: bytes) -> bytes:
        try:
            return self.d.decompress(data, INFLATE_STEP)
        except zlib.error as e:
            raise HttpError(400, f"the {self.encoding} request body is corrupt: {e}") from e

    async def feed(self, chunk: bytes) -> None:
        data = chunk
        while data and not self.d.eof:
            out = self._step(data)
            if out:
                self.sink.write(out)
            data = self.d.unconsumed_tail
            if data:  # more to inflate from this chunk: let the loop serve others meanwhile
                await asyncio.sleep(0)

    def finish(self) -> Any:
        if not self.d.eof:
            raise HttpError(400, f"the {self.encoding} request body is truncated")
        return self.sink.body()
