"""TensorRT backend: the primary GPU path.

Activation, in order: load the veo-edge plugin library into TensorRT's registry (before any parse or
deserialise: the usual cause of "could not find plugin creator" on Jetson), take the engine from the
cache when its key matches (see :mod:`veo_edge.engine.cache`) or build it from the build's
``plugins_onnx`` artifact (the plain ``onnx`` when the build has none) with an optimization profile over
batch 1..max and an on-disk timing cache, deserialise it, and create a ``USER_MANAGED`` execution context
whose activation memory and I/O buffers are slices of one veo-edge memory pool region.

FP16 follows the TensorRT version (:func:`veo_edge.engine.config.precision_plan`): 10.x sets the FP16
builder flag; 11.x, which removed it, parses an FP16 ONNX made at build time into a strongly typed
network. Everything decided without TensorRT lives in :mod:`veo_edge.engine`; this module only executes
it, and is the only one that imports ``tensorrt`` (lazily).
"""

from __future__ import annotations

import ctypes
import logging
import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from veo_edge.builddir import BuildDir, sha256_file
from veo_edge.engine.cache import CacheEntry, EngineKey, cache_dir, timing_cache_path
from veo_edge.engine.config import (
    EngineConfig,
    engine_gpu_bytes,
    estimate_unbuilt_gpu_bytes,
    io_bytes,
    pool_capacity,
    precision_plan,
    uses_device_memory_v2,
)
from veo_edge.errors import (
    BackendError,
    BackendUnavailableError,
    CudaOutOfMemoryError,
    DeviceLostError,
    ModelLoadError,
)
from veo_edge.runtime.backends.base import Runner, TensorMeta

log = logging.getLogger("veo_edge.runtime.tensorrt")

#: cudaError_t values the runtime treats specially
_CUDA_OOM = 2  # cudaErrorMemoryAllocation
#: devices unavailable, ECC uncorrectable, illegal address, launch timeout, the sticky kernel faults that leave
#: the context unusable (assert, hardware stack, illegal instruction, misaligned address, invalid address
#: space, invalid PC, launch failure), unknown
_CUDA_DEVICE_LOST = {46, 214, 700, 702, 710, 714, 715, 716, 717, 718, 719, 999}
#: plugin libraries TensorRT's registry has loaded in this process, by path: IPluginRegistry::loadLibrary
#: returns None (never raises) when it fails, including when the library's creators are already registered,
#: so a second activation in the same process must not load it again (NvInferRuntimeCommon.h, v10.3.0/v11.1)
_LOADED_PLUGIN_LIBRARIES: dict[str, Any] = {}


# -- plain decisions (no TensorRT) ----------------------------------------------------------------
def model_source(build: BuildDir) -> tuple[Path, str | None]:
    """The ONNX to build from, and a note when it is not the plugin-fused one."""
    if build.has("plugins_onnx"):
        return build.artifact("plugins_onnx"), None
    return build.artifact("onnx"), (
        "the build has no plugins_onnx artifact; TensorRT builds the plain ONNX without veo-edge's fused "
        "plugins (rebuild with plugins for the faster engine)"
    )


def import_error_message(e: BaseException) -> str:
    return (
        f"TensorRT is not importable ({type(e).__name__}: {e}); run this on a GPU host with TensorRT 10.x/11.x "
        "(pip install tensorrt, or use the veo-edge GPU container), or serve on the CPU: "
        "veo-edge infer BUILD_DIR --backend openvino"
    )


def required_plugin_library(build: BuildDir) -> Any:
    """The plugin library, or ``None`` when the engine source needs none; raises when it needs one and
    there is none."""
    from veo_edge.engine.plugin_library import find_plugin_library

    lib = find_plugin_library()
    if lib is None and build.has("plugins_onnx"):
        raise BackendUnavailableError(
            "the build's plugins_onnx needs libveo_edge_plugins.so, which is not built; run `make plugins` "
            "on this host or set VEO_EDGE_PLUGIN_LIB"
        )
    return lib


def gpu_identity() -> tuple[str, str]:
    from veo_edge.runtime.probes import probe_gpu

    p = probe_gpu()
    if not p.ok:
        raise BackendUnavailableError(f"no usable NVIDIA GPU: {p.reason}")
    dev = p.data["devices"][0]
    return dev["name"], dev["compute_capability"]


def engine_key(
    build: BuildDir, config: EngineConfig, trt_version: str, gpu: tuple[str, str], plugin: Any
) -> EngineKey:
    src, _ = model_source(build)
    kind = "plugins_onnx" if build.has("plugins_onnx") else "onnx"
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


def default_config(build: BuildDir, precision: str | None = None) -> EngineConfig:
    return EngineConfig(
        max_batch=build.max_batch, precision=precision or build.manifest.get("precision", "fp32")
    )


def _io(build: BuildDir) -> int:
    out = tuple(d for d in build.manifest["outputs"][0]["shape"][1:])
    return io_bytes(tuple(build.manifest["input_shape"]), out, build.max_batch)


def probe(
    build: BuildDir,
    free: int,
    budget: int | None,
    check: Callable[[str, int, int, int | None], Any],
    precision: str | None = None,
) -> Any:
    """Usable here? Library importable, plugin library loadable, memory within budget and free."""
    from veo_edge.runtime.policy import Verdict
    from veo_edge.runtime.probes import probe_tensorrt

    p = probe_tensorrt()
    if not p.ok:
        return Verdict(False, import_error_message(ImportError(p.reason)))
    try:
        _cudart()
        lib = required_plugin_library(build)
        if lib is not None:
            ctypes.CDLL(str(lib.path))
    except BackendUnavailableError as e:
        return Verdict(False, str(e))
    except OSError as e:
        return Verdict(
            False, f"the plugin library {lib.path} does not load ({e}); rebuild it with `make plugins`"
        )
    config = default_config(build, precision)
    need = None
    try:
        key = engine_key(build, config, p.data["version"], gpu_identity(), lib)
        entry = CacheEntry.for_key(cache_dir(build.path), build.model_name, key)
        if entry.check(key) is None:
            meta = entry.read_meta()
            need = engine_gpu_bytes(meta["bytes"], meta.get("device_memory_size", meta["bytes"]), _io(build))
    except (BackendUnavailableError, OSError, ValueError, KeyError):
        need = None
    if need is None:
        src, _ = model_source(build)
        need = estimate_unbuilt_gpu_bytes(src.stat().st_size, _io(build), config.precision)
    return check("tensorrt", need, free, budget)


def make_fp16_onnx(src: Path, dst: Path) -> Path:
    """An FP16 copy of ``src`` with FP32 inputs/outputs, for TensorRT 11's strongly typed networks."""
    import onnx

    try:
        from modelopt.onnx.autocast import convert_to_mixed_precision

        model = convert_to_mixed_precision(onnx_path=str(src), low_precision_type="fp16", keep_io_types=True)
    except ImportError:
        try:
            from onnxconverter_common import float16
        except ImportError as e:
            raise BackendUnavailableError(
                "TensorRT 11 builds FP16 from an FP16 ONNX, and neither nvidia-modelopt nor "
                "onnxconverter-common is installed to make one; pip install 'nvidia-modelopt[onnx]', "
                "or build the engine with --precision fp32"
            ) from e
        model = float16.convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    onnx.save(model, str(dst))
    return dst


# -- the thin TensorRT layer ----------------------------------------------------------------------
def _trt() -> Any:
    try:
        import tensorrt as trt
    except Exception as e:  # ImportError, or a broken install (libnvinfer missing)
        raise BackendUnavailableError(import_error_message(e)) from e
    return trt


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


def build_engine(
    trt: Any, logger: Any, build: BuildDir, config: EngineConfig, key: EngineKey, cache: Path
) -> bytes:
    """Parse, configure and build a serialised engine; the timing cache is read and written back."""
    plan = precision_plan(trt.__version__, config.precision)
    src, note = model_source(build)
    if note:
        log.warning(note)
    if plan.fp16_onnx:
        src = make_fp16_onnx(src, cache / f"{src.stem}.fp16.onnx")
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
    cache.mkdir(parents=True, exist_ok=True)
    tc_path.write_bytes(bytes(timing.serialize()))  # the attached cache, updated in place by the build
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


def load_or_build_engine(
    build: BuildDir, config: EngineConfig | None = None, force: bool = False, cache: Path | None = None
) -> tuple[Any, Any, Any, CacheEntry, str]:
    """(trt module, logger, engine, cache entry, "cached" | "built: <why>"). Plugins load first."""
    model_source(build)  # the ONNX is verified against the manifest first, a cached engine or not
    trt = _trt()
    config = config or default_config(build)
    logger = trt.Logger(trt.Logger.WARNING)
    plugin = required_plugin_library(build)
    load_plugins(trt, logger, plugin)
    key = engine_key(build, config, trt.__version__, gpu_identity(), plugin)
    cache = cache or cache_dir(build.path)
    entry = CacheEntry.for_key(cache, build.model_name, key)
    runtime = trt.Runtime(logger)
    why = "--force" if force else entry.check(key)
    if why is None:
        engine = runtime.deserialize_cuda_engine(entry.engine.read_bytes())
        if engine is not None:
            return trt, logger, engine, entry, "cached"
        why = f"cached engine {entry.engine} did not deserialise"
    log.warning("building the TensorRT engine (%s)", why)
    blob = build_engine(trt, logger, build, config, key, cache)
    engine = runtime.deserialize_cuda_engine(blob)
    if engine is None:
        raise BackendError("TensorRT could not deserialise the engine it just built")
    entry.write(key, blob, device_memory_size=device_memory_size(trt, engine))
    return trt, logger, engine, entry, f"built: {why}"


class TensorRtRunner(Runner):
    name = "tensorrt"

    def __init__(
        self, build: BuildDir, config: EngineConfig | None = None, cache: Path | None = None
    ) -> None:
        super().__init__(build.max_batch)
        self.build = build
        self.config = config or default_config(build)
        self.cache = cache
        self.origin: str | None = None
        self._state: dict[str, Any] = {}

    @classmethod
    def for_build(cls, build: BuildDir, **options: Any) -> TensorRtRunner:
        options.pop("gpu_memory_budget", None)  # enforced by the policy's probe
        return cls(build, **options)

    def _activate(self) -> None:
        from veo_edge.runtime.mempool import MemPool, MemPoolError, MemPoolOutOfMemoryError

        _trt()  # the library first: its absence is the reason a user most needs to read
        cudart = _cudart()
        trt, _logger, engine, _entry, self.origin = load_or_build_engine(
            self.build, self.config, cache=self.cache
        )
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if n not in inputs]
        dtypes = {n: engine.get_tensor_dtype(n) for n in names}
        if len(inputs) != 1 or len(outputs) != 1 or any(d != trt.DataType.FLOAT for d in dtypes.values()):
            raise BackendError(
                f"the engine's I/O is {dtypes}; veo-edge runs one FP32 input and one FP32 output (rebuild the engine)"
            )
        sample = tuple(self.build.manifest["input_shape"])
        out_shape = tuple(self.build.manifest["outputs"][0]["shape"][1:])
        act = device_memory_size(trt, engine)
        io = io_bytes(sample, out_shape, self.max_batch)
        try:
            pool = MemPool("cuda", capacity=pool_capacity(act, io))
        except MemPoolOutOfMemoryError as e:
            raise CudaOutOfMemoryError(f"CUDA out of memory reserving the TensorRT memory pool: {e}") from e
        stream = None
        try:
            stream = _cuda_check(cudart.cudaStreamCreate(), "stream creation")
            context = engine.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
            if context is None:
                raise BackendError("TensorRT could not create an execution context; see its log (--debug)")
            act_ptr = pool.alloc(max(act, 1), int(stream))
            set_device_memory(trt, context, act_ptr, act)
            d_in = pool.alloc(self.max_batch * math.prod(sample) * 4, int(stream))
            d_out = pool.alloc(self.max_batch * math.prod(out_shape) * 4, int(stream))
            if not (
                context.set_tensor_address(inputs[0], d_in) and context.set_tensor_address(outputs[0], d_out)
            ):
                raise BackendError("TensorRT rejected the I/O buffer addresses; see its log (--debug)")
        except Exception as e:
            if stream is not None:  # a partial activation must not leak its stream (a retry loop would)
                cudart.cudaStreamDestroy(stream)
            pool.close()
            if isinstance(e, MemPoolOutOfMemoryError):
                raise CudaOutOfMemoryError(f"CUDA out of memory allocating TensorRT buffers: {e}") from e
            if isinstance(e, MemPoolError):  # a VeoEdgeError the runtime would not treat as a backend failure
                raise BackendError(f"the TensorRT memory pool failed: {e}") from e
            raise
        self._inputs = [TensorMeta(inputs[0], (None, *sample), "float32")]
        self._outputs = [TensorMeta(outputs[0], (None, *out_shape), "float32")]
        self._state = dict(
            cudart=cudart, engine=engine, context=context, pool=pool, stream=stream,
            d_in=d_in, d_out=d_out, act_ptr=act_ptr, out_shape=out_shape, host={},
        )  # fmt: skip

    def _deactivate(self) -> None:
        s, self._state = self._state, {}
        if not s:
            return
        try:
            s["cudart"].cudaStreamSynchronize(s["stream"])
            s["context"] = None  # the context goes before the memory it runs in
            s["engine"] = None
            s["cudart"].cudaStreamDestroy(s["stream"])
        finally:
            s["pool"].close()

    def _infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        s = self._state
        cudart, ctx, stream = s["cudart"], s["context"], s["stream"]
        x = feed[self._inputs[0].name]
        n = x.shape[0]
        host = s["host"].get(n)  # one pinned-size host output buffer per batch size, reused
        if host is None:
            host = s["host"][n] = np.empty((n, *s["out_shape"]), np.float32)
        h2d, d2h = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        _cuda_check(cudart.cudaMemcpyAsync(s["d_in"], x.ctypes.data, x.nbytes, h2d, stream), "input copy")
        if not ctx.set_input_shape(self._inputs[0].name, tuple(x.shape)):
            raise BackendError(
                f"TensorRT rejected input shape {tuple(x.shape)} (profile 1..{self.max_batch})"
            )
        if not ctx.execute_async_v3(int(stream)):
            raise BackendError("TensorRT execute_async_v3 failed; see the TensorRT log (--debug)")
        _cuda_check(
            cudart.cudaMemcpyAsync(host.ctypes.data, s["d_out"], host.nbytes, d2h, stream), "output copy"
        )
        _cuda_check(cudart.cudaStreamSynchronize(stream), "inference")
        return {self._outputs[0].name: host.copy()}

    def pool_stats(self) -> dict[str, Any] | None:
        pool = self._state.get("pool")
        return asdict(pool.stats()) if pool is not None else None

    def describe(self) -> dict[str, Any]:
        trt = _trt()
        return {
            "backend": self.name,
            "version": trt.__version__,
            "precision": self.config.precision,
            "engine": self.origin,
            "memory_pool": self.pool_stats(),
        }
