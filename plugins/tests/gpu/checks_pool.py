"""The memory pool on a real device: alloc/free storms on two streams, checked byte for byte, with the
pool's fragmentation and growth stats. The same storm runs on the host backend (``--pool-backend host``,
streams are then only labels), so its logic is exercised on a CPU-only machine too.

A slice freed on stream A is reused by stream B only after A passed the free; if the pool handed it over
early, A's queued work (a fill, then a long sleep, then a second fill) would overwrite B's bytes, and the
final check of B's slice would see A's tag.
"""

from __future__ import annotations

import ctypes
import random
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


class HostOps:
    """Fills and checks on host memory; streams are labels and everything completes at once."""

    streams = (0x100, 0x200)

    def fill(self, ptr: int, tag: int, n: int, stream: int) -> None:
        ctypes.memset(ptr, tag, n)

    def slow(self, stream: int) -> None:
        pass

    def read(self, ptr: int, n: int) -> bytes:
        return ctypes.string_at(ptr, 1) + ctypes.string_at(ptr + n - 1, 1)

    def sync(self) -> None:
        pass


class CudaOps:
    """Fills through cudaMemsetAsync on two real streams, with a long kernel (torch.cuda._sleep) queued
    between fills to hold each stream back while the other allocates."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.s = (torch.cuda.Stream(), torch.cuda.Stream())
        self.streams = tuple(int(s.cuda_stream) for s in self.s)
        self.rt = _cudart_ctypes()

    def _stream(self, handle: int) -> Any:
        return self.s[self.streams.index(handle)]

    def fill(self, ptr: int, tag: int, n: int, stream: int) -> None:
        rc = self.rt.cudaMemsetAsync(ctypes.c_void_p(ptr), tag, ctypes.c_size_t(n), ctypes.c_void_p(stream))
        if rc != 0:
            raise RuntimeError(f"cudaMemsetAsync failed with {rc}")

    def slow(self, stream: int) -> None:
        with self.torch.cuda.stream(self._stream(stream)):
            self.torch.cuda._sleep(200_000)  # ~0.1 ms of GPU time: the stream lags the host

    def read(self, ptr: int, n: int) -> bytes:
        out = ctypes.create_string_buffer(2)
        for i, off in enumerate((0, n - 1)):
            rc = self.rt.cudaMemcpy(ctypes.byref(out, i), ctypes.c_void_p(ptr + off), ctypes.c_size_t(1), 2)
            if rc != 0:
                raise RuntimeError(f"cudaMemcpy failed with {rc}")
        return out.raw

    def sync(self) -> None:
        self.torch.cuda.synchronize()


def _cudart_ctypes() -> ctypes.CDLL:
    """The cudart PyTorch already loaded (RTLD_NOLOAD by soname), else the first that loads."""
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"):
        try:
            return ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL | 4)  # 4 = RTLD_NOLOAD
        except OSError:
            continue
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise RuntimeError("no libcudart could be loaded for the pool storm")


def storm(
    pool: Any, ops: Any, iterations: int = 4000, seed: int = 7, max_bytes: int = 1 << 20
) -> dict[str, Any]:
    """Random alloc/free traffic on two streams. Each live slice carries its stream's tag; at the end (and
    every 500 iterations) every live slice is checked after a device sync. Returns the stats and the count
    of corrupted slices (must be 0)."""
    rng = random.Random(seed)
    live: list[tuple[int, int, int, int]] = []  # (ptr, bytes, tag, stream)
    corrupted = 0
    peak_frag = 0.0
    for i in range(iterations):
        stream = ops.streams[i % 2]
        if live and (len(live) >= 24 or rng.random() < 0.45):
            mine = [k for k, s in enumerate(live) if s[3] == stream] or list(range(len(live)))
            ptr, n, tag, s = live.pop(rng.choice(mine))
            ops.slow(s)
            ops.fill(ptr, 0xEE, n, s)  # queued behind the sleep: lands late if the slice left too early
            pool.free_async(ptr, s)
        else:
            n = rng.randint(1, max_bytes)
            ptr = pool.alloc_async(n, stream)
            tag = 1 + (i % 200)
            ops.fill(ptr, tag, n, stream)
            live.append((ptr, n, tag, stream))
        peak_frag = max(peak_frag, pool.stats().fragmentation)
        if i % 500 == 499 or i == iterations - 1:
            ops.sync()
            for ptr, n, tag, _ in live:
                corrupted += ops.read(ptr, n) != bytes([tag, tag])
    for ptr, _, _, s in live:
        pool.free_async(ptr, s)
    ops.sync()
    stats = asdict(pool.stats())
    return {"corrupted": corrupted, "peak_fragmentation": peak_frag, "check": pool.check(), **stats}


def run(backend: str, lib: Path | None, torch: Any = None, iterations: int = 4000) -> tuple[bool, str]:
    """One storm on ``backend``; (passed, one-line summary)."""
    from veo_edge.runtime.mempool import MemPool

    ops = HostOps() if backend == "host" else CudaOps(torch)
    with MemPool(backend, capacity=16 << 20, library=lib) as pool:
        r = storm(pool, ops, iterations)
    ok = r["corrupted"] == 0 and r["check"] == "" and r["in_use"] == 0
    line = (
        f"pool storm ({backend}, 2 streams, {iterations} ops): corrupted {r['corrupted']}, peak fragmentation "
        f"{r['peak_fragmentation']:.3f}, fence waits {r['fence_waits']}, overflow regions {r['overflow_count']} "
        f"(released {r['overflow_released']}), peak in use {r['peak_in_use'] / 2**20:.1f} MiB of "
        f"{(r['capacity'] - r['overflow_bytes']) / 2**20:.0f} MiB, invariants {'ok' if not r['check'] else r['check']}"
    )
    return ok, line
