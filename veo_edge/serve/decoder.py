"""The worker process that decodes large JSON request heads off the event loop, and that never outlives
the server: killed with SIGKILL (an OOM killer, a supervisor) a server used to leave it and
multiprocessing's resource tracker behind, reparented to init, for good.

A body bound for the worker is assembled in :class:`SharedPages` (a memfd mapping), which the worker
maps by ``/proc/<server>/fd/<fd>`` instead of receiving a pickled copy: pickling a body (protocol 4)
held two copies of it in the server at once, outside ``--max-buffered-bytes`` (8 parallel 12 MiB chunked
JSON bodies took a server with a 32 MiB cap 66-72 MiB above idle).

A worker that dies (an OOM killer) is replaced by :class:`Decoder` on the first request that finds it
gone; before, every later large JSON request got 500 ``BrokenProcessPool`` until the server restarted."""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import threading
import time
import weakref
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

log = logging.getLogger("veo_edge.serve")

#: how often the worker looks whether its server is still there (the longest it outlives a killed one)
PARENT_POLL_S = 0.5


def _exit_with(parent: int) -> None:
    """In the worker: a daemon thread that ends the process once ``parent`` is gone (reparented)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(0)  # the server is gone: nobody is left to answer to

    threading.Thread(target=watch, name="veo-edge-parent-watch", daemon=True).start()


def start_decoder() -> ProcessPoolExecutor:
    """The decoding worker, started now (spawned: never fork a process holding backend threads; before
    the gRPC server exists, whose fork handlers would complain). It exits within
    :data:`PARENT_POLL_S` of its server, however the server ended; the resource tracker follows it."""
    import multiprocessing

    pool = ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_exit_with,
        initargs=(os.getpid(),),
    )
    pool.submit(int)
    return pool


class Decoder:
    """The decoding worker as the HTTP app uses it: started on first need (or given, started), replaced
    when it died. ``decode`` parses an infer request in it; a request in flight on a worker that died is
    decoded once more on the new one, and gets 503 (retryable) should that one die too."""

    def __init__(self, pool: ProcessPoolExecutor | None = None) -> None:
        self.pool = pool
        self.map_bodies = True  # the worker maps bodies in SharedPages (False once it cannot)

    def prestart(self) -> None:
        if self.pool is None:
            self.pool = start_decoder()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None

    async def decode(self, body: Any, hlen: str | None, model: Any) -> Any:
        from veo_edge.serve.protocol import ProtocolError

        for _ in range(2):
            self.prestart()
            pool = self.pool
            try:
                return await self._decode_in(pool, body, hlen, model)
            except BrokenProcessPool as e:
                if self.pool is pool:  # the first request to find it dead replaces it; the rest retry
                    self.close()
                    self.prestart()
                    log.warning("the JSON decoding worker died (%s); started a new one", e)
        raise ProtocolError(
            "the JSON decoding worker died twice while decoding this request (out of memory?); retry "
            "it, or send its tensors as binary data (Inference-Header-Content-Length)",
            503,
        )

    async def _decode_in(self, pool: Any, body: Any, hlen: str | None, model: Any) -> Any:
        from veo_edge.serve.protocol import parse_infer_request

        loop = asyncio.get_running_loop()
        ref = shared_ref(body) if self.map_bodies else None  # mapped by the worker, never pickled
        if ref is not None:
            try:
                return await loop.run_in_executor(pool, parse_shared, os.getpid(), *ref, hlen, model)
            except OSError as e:  # the worker may not open /proc/<server>/fd (a locked-down /proc)
                self.map_bodies = False
                log.warning("the JSON decoding worker cannot map request bodies (%s); they are copied", e)
        return await loop.run_in_executor(pool, parse_infer_request, body, hlen, model)


#: memfd exists (Linux): bodies for the worker are assembled in SharedPages; elsewhere they are pickled
SHARED_PAGES = hasattr(os, "memfd_create")


class SharedPages(mmap.mmap):
    """``size`` bytes of a memfd, mapped: the pages exist only once written and go back to the kernel
    when the mapping is dropped (its fd closes with it). The decoding worker maps the same pages."""

    fd: int

    @classmethod
    def create(cls, size: int) -> SharedPages:
        fd = os.memfd_create("veo-edge-body", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            pages = cls(fd, size)
        except BaseException:
            os.close(fd)
            raise
        pages.fd = fd
        weakref.finalize(pages, os.close, fd)
        return pages


def shared_ref(body: Any) -> tuple[int, int, int] | None:
    """``(fd, inode, size)`` of a body that lies in :class:`SharedPages` (a numpy view of them), else None."""
    base = body
    while hasattr(base, "base") and base.base is not None:  # numpy views, down to the memoryview
        base = base.base
    base = getattr(base, "obj", base)
    if not isinstance(base, SharedPages) or base.closed:
        return None
    return base.fd, os.fstat(base.fd).st_ino, len(body)


def parse_shared(server: int, fd: int, inode: int, size: int, hlen: str | None, model: Any) -> Any:
    """In the worker: parse the infer request whose body lies in the server's memfd ``fd`` (checked by
    ``inode``, so a reused fd number is never read as the body)."""
    from veo_edge.serve.protocol import parse_infer_request

    own = os.open(f"/proc/{server}/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if os.fstat(own).st_ino != inode:
            raise OSError(f"fd {fd} of process {server} is no longer the request body")
        pages = mmap.mmap(own, size, access=mmap.ACCESS_READ)  # unmapped with the last view of it
        return parse_infer_request(memoryview(pages), hlen, model)
    finally:
        os.close(own)
