"""The engine-making half of the TensorRT backend: plugin library, engine source, FP16 graph, build, cache.

Everything decided without TensorRT lives in :mod:`veo_edge.engine`; this module executes it, and with
:mod:`veo_edge.runtime.backends.tensorrt` is the only one that imports ``tensorrt`` (lazily).

Two engines can serve a build (see :mod:`veo_edge.engine.selection`): ``plugins``, parsed from the build's
``plugins_onnx`` with veo-edge's plugin library loaded first, and ``plain``, TensorRT's own from the plain
``onnx``. Each is cached under its own key.

FP16 follows the TensorRT version (:func:`veo_edge.engine.config.precision_plan`): 10.x sets the FP16
builder flag; 11.x, which removed it, parses an FP16 ONNX into a strongly typed network. That FP16 ONNX is
made from the *plain* graph (the converter runs it in ONNX Runtime, which cannot run the Veo ops), and the
plugins are injected into the converted graph afterwards (:func:`fp16_sources`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from veo_edge.builddir import BuildDir, sha256_file
from veo_edge.engine.cache import CacheEntry, EngineKey, atomic_write, cache_dir, timing_cache_path
from veo_edge.engine.config import (
    EngineConfig,
    io_bytes,
    pool_capacity,
    precision_plan,
    uses_device_memory_v2,
)
from veo_edge.errors import BackendError, BackendUnavailableError, ModelLoadError, UsageError

log = logging.getLogger("veo_edge.runtime.tensorrt")

#: plugin libraries TensorRT's registry has loaded in this process, by path: IPluginRegistry::loadLibrary
#: returns None (never raises) when it fails, including when the library's creators are already registered,
#: so a second activation in the same process must not load it again (NvInferRuntimeCommon.h, v10.3.0/v11.1)
_LOADED_PLUGIN_LIBRARIES: dict[str, Any] = {}


def import_error_message(e: BaseException) -> str:
    return (
        f"TensorRT is not importable ({type(e).__name__}: {e}); TensorRT engines need a GPU host with "
        "TensorRT 10.x/11.x (pip install tensorrt, or the veo-edge GPU container); the CPU backends need "
        "neither (--backend openvino or onnxruntime)"
    )


def _trt() -> Any:
    try:
        import tensorrt as trt
    except Exception as e:  # ImportError, or a broken install (libnvinfer missing)
        raise BackendUnavailableError(import_error_message(e)) from e
    return trt


# -- plain decisions (no TensorRT) ----------------------------------------------------------------
def model_source(build: BuildDir, variant: str = "plugins") -> tuple[Path, str | None]:
    """The ONNX the ``variant`` engine is built from, and a note when it is not the plugin-fused one."""
    if variant == "plugins" and build.has("plugins_onnx"):
        return build.artifact("plugins_onnx"), None
    if variant == "plugins":
        return build.artifact("onnx"), (
            "the build has no plugins_onnx artifact; TensorRT builds the plain ONNX without veo-edge's fused "
            "plugins (rebuild with plugins for the faster engine)"
        )
    return build.artifact("onnx"), None


def _uses_plugins(build: BuildDir, variant: str) -> bool:
    return variant == "plugins" and build.has("plugins_onnx")


def required_plugin_library(build: BuildDir, variant: str = "plugins") -> Any:
    """The plugin library, or ``None`` when the engine source needs none; raises when it needs one and
    there is none."""
    if not _uses_plugins(build, variant):
        return None
    from veo_edge.engine.plugin_library import find_plugin_library

    lib = find_plugin_library()
    if lib is None:
        raise BackendUnavailableError(
            "the build's plugins_onnx needs libveo_edge_plugins.so, which is not built; run `make plugins` "
            "on this host or set VEO_EDGE_PLUGIN_LIB (or use --engine plain)"
        )
    return lib


def plugin_engine_possible(build: BuildDir, mode: str) -> bool:
    """Whether the plugin engine can be built here: the build has its graph and the plugin library is
    built. ``--engine fastest`` without the library serves TensorRT's own engine (with a warning);
    ``--engine plugins`` needs both and says so (:func:`required_plugin_library`)."""
    if not build.has("plugins_onnx"):
        return False
    if mode == "plugins":
        return True
    from veo_edge.engine.plugin_library import find_plugin_library

    if find_plugin_library() is None:
        log.warning(
            "libveo_edge_plugins.so is not built here: only TensorRT's own engine is built "
            "(run `make plugins` where TensorRT is installed to compare it with the plugin engine)"
        )
        return False
    return True


def gpu_identity(index: int = 0) -> tuple[str, str]:
    """(name, compute capability) of GPU ``index`` from NVML. NVML numbers GPUs by PCI bus; set
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that CUDA's ``--gpu N`` is the same device."""
    from veo_edge.runtime.probes import probe_gpu

    p = probe_gpu()
    if not p.ok:
        raise BackendUnavailableError(f"no usable NVIDIA GPU: {p.reason}")
    devices = p.data["devices"]
    if not 0 <= index < len(devices):
        raise UsageError(
            f"--gpu {index}: this machine has {len(devices)} GPU(s), numbered 0..{len(devices) - 1}"
        )
    return devices[index]["name"], devices[index]["compute_capability"]


def engine_key(
    build: BuildDir,
    config: EngineConfig,
    trt_version: str,
    gpu: tuple[str, str],
    plugin: Any,
    variant: str = "plugins",
) -> EngineKey:
    src, _ = model_source(build, variant)
    kind = "plugins_onnx" if _uses_plugins(build, variant) else "onnx"
    sha = build.manifest["artifacts"][kind].get("sha256") or sha256_file(src)
    return EngineKey(
        gpu_name=gpu[0],
        compute_capability=gpu[1],
        trt_version=trt_version,
        plugin_sha256=plugin.sha256 if plugin is not None else None,
        model_sha256=sha,
        precision=config.precision,
        max_batch=config.max_batch,
        opt_batch=config.opt_batch or config.max_batch,
    )


def default_config(build: BuildDir, precision: str | None = None, **kw: Any) -> EngineConfig:
    return EngineConfig(
        max_batch=build.max_batch, precision=precision or build.manifest.get("precision", "fp32"), **kw
    )


def build_io_bytes(build: BuildDir) -> int:
    out = tuple(d for d in build.manifest["outputs"][0]["shape"][1:])
    return io_bytes(tuple(build.manifest["input_shape"]), out, build.max_batch)


# -- FP16 for TensorRT 11 -------------------------------------------------------------------------
def convert_fp16(src: Path) -> Any:
    """An FP16 copy of the ONNX at ``src`` with FP32 inputs/outputs (ModelOpt's autocast, which runs the
    graph in ONNX Runtime, else onnxconverter-common's static conversion)."""
    import onnx

    try:
        from modelopt.onnx.autocast import convert_to_mixed_precision

        return convert_to_mixed_precision(onnx_path=str(src), low_precision_type="fp16", keep_io_types=True)
    except ImportError:
        try:
            from onnxconverter_common import float16
        except ImportError as e:
            raise BackendUnavailableError(
                "TensorRT 11 builds FP16 from an FP16 ONNX, and neither nvidia-modelopt nor "
                "onnxconverter-common is installed to make one; pip install 'nvidia-modelopt[onnx]', "
                "or build the engine with --precision fp32"
            ) from e
        return float16.convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)


def fp16_sources(
    build: BuildDir,
    workdir: Path,
    convert: Callable[[Path], Any] = convert_fp16,
    inject: Callable[[Any, tuple[int, ...]], Any] | None = None,
) -> dict[str, Path]:
    """FP16 graphs for both variants, in the only order that works: convert the *plain* ONNX (the
    converter runs it in ONNX Runtime, which cannot run the Veo ops of ``plugins_onnx``), then inject the
    plugins into the converted graph. ``{"plain": ..., "plugins": ...}``; ``plugins`` is absent when the
    build has no plugin graph or nothing could be injected into the FP16 one (logged, with the reason)."""
    workdir.mkdir(parents=True, exist_ok=True)
    plain = convert(build.artifact("onnx"))
    out = {"plain": workdir / "model.fp16.onnx"}
    atomic_write(out["plain"], plain.SerializeToString())
    if not build.has("plugins_onnx"):
        return out
    if inject is None:
        from veo_edge.surgery.inject import PluginInjection

        def inject(model: Any, shape: tuple[int, ...]) -> Any:
            return PluginInjection(input_shape=shape)(model)

    try:
        del plain.graph.value_info[:]  # FP32 types from before the conversion; shape inference redoes them
        injection = inject(plain, tuple(build.manifest["input_shape"]))
    except (
        Exception
    ) as e:  # the surgery may not match the converted graph: the plain FP16 engine still serves
        log.warning("could not inject the plugins into the FP16 graph (%s: %s); FP16 uses TensorRT's own engine",
                    type(e).__name__, e)  # fmt: skip
        return out
    if not injection.report.replaced:
        log.warning("nothing of the FP16 graph matched the plugins; FP16 uses TensorRT's own engine")
        return out
    out["plugins"] = workdir / "model.plugins.fp16.onnx"
    atomic_write(out["plugins"], injection.plugin_model.SerializeToString())
    return out


# -- the thin TensorRT layer ----------------------------------------------------------------------
def load_plugins(trt: Any, logger: Any, plugin: Any) -> None:
    """Register TensorRT's own plugins and, once per process, veo-edge's library (its ``getCreators``)."""
    trt.init_libnvinfer_plugins(logger, "")
    if plugin is None or str(plugin.path) in _LOADED_PLUGIN_LIBRARIES:
        return
    try:
        handle = trt.get_plugin_registry().load_library(str(plugin.path))
        error = None if handle is not None else "the registry refused it (see the TensorRT log)"
    except Exception as e:  # loadLibrary is noexcept; a binding-level failure still lands here
        handle, error = None, f"{type(e).__name__}: {e}"
    if handle is None:
        raise BackendUnavailableError(
            f"TensorRT could not load the plugin library {plugin.path}: {error}; rebuild it with `make plugins` "
            "against this TensorRT"
        )
    _LOADED_PLUGIN_LIBRARIES[str(plugin.path)] = handle


def _timing_cache(cfg: Any, path: Path) -> Any:
    """The on-disk timing cache attached to ``cfg``; a fresh one when it is corrupt or from another device
    (``set_timing_cache`` returns False on a device-property mismatch, NvInfer.h v10.3.0/v11.1)."""
    if path.is_file():
        cache = cfg.create_timing_cache(path.read_bytes())
        if cache is not None and cfg.set_timing_cache(cache, ignore_mismatch=False):
            return cache
        log.warning(
            "timing cache %s is unusable here (corrupt or from another device); starting a new one", path
        )
    cache = cfg.create_timing_cache(b"")
    if cache is None or not cfg.set_timing_cache(cache, ignore_mismatch=False):
        raise BackendError("TensorRT could not create an empty timing cache; run with --debug for its log")
    return cache


def save_timing_cache(timing: Any, path: Path) -> None:
    """Write the attached (updated in place) timing cache atomically: a concurrent build or a crash never
    leaves a torn cache that the next build would have to throw away."""
    atomic_write(path, bytes(timing.serialize()))


def build_engine(
    trt: Any,
    logger: Any,
    build: BuildDir,
    config: EngineConfig,
    key: EngineKey,
    cache: Path,
    variant: str = "plugins",
) -> bytes:
    """Parse, configure and build a serialised engine; the timing cache is read and written back."""
    plan = precision_plan(trt.__version__, config.precision)
    src, note = model_source(build, variant)
    if note:
        log.warning(note)
    if plan.fp16_onnx:
        sources = fp16_sources(build, cache / f"{build.model_name}.fp16")
        if variant == "plugins" and "plugins" not in sources and build.has("plugins_onnx"):
            raise BackendError(
                "no FP16 graph with the plugins could be made for TensorRT 11 (see the log); "
                "use --engine plain or fastest for FP16"
            )
        src = sources["plugins" if _uses_plugins(build, variant) else "plain"]
    builder = trt.Builder(logger)
    # no creation flags: 10.x networks are explicit-batch without EXPLICIT_BATCH (deprecated in 10.0, gone in
    # 11.0) and weakly typed; 11.x networks are always strongly typed (STRONGLY_TYPED is deprecated, ignored)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(src)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ModelLoadError(f"TensorRT could not parse {src}: {errors}")
    cfg = builder.create_builder_config()
    cfg.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, config.workspace_bytes)
    if plan.fp16_flag:
        cfg.set_flag(trt.BuilderFlag.FP16)
    profile = builder.create_optimization_profile()
    sample = tuple(build.manifest["input_shape"])
    lo, opt, hi = config.profile(sample)
    profile.set_shape(network.get_input(0).name, lo, opt, hi)
    cfg.add_optimization_profile(profile)
    tc_path = timing_cache_path(cache, key)
    timing = _timing_cache(cfg, tc_path)
    serialized = builder.build_serialized_network(network, cfg)
    if serialized is None:
        raise BackendError(f"TensorRT failed to build an engine from {src}; run with --debug for its log")
    save_timing_cache(timing, tc_path)
    return bytes(serialized)


def device_memory_size(trt: Any, engine: Any) -> int:
    """Activation bytes a USER_MANAGED context needs (over all profiles)."""
    if uses_device_memory_v2(trt.__version__):
        return int(engine.device_memory_size_v2)
    return int(engine.device_memory_size)  # 10.0


def set_device_memory(trt: Any, context: Any, ptr: int, size: int) -> None:
    if uses_device_memory_v2(trt.__version__):
        context.set_device_memory(ptr, size)
    else:  # 10.0 has only the size-less setter
        context.device_memory = ptr


@dataclass
class EngineBlob:
    """A serialised engine for one variant, in the cache, with what the runner needs to size its pool."""

    trt: Any
    logger: Any
    variant: str
    key: EngineKey
    entry: CacheEntry
    origin: str  # "cached" | "built: <why>"
    blob: bytes
    device_memory_size: int


def ensure_engine(
    build: BuildDir,
    config: EngineConfig,
    variant: str = "plugins",
    *,
    force: bool = False,
    cache: Path | None = None,
    gpu: int = 0,
) -> EngineBlob:
    """The ``variant`` engine from the cache when its key matches, else built (on the current device) and
    cached with its metadata: activation bytes, I/O bytes and the pool reservation it was sized for."""
    trt = _trt()
    logger = trt.Logger(trt.Logger.WARNING)
    plugin = required_plugin_library(build, variant)
    load_plugins(trt, logger, plugin)  # before any parse or deserialise
    key = engine_key(build, config, trt.__version__, gpu_identity(gpu), plugin, variant)
    cache = cache or cache_dir(build.path)
    entry = CacheEntry.for_key(cache, build.model_name, key)
    why = "--force" if force else entry.check(key)
    if why is None:
        meta = entry.read_meta()
        if "device_memory_size" in meta:
            return EngineBlob(
                trt,
                logger,
                variant,
                key,
                entry,
                "cached",
                entry.engine.read_bytes(),
                int(meta["device_memory_size"]),
            )
        why = f"cached engine {entry.engine} has no device_memory_size in its metadata"
    log.warning("building the TensorRT %s engine (%s)", variant, why)
    blob = build_engine(trt, logger, build, config, key, cache, variant)
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(blob)
    if engine is None:
        raise BackendError("TensorRT could not deserialise the engine it just built")
    act = device_memory_size(trt, engine)
    del engine, runtime  # sized; the runner deserialises it again into the pool
    io = build_io_bytes(build)
    entry.write(
        key,
        blob,
        variant=variant,
        device_memory_size=act,
        io_bytes=io,
        pool_factor=config.pool_factor,
        pool_capacity=pool_capacity(act, io, config.pool_factor, weights=len(blob)),
    )
    return EngineBlob(trt, logger, variant, key, entry, f"built: {why}", blob, act)
