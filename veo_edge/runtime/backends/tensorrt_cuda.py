"""cuda-python glue shared by the TensorRT backend's modules: the import (with the reason it failed), the
mapping of ``cudaError_t`` results to the runtime's errors, and page-locked host staging buffers."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from veo_edge.errors import BackendError, BackendUnavailableError, CudaOutOfMemoryError, DeviceLostError

#: cudaError_t values the runtime treats specially
_CUDA_OOM = 2  # cudaErrorMemoryAllocation
#: devices unavailable, ECC uncorrectable, illegal address, launch timeout, the sticky kernel faults that leave
#: the context unusable (assert, hardware stack, illegal instruction, misaligned address, invalid address
#: space, invalid PC, launch failure), unknown
_CUDA_DEVICE_LOST = {46, 214, 700, 702, 710, 714, 715, 716, 717, 718, 719, 999}


def _cudart() -> Any:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart  # cuda-python < 12.6
        except ImportError as e:
            raise BackendUnavailableError(
                f"cuda-python is not importable ({e}); pip install cuda-python (the TensorRT backend "
                "copies inputs and outputs with it)"
            ) from e
    return cudart


def _cuda_check(result: Any, what: str) -> Any:
    """cuda-python returns ``(cudaError_t, *values)``; raise on an error, return the value(s)."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    # cudaError_t is an IntEnum in cuda-python 12; ``.value`` is how TensorRT 11.1's samples read it
    code = int(getattr(err, "value", err))
    if code == _CUDA_OOM:
        raise CudaOutOfMemoryError(f"CUDA out of memory during {what}; lower the load or --max-batch")
    if code in _CUDA_DEVICE_LOST:
        raise DeviceLostError(f"the GPU failed during {what} (cudaError {code}); the device may be lost")
    if code != 0:
        raise BackendError(f"CUDA error {code} during {what}")
    return rest[0] if len(rest) == 1 else rest


def _pinned(cudart: Any, count: int, owned: list[int]) -> tuple[int, np.ndarray]:
    """``count`` float32s of page-locked host memory (cudaMallocHost), as (address, numpy view); the address
    is appended to ``owned`` so that it is freed with cudaFreeHost on deactivation."""
    ptr = int(_cuda_check(cudart.cudaMallocHost(count * 4), "pinned host allocation"))
    owned.append(ptr)
    return ptr, np.ctypeslib.as_array((ctypes.c_float * count).from_address(ptr))
