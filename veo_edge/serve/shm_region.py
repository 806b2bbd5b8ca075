"""What every shared-memory region is (system or CUDA): a name, a size, the requests using it now, and the
bounds check of a tensor inside it; :mod:`veo_edge.serve.shm` and :mod:`veo_edge.serve.shm_cuda` each
implement one kind."""

from __future__ import annotations

from typing import Any

import numpy as np

from veo_edge.serve.protocol import ProtocolError, ShmRef


class Region:
    """A registered region: its mapping and the number of requests using it now."""

    kind = "system"

    def __init__(self, name: str, byte_size: int) -> None:
        self.name = name
        self.byte_size = byte_size
        self.users = 0
        self.registered = True

    def check(self, ref: ShmRef, what: str) -> None:
        if ref.offset + ref.byte_size > self.byte_size:
            raise ProtocolError(
                f"{what} needs bytes {ref.offset}..{ref.offset + ref.byte_size} of shared-memory region "
                f"{self.name!r}, which has {self.byte_size}; check shared_memory_offset and byte_size"
            )

    def release(self) -> None:
        """Drop a user; the last one out of an unregistered region unmaps it."""
        self.users -= 1
        if not self.registered and self.users == 0:
            self.close()

    def read(self, ref: ShmRef, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError

    def write(self, ref: ShmRef, data: bytes | memoryview) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def status(self) -> dict[str, Any]:
        raise NotImplementedError
