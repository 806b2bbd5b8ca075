"""Resource samples at a fixed interval: memory (RSS, USS), file descriptors and threads of the process
under test, GPU memory (NVML), the memory pool and its fragmentation, Jetson's tegrastats, and the
target's own counters (fallbacks, batches; a server's ``/metrics``)."""

from __future__ import annotations

import os
from typing import Any

from veo_edge.soak.fragmentation import fragmentation
from veo_edge.soak.tegrastats import TegraStats


class _Nvml:
    """Used GPU memory over all devices, or None where NVML (driver + nvidia-ml-py) is absent."""

    def __init__(self) -> None:
        self._handles: list[Any] | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._pynvml = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # no library, no driver, no device: GPU memory is simply not sampled
            self._handles = None

    def used(self) -> int | None:
        if not self._handles:
            return None
        try:
            return sum(int(self._pynvml.nvmlDeviceGetMemoryInfo(h).used) for h in self._handles)
        except self._pynvml.NVMLError:
            return None


def _pool_columns(pool: dict[str, Any] | None) -> dict[str, Any]:
    """Pool columns from the runtime's ``memory_pool`` stats or a server's ``veo_edge_memory_pool_*``."""
    if not pool:
        return {}
    blocks = pool.get("free_blocks")
    frag = fragmentation(blocks) if isinstance(blocks, list) else None
    free = pool.get("total_free")
    largest = pool.get("largest_free")
    return {
        "pool_in_use": int(pool["in_use"]) if pool.get("in_use") is not None else None,
        "pool_free": int(frag.free_bytes if frag else free) if (frag or free is not None) else None,
        "pool_largest": int(frag.largest_free if frag else largest)
        if (frag or largest is not None)
        else None,
        "pool_fragmentation": frag.fragmentation if frag else pool.get("fragmentation"),
        "pool_entropy": frag.entropy_bits if frag else None,
    }


class Sampler:
    """One ``sample()`` per tick; in-process the process under test is this one, against a server its
    numbers come from ``/metrics`` (and this client's own memory goes into ``extra``)."""

    def __init__(self, target: Any, in_process: bool) -> None:
        import psutil

        self.target = target
        self.in_process = in_process
        self.process = psutil.Process(os.getpid())
        self.nvml = _Nvml() if in_process else None
        self.tegra = TegraStats().start()

    def _own(self) -> dict[str, Any]:
        p = self.process
        with p.oneshot():
            mem = p.memory_full_info()
            return {
                "rss": int(mem.rss),
                "uss": int(getattr(mem, "uss", 0)) or None,
                "fds": p.num_fds() if hasattr(p, "num_fds") else None,
                "threads": p.num_threads(),
            }

    def sample(self, t: float, wall: float) -> dict[str, Any]:
        obs = self.target.observe()
        own = self._own()
        extra: dict[str, Any] = {}
        if self.in_process:
            row = {**own, "gpu_used": self.nvml.used() if self.nvml else None}
        else:
            row = {k: obs.get(k) for k in ("rss", "fds", "gpu_used")}
            extra["client"] = own
            for key in ("server_success", "server_failures", "scrape_error"):
                if key in obs:
                    extra[key] = obs[key]
        row.update(_pool_columns(obs.get("pool")))
        row.update(
            t=t,
            wall=wall,
            fallbacks=obs.get("fallbacks"),
            batches=obs.get("batches"),
            active_backend=obs.get("active_backend"),
        )
        if obs.get("recoveries") is not None:
            extra["recoveries"] = obs["recoveries"]
        if obs.get("injected"):  # chaos: faults injected so far, by rule
            extra["injected"] = obs["injected"]
        for key in ("faults", "retries"):  # the runtime's counters, by backend
            if obs.get(key) is not None:
                extra[key] = obs[key]
        tegra = self.tegra.latest()
        if tegra:
            extra["tegrastats"] = tegra
        row["extra"] = extra or None
        return row

    def close(self) -> None:
        self.tegra.stop()
