"""The memory pool through its ctypes binding: real calls into the built host backend."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from veo_edge.errors import BackendUnavailableError, UsageError
from veo_edge.runtime import mempool
from veo_edge.runtime.mempool import MemPool, MemPoolError


@pytest.fixture
def pool(pool_lib: Path):
    with MemPool("host", capacity=1 << 20, library=pool_lib) as p:
        yield p


def test_slices_are_aligned_and_disjoint(pool: MemPool, rng: np.random.Generator) -> None:
    sizes = rng.integers(1, 20000, size=30)
    ptrs = [pool.alloc(int(n)) for n in sizes]
    assert all(p % mempool.ALIGNMENT == 0 for p in ptrs)
    spans = sorted(zip(ptrs, sizes, strict=True))
    for (a, n), (b, _) in itertools.pairwise(spans):
        assert a + n <= b
    for p in ptrs:
        pool.free(p)
    assert pool.check() == ""


def test_stats_and_fragmentation(pool: MemPool) -> None:
    quarter = (1 << 20) // 4
    a, b, c, d = (pool.alloc(quarter) for _ in range(4))
    s = pool.stats()
    assert (s.capacity, s.in_use, s.total_free, s.alloc_count) == (1 << 20, 1 << 20, 0, 4)
    pool.free(a)
    pool.free(c)
    s = pool.stats()
    assert s.total_free == 2 * quarter
    assert s.largest_free == quarter
    assert s.fragmentation == pytest.approx(0.5)
    pool.free(b)  # coalesces a, b, c
    assert pool.stats().fragmentation == 0.0
    pool.free(d)
    s = pool.stats()
    assert (s.in_use, s.peak_in_use, s.largest_free, s.free_count) == (0, 1 << 20, 1 << 20, 4)


def test_exhaustion_overflows_and_is_counted(pool: MemPool) -> None:
    big = pool.alloc(1 << 20)
    extra = pool.alloc(1000)
    s = pool.stats()
    assert (s.overflow_count, s.region_count, s.capacity) == (1, 2, (1 << 20) + 1024)
    assert (s.overflow_bytes, s.overflow_limit) == (1024, 1 << 20)  # overflow may double the reservation
    pool.free(extra)  # the overflow region is free again: given back
    s = pool.stats()
    assert (s.capacity, s.region_count, s.overflow_bytes, s.overflow_released) == (1 << 20, 1, 0, 1)
    pool.free(big)
    assert pool.check() == ""


def test_overflow_limit_bounds_growth(pool_lib: Path) -> None:
    with MemPool("host", capacity=4096, overflow_limit=8192, library=pool_lib) as p:
        held = [p.alloc(4096), p.alloc(4096), p.alloc(4096)]  # 8 KiB of overflow: at the limit
        with pytest.raises(MemPoolError, match=r"8192 of the 8192 overflow bytes allowed are in use"):
            p.alloc(256)
        for ptr in held:
            p.free(ptr)
        assert p.stats().overflow_released == 2
    with pytest.raises(UsageError, match="overflow limit must be >= 0 bytes, got -1"):
        MemPool("host", capacity=4096, overflow_limit=-1, library=pool_lib)


def test_stream_ordered_calls_take_stream_zero(pool: MemPool) -> None:
    # 0 is the legacy default stream for the async calls (the host backend completes every free at once)
    ptr = pool.alloc_async(1000, 0)
    assert pool.stats().in_use == 1024
    pool.free_async(ptr, 0)
    assert (pool.stats().in_use, pool.stats().pending_free) == (0, 0)
    with pytest.raises(MemPoolError, match="not a live slice"):
        pool.free_async(ptr, 0)
    with pytest.raises(MemPoolError, match="cannot allocate 0 bytes"):
        pool.alloc_async(0, 0)


def test_no_overflow_pool_raises(pool_lib: Path) -> None:
    with MemPool("host", capacity=4096, overflow=False, library=pool_lib) as p:
        p.alloc(4096)
        with pytest.raises(
            MemPoolError, match=r"memory pool exhausted: asked for 256 bytes.*larger capacity"
        ):
            p.alloc(1)
        assert p.stats().overflow_count == 0


def test_bad_free_and_closed_pool(pool_lib: Path) -> None:
    p = MemPool("host", capacity=4096, library=pool_lib)
    ptr = p.alloc(10)
    p.free(ptr)
    with pytest.raises(MemPoolError, match=r"not a live slice of this memory pool \(double free"):
        p.free(ptr)
    p.close()
    with pytest.raises(MemPoolError, match="this memory pool is closed"):
        p.alloc(10)


def test_argument_errors(pool_lib: Path) -> None:
    with pytest.raises(UsageError, match="unknown memory pool backend 'tpu'; choose one of: host, cuda"):
        MemPool("tpu", capacity=10, library=pool_lib)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="capacity must be > 0 bytes, got 0"):
        MemPool("host", capacity=0, library=pool_lib)


def test_missing_library_says_how_to_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(mempool.ENV_VAR, raising=False)
    with pytest.raises(BackendUnavailableError, match=r"libveo_mempool.so not found .* `make plugins`"):
        mempool.find_library([tmp_path])
    monkeypatch.setenv(mempool.ENV_VAR, str(tmp_path / "nope.so"))
    with pytest.raises(
        BackendUnavailableError, match=r"VEO_EDGE_MEMPOOL_LIB is set to .*nope\.so, which is not a file"
    ):
        mempool.find_library()


def test_env_var_points_at_library(pool_lib: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(mempool.ENV_VAR, str(pool_lib))
    assert mempool.find_library() == pool_lib
