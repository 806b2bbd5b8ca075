"""An iterator of byte chunks read as a file: what Docker's SDK returns for an archive, an image or a
container's files (``get_archive``, ``get_image``), for :mod:`tarfile` to read as a stream."""

from __future__ import annotations

import io
from collections.abc import Iterable


class ChunkReader(io.RawIOBase):
    """A read-only raw stream over ``chunks``; wrap it in :func:`buffered` for tarfile."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._it, self._buf = iter(chunks), b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._buf:
            try:
                self._buf = next(self._it)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n], self._buf = self._buf[:n], self._buf[n:]
        return n


def buffered(chunks: Iterable[bytes], size: int = 1 << 20) -> io.BufferedReader:
    """``chunks`` as a buffered binary file (``tarfile.open(fileobj=..., mode="r|")``)."""
    return io.BufferedReader(ChunkReader(chunks), size)
