"""Memory-pool fragmentation from the sizes of its free blocks (``MemPool.free_blocks()``).

- ``free_bytes``: the sum of the free blocks.
- ``largest_free``: the largest free block: the biggest allocation that can still succeed without
  overflow.
- ``fragmentation`` = ``1 - largest_free / free_bytes`` (0 when everything free is one block, or nothing
  is free; towards 1 when free memory is scattered).
- ``entropy_bits``: Shannon entropy of the free bytes over the free blocks, ``-sum p_i log2 p_i`` with
  ``p_i = size_i / free_bytes``: 0 for one block, ``log2(n)`` for ``n`` equal blocks; the effective number
  of free blocks is ``2 ** entropy_bits``. ``entropy_norm`` divides by ``log2(n)`` (0 for n <= 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Fragmentation:
    free_blocks: int
    free_bytes: int
    largest_free: int
    fragmentation: float
    entropy_bits: float
    entropy_norm: float

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def fragmentation(sizes: Sequence[int]) -> Fragmentation:
    """The metrics of the module docstring for one snapshot of free-block sizes (bytes)."""
    blocks = [int(s) for s in sizes if s > 0]
    total = sum(blocks)
    if not blocks:
        return Fragmentation(0, 0, 0, 0.0, 0.0, 0.0)
    largest = max(blocks)
    entropy = -sum((s / total) * math.log2(s / total) for s in blocks)
    entropy = max(entropy, 0.0)  # -0.0 for a single block
    norm = entropy / math.log2(len(blocks)) if len(blocks) > 1 else 0.0
    return Fragmentation(len(blocks), total, largest, 1.0 - largest / total, entropy, norm)
