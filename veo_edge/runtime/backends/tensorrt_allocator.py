"""TensorRT's allocator over the veo-edge memory pool: the ``IGpuAsyncAllocator`` contract as plain calls
(:class:`PoolAllocatorCalls`, TensorRT-free so that it is tested on the CPU) and the ``trt`` subclass that
forwards to them (:func:`make_gpu_allocator`). The runner hands it to ``trt.Runtime.gpu_allocator``, so the
engine's weights and TensorRT's scratch come from the pool."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("veo_edge.runtime.tensorrt")

#: the pool's slices are 256-byte aligned (plugins/mempool)
_POOL_ALIGNMENT = 256


class PoolAllocatorCalls:
    """``IGpuAsyncAllocator``'s contract (NvInferRuntime.h, 10.3 and 11.x) over a veo-edge :class:`MemPool`,
    TensorRT-free so that it is tested on the CPU: a size-0 request gets 0 (nullptr); an alignment above
    256 or not a power of two gets 0; a null stream (0) is the legacy default stream and is fenced like any
    other; freeing 0 succeeds; nothing raises (TensorRT calls these from its own threads, noexcept)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.failures: list[str] = []  # the last few reasons a call returned 0 / False, for diagnostics

    def _failed(self, what: str) -> None:
        log.error("TensorRT allocator: %s", what)
        self.failures = [*self.failures[-9:], what]

    def allocate(self, size: int, alignment: int, stream: int) -> int:
        if size == 0:
            return 0
        if alignment > _POOL_ALIGNMENT or alignment & (alignment - 1):
            self._failed(f"alignment {alignment} requested; the pool serves 0 or powers of two up to 256")
            return 0
        try:
            return self.pool.alloc_async(int(size), int(stream or 0))
        except Exception as e:  # must not raise into TensorRT: nullptr says it
            self._failed(f"allocating {size} bytes failed: {e}")
            return 0

    def deallocate(self, memory: int, stream: int) -> bool:
        if not memory:
            return True
        try:
            self.pool.free_async(int(memory), int(stream or 0))
            return True
        except Exception as e:  # must not raise into TensorRT: False says it
            self._failed(f"freeing {memory:#x} failed: {e}")
            return False


def make_gpu_allocator(trt: Any, calls: PoolAllocatorCalls) -> Any:
    """A ``trt.IGpuAsyncAllocator`` forwarding to ``calls``. The binding (python/src/infer/pyCore.cpp,
    v10.3.0 and v11.1) calls ``allocate_async(size, alignment, stream, flags)`` with the stream third,
    whatever its docstring says; flags (reserved, 0) are ignored, and every method is overridden as the
    binding requires."""

    class PoolGpuAllocator(trt.IGpuAsyncAllocator):
        def __init__(self) -> None:
            trt.IGpuAsyncAllocator.__init__(self)

        def allocate_async(self, size: int, alignment: int, stream: int, flags: int) -> int:
            return calls.allocate(size, alignment, stream)

        def deallocate_async(self, memory: int, stream: int) -> bool:
            return calls.deallocate(memory, stream)

        def allocate(self, size: int, alignment: int, flags: int) -> int:  # deprecated: the default stream
            return calls.allocate(size, alignment, 0)

        def deallocate(self, memory: int) -> bool:
            return calls.deallocate(memory, 0)

        def reallocate(self, address: int, alignment: int, new_size: int) -> int:
            return 0  # not supported: TensorRT allocates anew

    return PoolGpuAllocator()
