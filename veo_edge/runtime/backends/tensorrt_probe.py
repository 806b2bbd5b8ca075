"""Whether the TensorRT backend can run a build here, decided before anything is activated: TensorRT and
cuda-python importable, the plugin library the engine needs loadable, and the GPU memory the engine needs
(read from the cached engine's metadata, or estimated from the model when none is built yet) within the
budget and free. The policy (:mod:`veo_edge.runtime.policy`) calls :func:`probe` for every candidate."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from veo_edge.builddir import BuildDir
from veo_edge.engine.cache import CacheEntry, cache_dir
from veo_edge.engine.config import engine_gpu_bytes, estimate_unbuilt_gpu_bytes
from veo_edge.errors import BackendUnavailableError
from veo_edge.runtime.backends.base import Verdict
from veo_edge.runtime.backends.tensorrt_cuda import _cudart
from veo_edge.runtime.backends.tensorrt_engine import (
    build_io_bytes,
    default_config,
    engine_key,
    gpu_identity,
    import_error_message,
    model_source,
    plugin_engine_possible,
    required_plugin_library,
)


def probe(
    build: BuildDir,
    free: int,
    budget: int | None,
    check: Callable[[str, int, int, int | None], Any],
    precision: str | None = None,
    gpu: int = 0,
) -> Verdict:
    """Usable here? Library importable, plugin library loadable, memory within budget and free."""
    from veo_edge.runtime.probes import probe_tensorrt

    p = probe_tensorrt()
    if not p.ok:
        return Verdict(False, import_error_message(ImportError(p.reason)))
    lib = None
    config = default_config(build, precision)
    variant = "plugins" if plugin_engine_possible(build, config.engine) else "plain"
    try:
        _cudart()
        lib = required_plugin_library(build, variant)
        if lib is not None:
            ctypes.CDLL(str(lib.path))
    except BackendUnavailableError as e:
        return Verdict(False, str(e))
    except OSError as e:
        return Verdict(
            False, f"the plugin library {lib.path} does not load ({e}); rebuild it with `make plugins`"
        )
    need = None
    try:
        key = engine_key(build, config, p.data["version"], gpu_identity(gpu), lib, variant)
        entry = CacheEntry.for_key(cache_dir(build.path), build.model_name, key)
        if entry.check(key) is None:
            meta = entry.read_meta()
            act = meta.get("device_memory_size", meta["bytes"])
            need = engine_gpu_bytes(meta["bytes"], act, build_io_bytes(build), config.pool_factor)
    except (BackendUnavailableError, OSError, ValueError, KeyError):
        need = None
    if need is None:
        src, _ = model_source(build, variant)
        need = estimate_unbuilt_gpu_bytes(src.stat().st_size, build_io_bytes(build), config.precision)
    return check("tensorrt", need, free, budget)
