"""Triton's shared-memory extension: tensors a same-host client passes through memory, not the socket.

A client creates a POSIX shared-memory segment (``/dev/shm/KEY``, e.g. with
``tritonclient.utils.shared_memory``), registers a region of it under a name
(``POST /v2/systemsharedmemory/region/NAME/register`` or gRPC ``SystemSharedMemoryRegister``), and names
that region in an input's or a requested output's parameters (``shared_memory_region``,
``shared_memory_byte_size``, ``shared_memory_offset``). The server maps the segment once, at register:
an input is a read-only numpy view of the mapping (its bytes are read once, by the batcher that gathers
the batch), an output is written into it, and neither crosses the socket.

Safety: a key is a plain segment name (``/name``; no other slash, nothing outside ``/dev/shm``); a
region must lie inside its segment, and a tensor inside its region, or the request gets 400 and nothing
else changes. A region in use by a request is mapped until that request ends, even when it is
unregistered meanwhile; such a request answers 400 instead of writing into a region its client gave up.
The server never creates or unlinks a segment (the client owns it): it unmaps on unregister and at
shutdown, so no mapping outlives either. Shared memory is off unless ``serve --shared-memory`` turns it
on (as Triton's ``--allow-client-shm``): a peer that may register regions may read and write any
segment the server's user can open under ``/dev/shm``.

CUDA shared memory (``/v2/cudasharedmemory``): a region is a cudaIPC handle opened with cuda-python
(imported when a region is registered); inputs are copied to the host and outputs to the device (the
CPU backends read host memory). Where CUDA or cuda-python is absent, register answers 501 with the
reason; status lists nothing and unregister has nothing to do (clients clean up with both).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import mmap
import os
import re
import stat
from typing import Any

import numpy as np

from veo_edge.serve.protocol import InferRequest, ProtocolError, ShmRef
from veo_edge.serve.shm_region import Region

log = logging.getLogger("veo_edge.serve")

SHM_DIR = "/dev/shm"
#: a shm_open name: one leading slash at most, then no slash (nothing outside /dev/shm)
_KEY = re.compile(r"^/?(?!\.\.?$)[^/\x00]{1,255}$")
#: regions registered at once (each a mapping and a file descriptor's worth of kernel state)
MAX_REGIONS = 1024
KINDS = ("system", "cuda")


class SystemRegion(Region):
    """``byte_size`` bytes at ``offset`` of the POSIX shared-memory segment ``key``, mapped read-write."""

    def __init__(self, name: str, key: str, offset: int, byte_size: int) -> None:
        super().__init__(name, byte_size)
        if not _KEY.match(key):
            raise ProtocolError(
                f"shared-memory key {key[:100]!r} is not a segment name; expected '/name' as shm_open takes it"
            )
        if offset < 0 or byte_size <= 0:
            raise ProtocolError(
                f"region {name!r} has offset {offset} and byte_size {byte_size}; expected offset >= 0 and "
                "byte_size > 0"
            )
        self.key, self.offset = key, offset
        path = os.path.join(SHM_DIR, key.lstrip("/"))
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise ProtocolError(
                f"cannot open shared-memory key {key!r} for region {name!r}: {e.strerror}; create the segment "
                "on this host first (the server and the client must share /dev/shm)"
            ) from e
        self._path = path
        try:
            st = os.fstat(fd)
            size, self._inode = st.st_size, (st.st_dev, st.st_ino)
            if not stat.S_ISREG(st.st_mode) or offset + byte_size > size:
                raise ProtocolError(
                    f"region {name!r} needs bytes {offset}..{offset + byte_size} of shared-memory key {key!r}, "
                    f"which has {size}"
                )
            self._mm: mmap.mmap | None = mmap.mmap(fd, offset + byte_size)
        finally:
            os.close(fd)  # the mapping keeps the segment; no descriptor stays open

    def _span(self, ref: ShmRef) -> int:
        if self._mm is None:
            raise ProtocolError(f"shared-memory region {self.name!r} was unregistered")
        self._check_segment()
        return self.offset + ref.offset

    def _check_segment(self) -> None:
        """Refuse a segment its client shrank (touching the mapping past its end is SIGBUS: the whole
        server would die) or replaced under the same key since the register (the mapping is the old,
        unlinked one). A segment unlinked but still mapped is fine: the mapping keeps its memory.
        A stat of the key, about 2 us; a client that shrinks it while the batch reads it is not caught."""
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            return
        except OSError as e:
            raise ProtocolError(
                f"shared-memory key {self.key!r} of region {self.name!r}: {e.strerror}"
            ) from e
        if (st.st_dev, st.st_ino) != self._inode:
            raise ProtocolError(
                f"shared-memory key {self.key!r} was re-created after region {self.name!r} was registered; "
                "unregister and register the region again"
            )
        if st.st_size < self.offset + self.byte_size:
            raise ProtocolError(
                f"shared-memory key {self.key!r} has shrunk to {st.st_size} bytes since region {self.name!r} "
                f"was registered (it needs {self.offset + self.byte_size}); register it again"
            )

    def read(self, ref: ShmRef, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        start = self._span(ref)
        arr = np.frombuffer(self._mm, dtype=dtype, count=ref.byte_size // dtype.itemsize, offset=start)
        arr.flags.writeable = False  # the client's bytes: nothing on the way may change them
        return arr.reshape(shape)

    def write(self, ref: ShmRef, data: bytes | memoryview) -> None:
        start = self._span(ref)
        self._mm[start : start + len(data)] = data  # type: ignore[index]

    def close(self) -> None:
        mm, self._mm = self._mm, None
        if mm is not None:
            with contextlib.suppress(BufferError):  # a request's array still lives: unmapped when it goes
                mm.close()

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


class Lease:
    """The regions one request uses, held until it ends; writes its shared-memory outputs."""

    def __init__(self, registry: ShmRegistry) -> None:
        self.registry = registry
        self.regions: dict[str, Region] = {}

    def region(self, ref: ShmRef, what: str) -> Region:
        region = self.regions.get(ref.region)
        if region is None:
            region = self.registry.lookup(ref.region, what)
            region.users += 1
            self.regions[ref.region] = region
        region.check(ref, what)
        return region

    def write(self, ref: ShmRef, data: bytes | memoryview) -> None:
        region = self.regions[ref.region]
        if not region.registered:
            raise ProtocolError(
                f"shared-memory region {ref.region!r} was unregistered while the request used it; its output "
                "was not written"
            )
        if len(data) > ref.byte_size:
            raise ProtocolError(
                f"the output needs {len(data)} bytes, its shared_memory_byte_size in region {ref.region!r} is "
                f"{ref.byte_size}"
            )
        region.write(ref, data)

    def release(self) -> None:
        for region in self.regions.values():
            region.release()
        self.regions.clear()


class ShmRegistry:
    """The registered regions of one server (both transports and every model share them)."""

    def __init__(self, enabled: bool = False) -> None:
        self.enabled = enabled
        self.regions: dict[str, Region] = {}

    def extensions(self) -> list[str]:
        return ["cuda_shared_memory", "system_shared_memory"] if self.enabled else []

    def _refuse_off(self) -> None:
        if not self.enabled:
            raise ProtocolError(
                "shared memory is off on this server; start it with `veo-edge serve --shared-memory` (a "
                "client on the same host then passes tensors through /dev/shm)",
                403,
            )

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._refuse_off()
        self._check_new(name)
        self.regions[name] = SystemRegion(name, key, offset, byte_size)
        log.info("shared-memory region %r registered: key %r, %d bytes at %d", name, key, byte_size, offset)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self._refuse_off()
        self._check_new(name)
        from veo_edge.serve.shm_cuda import CudaRegion

        self.regions[name] = CudaRegion(name, raw_handle, device_id, byte_size)

    @staticmethod
    def b64_handle(body: dict[str, Any]) -> bytes:
        """The raw cudaIPC handle of an HTTP register body (``{"raw_handle": {"b64": ...}}``)."""
        raw = body.get("raw_handle")
        b64 = raw.get("b64") if isinstance(raw, dict) else None
        if not isinstance(b64, str):
            raise ProtocolError('the register request needs "raw_handle": {"b64": "<base64 cudaIPC handle>"}')
        try:
            return base64.b64decode(b64, validate=True)
        except ValueError as e:
            raise ProtocolError(f"raw_handle.b64 is not base64: {e}") from e

    def _check_new(self, name: str) -> None:
        if not name or len(name) > 255:
            raise ProtocolError(f"shared-memory region name {name[:100]!r} must have 1..255 characters")
        if name in self.regions:
            raise ProtocolError(
                f"shared-memory region {name!r} is already registered; unregister it first or choose another name",
                409,
            )
        if len(self.regions) >= MAX_REGIONS:
            raise ProtocolError(
                f"{MAX_REGIONS} shared-memory regions are registered, the most this server holds; unregister some",
                429,
            )

    def lookup(self, name: str, what: str = "the request") -> Region:
        region = self.regions.get(name)
        if region is None:
            raise ProtocolError(
                f"{what} names shared-memory region {name!r}, which is not registered"
                + ("" if self.enabled else " (shared memory is off on this server: serve --shared-memory)")
            )
        return region

    def unregister(self, kind: str, name: str | None = None) -> None:
        """Unregister ``name`` (every region of ``kind`` when None); its mapping goes once no request uses it."""
        if name is None:
            names = [n for n, r in self.regions.items() if r.kind == kind]
        else:  # an unknown name has nothing to unregister (as Triton answers it)
            names = [name] if name in self.regions and self.regions[name].kind == kind else []
        for n in names:
            region = self.regions.pop(n)
            region.registered = False
            if region.users == 0:
                region.close()

    def status(self, kind: str, name: str | None = None) -> list[dict[str, Any]]:
        if name is None:
            return [r.status() for r in self.regions.values() if r.kind == kind]
        region = self.regions.get(name)
        if region is None or region.kind != kind:
            raise ProtocolError(f"no {kind} shared-memory region {name!r} is registered")
        return [region.status()]

    def attach(self, request: InferRequest) -> Lease | None:
        """Resolve ``request``'s shared-memory inputs into arrays and hold its regions (``None`` when it
        names none: the common case costs two checks). Release the lease when the request ends."""
        if not request.shm_inputs and not any(o.shm is not None for o in request.outputs):
            return None
        lease = Lease(self)
        try:
            for name, x in request.shm_inputs.items():
                region = lease.region(x.ref, f"input {name!r}")
                request.inputs[name] = region.read(x.ref, x.dtype, x.shape)
            for out in request.outputs:
                if out.shm is not None:
                    lease.region(out.shm, f"output {out.name!r}")
        except BaseException:
            lease.release()
            raise
        return lease

    def close(self) -> None:
        """Unmap every region (shutdown); the client's segments stay, theirs to unlink."""
        for kind in KINDS:
            self.unregister(kind)
