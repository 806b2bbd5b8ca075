"""Fragmentation metrics: on known lists, and on a known free-block layout of the real host pool."""

from __future__ import annotations

import math

import pytest

from veo_edge.runtime.mempool import MemPool
from veo_edge.soak.fragmentation import fragmentation

KiB = 1 << 10


def test_one_free_block_is_not_fragmented():
    f = fragmentation([4096])
    assert (f.free_blocks, f.free_bytes, f.largest_free) == (1, 4096, 4096)
    assert f.fragmentation == 0 and f.entropy_bits == 0 and f.entropy_norm == 0


def test_nothing_free():
    assert fragmentation([]).to_dict() == {
        "free_blocks": 0,
        "free_bytes": 0,
        "largest_free": 0,
        "fragmentation": 0.0,
        "entropy_bits": 0.0,
        "entropy_norm": 0.0,
    }


def test_equal_blocks_have_log2_n_bits():
    f = fragmentation([256] * 8)
    assert f.fragmentation == pytest.approx(1 - 1 / 8)
    assert f.entropy_bits == pytest.approx(3.0) and f.entropy_norm == pytest.approx(1.0)


def test_mixed_blocks():
    sizes = [64 * KiB, 64 * KiB, 64 * KiB, 256 * KiB]
    f = fragmentation(sizes)
    total = 448 * KiB
    assert f.fragmentation == pytest.approx(1 - 256 / 448)
    expected = -sum(s / total * math.log2(s / total) for s in sizes)
    assert f.entropy_bits == pytest.approx(expected)
    assert f.entropy_norm == pytest.approx(expected / 2)


def test_real_pool_layout(pool_lib):
    """Fill a 1 MiB host pool with 16 slices of 64 KiB, free slices 0, 2, 4 (by address) and the last 4:
    the free blocks are 3 x 64 KiB and one coalesced 256 KiB, whatever the placement policy."""
    with MemPool("host", capacity=1 << 20, overflow=False, library=pool_lib) as pool:
        assert pool.free_blocks() == [1 << 20]
        slices = sorted(pool.alloc(64 * KiB) for _ in range(16))
        assert pool.free_blocks() == []
        for i in (0, 2, 4, 12, 13, 14, 15):
            pool.free(slices[i])
        blocks = pool.free_blocks()
        assert blocks == [64 * KiB, 64 * KiB, 64 * KiB, 256 * KiB]  # address order
        f = fragmentation(blocks)
        stats = pool.stats()
        assert (f.free_bytes, f.largest_free) == (stats.total_free, stats.largest_free)
        assert f.fragmentation == pytest.approx(stats.fragmentation)
        assert f.fragmentation == pytest.approx(1 - 256 / 448)
        assert f.entropy_bits == pytest.approx(fragmentation([64, 64, 64, 256]).entropy_bits)
        for i in (1, 3, 5, 6, 7, 8, 9, 10, 11):
            pool.free(slices[i])
        assert pool.free_blocks() == [1 << 20] and pool.check() == ""
