"""ctypes binding of the veo-edge memory pool (``plugins/mempool``, ``libveo_mempool.so``).

One region reserved up front, 256-byte aligned slices handed out best fit, frees coalesced, an explicit
counted overflow path when the region is exhausted (bounded; an overflow region is given back once it is
free again). The CUDA backend's slices serve as the activation memory of TensorRT contexts created with
``ExecutionContextAllocationStrategy.USER_MANAGED``, and (through
:class:`veo_edge.runtime.backends.tensorrt.PoolAllocatorCalls`) as TensorRT's own allocations::

    with MemPool("cuda", capacity=4 * (engine.device_memory_size_v2 + io_bytes)) as pool:
        mem = pool.alloc(engine.device_memory_size_v2)
        context.set_device_memory(mem, engine.device_memory_size_v2)

Streams: ``alloc``/``free`` take ``stream=None`` as "no stream" (a free is reusable at once);
``alloc_async``/``free_async`` are always stream-ordered, and their stream ``0`` is the legacy default
stream, fenced like any other (what TensorRT's allocator interface means by a null stream).

The library is found through ``VEO_EDGE_MEMPOOL_LIB`` or in ``build/plugins`` of the repository
(``make plugins`` builds it). Nothing is loaded before a pool is created.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from veo_edge.errors import BackendError, BackendUnavailableError, UsageError, VeoEdgeError
from veo_edge.nativelib import DEFAULT_BUILD_DIR, locate

LIB_NAME = "libveo_mempool.so"
ENV_VAR = "VEO_EDGE_MEMPOOL_LIB"
ABI_VERSION = 2
ALIGNMENT = 256

_BACKENDS = {"host": 0, "cuda": 1}
_OK, _INVALID, _OOM, _UNAVAILABLE, _UNKNOWN_PTR = 0, 1, 2, 3, 4


class MemPoolError(VeoEdgeError):
    """The pool refused an operation (exhausted without overflow, bad pointer, bad argument)."""


class MemPoolOutOfMemoryError(MemPoolError):
    """The pool, or the device/host allocation behind it (cudaMalloc), ran out of memory."""


class _Stats(ctypes.Structure):
    _fields_ = [  # the C struct's field order (veoMempool.h)
        ("capacity", ctypes.c_uint64),
        ("in_use", ctypes.c_uint64),
        ("peak_in_use", ctypes.c_uint64),
        ("pending_free", ctypes.c_uint64),
        ("largest_free", ctypes.c_uint64),
        ("total_free", ctypes.c_uint64),
        ("fragmentation", ctypes.c_double),
        ("alloc_count", ctypes.c_uint64),
        ("free_count", ctypes.c_uint64),
        ("overflow_count", ctypes.c_uint64),
        ("region_count", ctypes.c_uint64),
        ("overflow_bytes", ctypes.c_uint64),  # ABI 2
        ("overflow_limit", ctypes.c_uint64),
        ("overflow_released", ctypes.c_uint64),
        ("fence_waits", ctypes.c_uint64),
    ]


@dataclass(frozen=True)
class PoolStats:
    capacity: int
    in_use: int
    peak_in_use: int
    pending_free: int
    largest_free: int
    total_free: int
    fragmentation: float  # 1 - largest_free / total_free; 0.0 when nothing is free
    alloc_count: int
    free_count: int
    overflow_count: int  # overflow regions ever added
    region_count: int  # regions held now
    overflow_bytes: int  # bytes held now in overflow regions
    overflow_limit: int  # most bytes overflow regions may hold at once
    overflow_released: int  # overflow regions given back once free again
    fence_waits: int  # allocations that waited on a pending free instead of growing


def find_library(search_dirs: list[Path] | None = None) -> Path:
    """Path of ``libveo_mempool.so``: ``$VEO_EDGE_MEMPOOL_LIB``, else the first of ``search_dirs``
    (default: ``build/plugins`` of the repository) that holds it."""
    path = locate(
        LIB_NAME, ENV_VAR, search_dirs, "or unset it to use build/plugins (built by `make plugins`)"
    )
    if path is not None:
        return path
    dirs = search_dirs if search_dirs is not None else [DEFAULT_BUILD_DIR]
    looked = ", ".join(str(d) for d in dirs)
    raise BackendUnavailableError(
        f"memory pool library {LIB_NAME} not found (looked in: {looked}); build it with `make plugins` "
        f"or set {ENV_VAR} to its path"
    )


_LIBS: dict[Path, ctypes.CDLL] = {}


def _load(path: Path) -> ctypes.CDLL:
    path = path.resolve()
    if path in _LIBS:
        return _LIBS[path]
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise BackendUnavailableError(f"cannot load {path}: {e}; rebuild it with `make plugins`") from e
    vp, u64, c_int = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int
    lib.veo_mempool_abi_version.restype = c_int
    lib.veo_mempool_create.argtypes = [c_int, u64, ctypes.POINTER(vp)]
    lib.veo_mempool_destroy.argtypes = [vp]
    lib.veo_mempool_alloc.argtypes = [vp, u64, vp, ctypes.POINTER(vp)]
    lib.veo_mempool_free.argtypes = [vp, vp, vp]
    lib.veo_mempool_set_overflow.argtypes = [vp, c_int]
    lib.veo_mempool_alloc_async.argtypes = [vp, u64, vp, ctypes.POINTER(vp)]
    lib.veo_mempool_free_async.argtypes = [vp, vp, vp]
    lib.veo_mempool_set_overflow_limit.argtypes = [vp, u64]
    lib.veo_mempool_get_stats.argtypes = [vp, ctypes.POINTER(_Stats)]
    lib.veo_mempool_check.argtypes = [vp, ctypes.c_char_p, u64]
    lib.veo_mempool_last_error.restype = ctypes.c_char_p
    for fn in (
        *("create", "destroy", "alloc", "free", "set_overflow", "get_stats", "check"),
        *("alloc_async", "free_async", "set_overflow_limit"),
    ):
        getattr(lib, f"veo_mempool_{fn}").restype = c_int
    if hasattr(lib, "veo_mempool_free_blocks"):  # newer than some libraries built before it
        lib.veo_mempool_free_blocks.argtypes = [vp, ctypes.POINTER(u64), u64, ctypes.POINTER(u64)]
        lib.veo_mempool_free_blocks.restype = c_int
    got = lib.veo_mempool_abi_version()
    if got != ABI_VERSION:
        raise BackendUnavailableError(
            f"{path} has memory pool ABI {got}, this veo-edge expects {ABI_VERSION}; rebuild with `make plugins`"
        )
    _LIBS[path] = lib
    return lib


class MemPool:
    """A memory pool of ``capacity`` bytes on ``backend`` ("host" or "cuda"). Close it (or use ``with``)."""

    def __init__(
        self,
        backend: Literal["host", "cuda"] = "host",
        capacity: int = 0,
        *,
        overflow: bool = True,
        overflow_limit: int | None = None,
        library: Path | None = None,
    ) -> None:
        if backend not in _BACKENDS:
            raise UsageError(f"unknown memory pool backend {backend!r}; choose one of: host, cuda")
        if capacity <= 0:
            raise UsageError(
                f"memory pool capacity must be > 0 bytes, got {capacity}; size it at 4x the max-batch "
                "activation + I/O need"
            )
        self.backend = backend
        self.library = Path(library) if library is not None else find_library()
        self._lib = _load(self.library)
        handle = ctypes.c_void_p()
        self._check(self._lib.veo_mempool_create(_BACKENDS[backend], capacity, ctypes.byref(handle)))
        self._handle: ctypes.c_void_p | None = handle
        if not overflow:
            self._check(self._lib.veo_mempool_set_overflow(handle, 0))
        elif overflow_limit is not None:
            if overflow_limit < 0:
                raise UsageError(f"overflow limit must be >= 0 bytes, got {overflow_limit}")
            self._check(self._lib.veo_mempool_set_overflow_limit(handle, overflow_limit))

    def _check(self, status: int) -> None:
        if status == _OK:
            return
        msg = (self._lib.veo_mempool_last_error() or b"").decode(errors="replace")
        if status == _UNAVAILABLE:
            raise BackendUnavailableError(msg)
        if status == _OOM:
            raise MemPoolOutOfMemoryError(msg)
        if status in (_INVALID, _UNKNOWN_PTR):
            raise MemPoolError(msg)
        raise BackendError(f"memory pool internal error (status {status}): {msg}")

    def _live(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise MemPoolError("this memory pool is closed; create a new MemPool")
        return self._handle

    def alloc(self, size: int, stream: int | None = None) -> int:
        """Address of a 256-byte aligned slice of at least ``size`` bytes. ``stream``: a cudaStream_t as int."""
        if size <= 0:
            raise MemPoolError(f"cannot allocate {size} bytes from the memory pool; ask for > 0")
        out = ctypes.c_void_p()
        self._check(self._lib.veo_mempool_alloc(self._live(), size, stream, ctypes.byref(out)))
        return int(out.value or 0)

    def free(self, ptr: int, stream: int | None = None) -> None:
        """Return a slice; with ``stream`` it is reused by other streams only once the stream passed here."""
        self._check(self._lib.veo_mempool_free(self._live(), ptr, stream))

    def alloc_async(self, size: int, stream: int) -> int:
        """As :meth:`alloc`, ordered on ``stream``; ``0`` is the legacy default stream."""
        if size <= 0:
            raise MemPoolError(f"cannot allocate {size} bytes from the memory pool; ask for > 0")
        out = ctypes.c_void_p()
        self._check(self._lib.veo_mempool_alloc_async(self._live(), size, stream, ctypes.byref(out)))
        return int(out.value or 0)

    def free_async(self, ptr: int, stream: int) -> None:
        """Return a slice ordered on ``stream``; ``0`` is the legacy default stream, fenced like any other
        (reused by other streams only once that stream passed this point)."""
        self._check(self._lib.veo_mempool_free_async(self._live(), ptr, stream))

    def stats(self) -> PoolStats:
        raw = _Stats()
        self._check(self._lib.veo_mempool_get_stats(self._live(), ctypes.byref(raw)))
        return PoolStats(**{name: getattr(raw, name) for name, _ in _Stats._fields_})

    def free_blocks(self) -> list[int]:
        """Sizes of the free blocks in address order (what fragmentation metrics are computed from)."""
        if not hasattr(self._lib, "veo_mempool_free_blocks"):
            raise BackendUnavailableError(
                f"{self.library} predates veo_mempool_free_blocks; rebuild it with `make plugins`"
            )
        count = ctypes.c_uint64()
        while True:
            self._check(self._lib.veo_mempool_free_blocks(self._live(), None, 0, ctypes.byref(count)))
            n = count.value
            buf = (ctypes.c_uint64 * max(n, 1))()
            self._check(self._lib.veo_mempool_free_blocks(self._live(), buf, n, ctypes.byref(count)))
            if count.value <= n:  # no other thread added blocks between the two calls
                return [int(v) for v in buf[: count.value]]

    def check(self) -> str:
        """Empty when the pool's internal invariants hold, else what is wrong (for tests)."""
        buf = ctypes.create_string_buffer(4096)
        self._check(self._lib.veo_mempool_check(self._live(), buf, len(buf)))
        return buf.value.decode()

    def close(self) -> None:
        if self._handle is not None:
            self._lib.veo_mempool_destroy(self._handle)
            self._handle = None

    def __enter__(self) -> MemPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None:
            self.close()
