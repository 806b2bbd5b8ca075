"""CUDA shared memory (Triton's ``cudasharedmemory``): a region is device memory another process exported
with ``cudaIpcGetMemHandle``; the server opens the handle with cuda-python and copies an input to the host
(the CPU backends read host memory) and an output to the device. Imported only when a client registers a
CUDA region; where cuda-python or a CUDA device is absent, that registration answers 501 with the reason.
Kept thin: GPU hosts run it, this repository's CI (no GPU) tests the refusal.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from veo_edge.errors import VeoEdgeError
from veo_edge.serve.protocol import ProtocolError, ShmRef
from veo_edge.serve.shm_region import Region

IPC_HANDLE_BYTES = 64  # CUDA_IPC_HANDLE_SIZE


def _runtime() -> Any:
    """cuda-python's runtime module, with at least one device; a 501 ProtocolError naming what is missing."""
    from veo_edge.runtime.backends.tensorrt_cuda import _cuda_check, _cudart

    try:
        cudart = _cudart()
        count = _cuda_check(cudart.cudaGetDeviceCount(), "counting CUDA devices")
    except VeoEdgeError as e:
        raise ProtocolError(
            f"CUDA shared memory is not available on this host ({e}); use system shared memory "
            "(/v2/systemsharedmemory) or serve on a GPU host",
            501,
        ) from e
    if not count:
        raise ProtocolError(
            "CUDA shared memory is not available on this host (no CUDA device); use system shared memory",
            501,
        )
    return cudart


def _check(result: Any, what: str) -> Any:
    from veo_edge.runtime.backends.tensorrt_cuda import _cuda_check

    try:
        return _cuda_check(result, what)
    except VeoEdgeError as e:
        raise ProtocolError(f"{what} failed: {e}") from e


class CudaRegion(Region):
    kind = "cuda"

    def __init__(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        super().__init__(name, byte_size)
        cudart = _runtime()
        if len(raw_handle) != IPC_HANDLE_BYTES:
            raise ProtocolError(
                f"region {name!r} has a raw_handle of {len(raw_handle)} bytes; a cudaIPC handle has "
                f"{IPC_HANDLE_BYTES} (tritonclient's cuda_shared_memory.get_raw_handle gives one)"
            )
        if byte_size <= 0 or device_id < 0:
            raise ProtocolError(f"region {name!r} has byte_size {byte_size} and device_id {device_id}")
        self.cudart, self.device_id = cudart, device_id
        _check(cudart.cudaSetDevice(device_id), f"selecting CUDA device {device_id}")
        handle = cudart.cudaIpcMemHandle_t()
        ctypes.memmove(handle.getPtr(), raw_handle, IPC_HANDLE_BYTES)
        self.ptr: int | None = int(
            _check(
                cudart.cudaIpcOpenMemHandle(handle, cudart.cudaIpcMemLazyEnablePeerAccess),
                f"opening the cudaIPC handle of region {name!r}",
            )
        )

    def _copy(self, dst: int, src: int, n: int, kind: Any) -> None:
        _check(self.cudart.cudaSetDevice(self.device_id), "selecting the region's device")
        _check(self.cudart.cudaMemcpy(dst, src, n, kind), f"copying {n} bytes of region {self.name!r}")

    def _address(self, ref: ShmRef) -> int:
        if self.ptr is None:
            raise ProtocolError(f"CUDA shared-memory region {self.name!r} was unregistered")
        return self.ptr + ref.offset

    def read(self, ref: ShmRef, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        host = np.empty(shape, dtype)
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._copy(host.ctypes.data, self._address(ref), ref.byte_size, kind)
        return host

    def write(self, ref: ShmRef, data: bytes | memoryview) -> None:
        host = np.frombuffer(data, np.uint8)
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._copy(self._address(ref), host.ctypes.data, len(host), kind)

    def close(self) -> None:
        ptr, self.ptr = self.ptr, None
        if ptr is not None:
            self.cudart.cudaIpcCloseMemHandle(ptr)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}
