"""TensorRT backend: the primary GPU path.

Activation, in order: pick the GPU (``gpu=N``, default 0), decide which engine serves (``engine=``:
``fastest`` reads the decision recorded by ``veo-edge engine build``, and makes it when there is none;
see :mod:`veo_edge.engine.selection`), take that engine from the cache or build it
(:mod:`veo_edge.runtime.backends.tensorrt_engine`), reserve one veo-edge memory pool region of
``pool_factor`` (4) x the max-batch activation + I/O need plus the engine's weights, give TensorRT's
runtime an ``IGpuAsyncAllocator`` over that pool (:class:`PoolAllocatorCalls`), deserialise the engine
(its weights land in the pool), and create a ``USER_MANAGED`` execution context whose activation memory
and I/O buffers are slices of the same pool. Host staging buffers are pinned (``cudaMallocHost``).

What stays outside the pool: the builder's allocations (``veo-edge engine build`` is a one-off whose tactic
scratch is freed when it ends, and sized by the workspace limit rather than by serving), the CUDA
context itself, cuBLAS/cuDNN handles TensorRT's tactics create, and the pinned host buffers.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from veo_edge.builddir import BuildDir
from veo_edge.engine.cache import CacheEntry, ChoiceRecord, cache_dir
from veo_edge.engine.config import (
    EngineConfig,
    engine_gpu_bytes,
    estimate_unbuilt_gpu_bytes,
    io_bytes,
    pool_capacity,
)
from veo_edge.engine.selection import (
    TIMED_RUNS,
    WARMUP_RUNS,
    Decision,
    Measurement,
    decide,
    median_ms,
    variants_to_build,
)
from veo_edge.errors import (
    BackendError,
    BackendUnavailableError,
    CudaOutOfMemoryError,
    DeviceLostError,
    ModelLoadError,
)
from veo_edge.runtime.backends.base import Runner, TensorMeta, Verdict
from veo_edge.runtime.backends.tensorrt_engine import (
    EngineBlob,
    _trt,
    build_io_bytes,
    default_config,
    engine_key,
    ensure_engine,
    gpu_identity,
    import_error_message,
    model_source,
    plugin_engine_possible,
    required_plugin_library,
    set_device_memory,
)

__all__ = [
    "PoolAllocatorCalls",
    "TensorRtRunner",
    "choose_variant",
    "default_config",
    "model_source",
    "probe",
    "select_engine",
]

log = logging.getLogger("veo_edge.runtime.tensorrt")

#: cudaError_t values the runtime treats specially
_CUDA_OOM = 2  # cudaErrorMemoryAllocation
#: devices unavailable, ECC uncorrectable, illegal address, launch timeout, the sticky kernel faults that leave
#: the context unusable (assert, hardware stack, illegal instruction, misaligned address, invalid address
#: space, invalid PC, launch failure), unknown
_CUDA_DEVICE_LOST = {46, 214, 700, 702, 710, 714, 715, 716, 717, 718, 719, 999}
#: the pool's slices are 256-byte aligned (plugins/mempool)
_POOL_ALIGNMENT = 256


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


# -- TensorRT's allocator over the pool -----------------------------------------------------------
class PoolAllocatorCalls:
    """``IGpuAsyncAllocator``'s contract (NvInferRuntime.h, 10.3 and 11.x) over a veo-edge :class:`MemPool`,
    TensorRT-free so that it is tested on the CPU: a size-0 request gets 0 (nullptr); an alignment above
    256 or not a power of two gets 0; a null stream (0) is the legacy default stream and is fenced like any
    other; freeing 0 succeeds; nothing raises (TensorRT calls these from its own threads, noexcept)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.failures: list[str] = []  # the last few reasons a call returned 0 / False, for diagnostics

    def _failed(self, what: str) -> None:
        log.error("TensorRT allocator: %s", what)
        self.failures = [*self.failures[-9:], what]

    def allocate(self, size: int, alignment: int, stream: int) -> int:
        if size == 0:
            return 0
        if alignment > _POOL_ALIGNMENT or alignment & (alignment - 1):
            self._failed(f"alignment {alignment} requested; the pool serves 0 or powers of two up to 256")
            return 0
        try:
            return self.pool.alloc_async(int(size), int(stream or 0))
        except Exception as e:  # must not raise into TensorRT: nullptr says it
            self._failed(f"allocating {size} bytes failed: {e}")
            return 0

    def deallocate(self, memory: int, stream: int) -> bool:
        if not memory:
            return True
        try:
            self.pool.free_async(int(memory), int(stream or 0))
            return True
        except Exception as e:  # must not raise into TensorRT: False says it
            self._failed(f"freeing {memory:#x} failed: {e}")
            return False


def make_gpu_allocator(trt: Any, calls: PoolAllocatorCalls) -> Any:
    """A ``trt.IGpuAsyncAllocator`` forwarding to ``calls``. The binding (python/src/infer/pyCore.cpp,
    v10.3.0 and v11.1) calls ``allocate_async(size, alignment, stream, flags)`` with the stream third,
    whatever its docstring says; flags (reserved, 0) are ignored, and every method is overridden as the
    binding requires."""

    class PoolGpuAllocator(trt.IGpuAsyncAllocator):
        def __init__(self) -> None:
            trt.IGpuAsyncAllocator.__init__(self)

        def allocate_async(self, size: int, alignment: int, stream: int, flags: int) -> int:
            return calls.allocate(size, alignment, stream)

        def deallocate_async(self, memory: int, stream: int) -> bool:
            return calls.deallocate(memory, stream)

        def allocate(self, size: int, alignment: int, flags: int) -> int:  # deprecated: the default stream
            return calls.allocate(size, alignment, 0)

        def deallocate(self, memory: int) -> bool:
            return calls.deallocate(memory, 0)

        def reallocate(self, address: int, alignment: int, new_size: int) -> int:
            return 0  # not supported: TensorRT allocates anew

    return PoolGpuAllocator()


# -- which engine ---------------------------------------------------------------------------------
def _keys(build: BuildDir, config: EngineConfig, trt_version: str, gpu: int) -> tuple[Any, Any]:
    plain = engine_key(build, config, trt_version, gpu_identity(gpu), None, "plain")
    plugins = None
    if plugin_engine_possible(build, config.engine):
        plugins = engine_key(
            build, config, trt_version, gpu_identity(gpu), required_plugin_library(build), "plugins"
        )
    return plain, plugins


def choose_variant(
    build: BuildDir, config: EngineConfig, cache: Path, trt_version: str, gpu: int
) -> str | None:
    """The variant to serve without measuring: forced, the only one, or the recorded decision; ``None``
    when ``fastest`` has to measure first."""
    variants = variants_to_build(config.engine, plugin_engine_possible(build, config.engine))
    if len(variants) == 1:
        return variants[0]
    plain, plugins = _keys(build, config, trt_version, gpu)
    decision = ChoiceRecord.for_keys(cache, build.model_name, plain, plugins).read(plain, plugins)
    return decision.chosen if decision is not None else None


def _reference(build: BuildDir, batches: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Seeded inputs and ONNX Runtime's float32 outputs of the plain ONNX on the CPU, per batch size."""
    import onnxruntime as ort

    from veo_edge.export.parity import seeded_inputs

    sess = ort.InferenceSession(str(build.artifact("onnx")), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    out = {}
    for b in batches:
        x = seeded_inputs(tuple(build.manifest["input_shape"]), b, 0)
        out[b] = (x, sess.run(None, {name: x})[0])
    return out


def select_engine(
    build: BuildDir,
    config: EngineConfig,
    *,
    force: bool = False,
    cache: Path | None = None,
    gpu: int = 0,
    warmup: int = WARMUP_RUNS,
    reps: int = TIMED_RUNS,
    progress: Callable[[str], None] = log.info,
) -> tuple[Decision, dict[str, EngineBlob]]:
    """Build the engines ``config.engine`` needs; for ``fastest`` with both, run both on the same seeded
    inputs, compare them with the ONNX Runtime reference, time them at batch 1 and max batch, decide and
    record the decision next to the engines. Returns the decision and the engines."""
    cache = cache or cache_dir(build.path)
    variants = variants_to_build(config.engine, plugin_engine_possible(build, config.engine))
    blobs = {}
    failed = None
    for v in variants:
        progress(f"engine {v}: building or loading from the cache")
        try:
            blobs[v] = ensure_engine(build, config, v, force=force, cache=cache, gpu=gpu)
        except (BackendError, ModelLoadError) as e:
            if v != "plugins" or len(variants) == 1:
                raise
            failed = f"the plugin engine could not be built ({e}): TensorRT's own engine serves"
            log.warning(failed)
    if failed is not None:
        return Decision(config.engine, "plain", failed), blobs  # not recorded: retried on the next build
    if len(variants) == 1:
        chosen = variants[0]
        why = f"--engine {config.engine} was asked for" if config.engine != "fastest" else "the only engine"
        return Decision(config.engine, chosen, why), blobs
    batches = sorted({1, config.max_batch})
    ref = _reference(build, batches)
    measured = []
    for v in variants:
        progress(
            f"engine {v}: checking outputs and timing batches {batches} ({warmup} warm-up, median of {reps})"
        )
        runner = TensorRtRunner(build, dataclasses.replace(config, engine=v), cache=cache, gpu=gpu)
        with runner:
            err = max(
                float(np.max(np.abs(runner.infer(x)[runner.output_metadata()[0].name] - y)))
                for x, y in ref.values()
            )
            times = {}
            for b in batches:
                runner.infer(ref[b][0])  # the batch's shape and data in place
                times[b] = median_ms(lambda b=b, r=runner: r.time_once(b), warmup, reps)
        scale = max(float(np.max(np.abs(y))) for _, y in ref.values())
        measured.append(Measurement(v, times, err, scale))
    decision = decide("fastest", measured, config.precision)
    record = ChoiceRecord.for_keys(cache, build.model_name, blobs["plain"].key, blobs["plugins"].key)
    record.write(
        blobs["plain"].key, blobs["plugins"].key, decision, batches=batches, warmup=warmup, reps=reps
    )
    for line in decision.lines():
        progress(line)
    return decision, blobs


# -- the runner -----------------------------------------------------------------------------------
class TensorRtRunner(Runner):
    name = "tensorrt"

    def __init__(
        self, build: BuildDir, config: EngineConfig | None = None, cache: Path | None = None, gpu: int = 0
    ) -> None:
        super().__init__(build.max_batch)
        if not isinstance(gpu, int) or gpu < 0:
            raise BackendError(f"gpu must be a device index >= 0, got {gpu!r}")
        self.build = build
        self.config = config or default_config(build)
        self.cache = cache
        self.gpu = gpu
        self.origin: str | None = None
        self.variant: str | None = None
        self._state: dict[str, Any] = {}

    @classmethod
    def for_build(cls, build: BuildDir, **options: Any) -> TensorRtRunner:
        options.pop("gpu_memory_budget", None)  # enforced by the policy's probe
        config_kw = {k: options.pop(k) for k in ("engine", "pool_factor", "precision") if k in options}
        config = options.pop("config", None) or default_config(build, **config_kw)
        return cls(build, config, **options)

    def _engine(self, cudart: Any) -> EngineBlob:
        trt = _trt()
        cache = self.cache or cache_dir(self.build.path)
        variant = choose_variant(self.build, self.config, cache, trt.__version__, self.gpu)
        if variant is None:
            log.warning("no recorded engine choice for this GPU: building and timing both engines once")
            decision, blobs = select_engine(self.build, self.config, cache=cache, gpu=self.gpu)
            return blobs[decision.chosen]
        config = dataclasses.replace(self.config, engine=variant)
        return ensure_engine(self.build, config, variant, cache=cache, gpu=self.gpu)

    def _activate(self) -> None:
        from veo_edge.runtime.mempool import MemPool, MemPoolError, MemPoolOutOfMemoryError

        _trt()  # the library first: its absence is the reason a user most needs to read
        cudart = _cudart()
        _cuda_check(cudart.cudaSetDevice(self.gpu), f"selecting GPU {self.gpu}")  # before anything else
        blob = self._engine(cudart)
        trt = blob.trt
        sample = tuple(self.build.manifest["input_shape"])
        out_shape = tuple(self.build.manifest["outputs"][0]["shape"][1:])
        act = blob.device_memory_size
        io = io_bytes(sample, out_shape, self.max_batch)
        capacity = pool_capacity(act, io, self.config.pool_factor, weights=len(blob.blob))
        try:
            pool = MemPool("cuda", capacity=capacity)
        except MemPoolOutOfMemoryError as e:
            raise CudaOutOfMemoryError(f"CUDA out of memory reserving the TensorRT memory pool: {e}") from e
        st: dict[str, Any] = dict(cudart=cudart, pool=pool, host=[])
        try:
            st["stream"] = _cuda_check(cudart.cudaStreamCreate(), "stream creation")
            calls = PoolAllocatorCalls(pool)
            st["allocator"] = make_gpu_allocator(trt, calls)
            runtime = st["runtime"] = trt.Runtime(blob.logger)
            runtime.gpu_allocator = st["allocator"]  # engine weights and TensorRT's scratch: from the pool
            engine = st["engine"] = runtime.deserialize_cuda_engine(blob.blob)
            if engine is None:
                raise BackendError(
                    f"TensorRT could not deserialise {blob.entry.engine}; rebuild it with --force"
                )
            names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
            inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
            outputs = [n for n in names if n not in inputs]
            dtypes = {n: engine.get_tensor_dtype(n) for n in names}
            if len(inputs) != 1 or len(outputs) != 1 or any(d != trt.DataType.FLOAT for d in dtypes.values()):
                raise BackendError(
                    f"the engine's I/O is {dtypes}; veo-edge runs one FP32 input and one FP32 output (rebuild the engine)"
                )
            context = st["context"] = engine.create_execution_context(
                trt.ExecutionContextAllocationStrategy.USER_MANAGED
            )
            if context is None:
                raise BackendError("TensorRT could not create an execution context; see its log (--debug)")
            stream = int(st["stream"])
            st["act_ptr"] = pool.alloc(max(act, 1), stream)
            set_device_memory(trt, context, st["act_ptr"], act)
            n_in, n_out = self.max_batch * math.prod(sample), self.max_batch * math.prod(out_shape)
            st["d_in"], st["d_out"] = pool.alloc(n_in * 4, stream), pool.alloc(n_out * 4, stream)
            if not (
                context.set_tensor_address(inputs[0], st["d_in"])
                and context.set_tensor_address(outputs[0], st["d_out"])
            ):
                raise BackendError("TensorRT rejected the I/O buffer addresses; see its log (--debug)")
            st["h_in"], st["h_out"] = _pinned(cudart, n_in, st["host"]), _pinned(cudart, n_out, st["host"])
        except Exception as e:
            self._release(st)  # a partial activation leaks nothing (a retry loop would)
            if isinstance(e, MemPoolOutOfMemoryError):
                raise CudaOutOfMemoryError(f"CUDA out of memory allocating TensorRT buffers: {e}") from e
            if isinstance(e, MemPoolError):  # a VeoEdgeError the runtime would not treat as a backend failure
                raise BackendError(f"the TensorRT memory pool failed: {e}") from e
            raise
        self.origin, self.variant = blob.origin, blob.variant
        self._inputs = [TensorMeta(inputs[0], (None, *sample), "float32")]
        self._outputs = [TensorMeta(outputs[0], (None, *out_shape), "float32")]
        st.update(trt=trt, out_shape=out_shape, calls=calls, capacity=capacity, act=act, io=io)
        self._state = st

    @staticmethod
    def _release(st: dict[str, Any]) -> None:
        """Tear down in dependency order: context, engine, runtime (their frees go to the pool through the
        allocator), the stream, pinned buffers, and the pool last."""
        cudart = st["cudart"]
        try:
            if st.get("stream") is not None:
                cudart.cudaStreamSynchronize(st["stream"])
            for name in ("context", "engine", "runtime", "allocator"):
                st[name] = None
            if st.get("stream") is not None:
                cudart.cudaStreamDestroy(st["stream"])
            for ptr in st.get("host", []):
                cudart.cudaFreeHost(ptr)
        finally:
            st["pool"].close()

    def _deactivate(self) -> None:
        s, self._state = self._state, {}
        if s:
            self._release(s)

    def _infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        s = self._state
        cudart, ctx, stream = s["cudart"], s["context"], s["stream"]
        x = feed[self._inputs[0].name]
        n = x.shape[0]
        h_in = s["h_in"][1][: x.size]
        np.copyto(h_in, x.reshape(-1))  # pinned staging: the async copy really is asynchronous
        h_out = s["h_out"][1][: n * math.prod(s["out_shape"])]
        h2d, d2h = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        _cuda_check(cudart.cudaMemcpyAsync(s["d_in"], s["h_in"][0], x.nbytes, h2d, stream), "input copy")
        if not ctx.set_input_shape(self._inputs[0].name, tuple(x.shape)):
            raise BackendError(
                f"TensorRT rejected input shape {tuple(x.shape)} (profile 1..{self.max_batch})"
            )
        if not ctx.execute_async_v3(int(stream)):
            raise BackendError("TensorRT execute_async_v3 failed; see the TensorRT log (--debug)")
        _cuda_check(
            cudart.cudaMemcpyAsync(s["h_out"][0], s["d_out"], h_out.nbytes, d2h, stream), "output copy"
        )
        _cuda_check(cudart.cudaStreamSynchronize(stream), "inference")
        return {self._outputs[0].name: h_out.reshape(n, *s["out_shape"]).copy()}

    def time_once(self, batch: int) -> float:
        """Milliseconds of one enqueue at ``batch`` on the data in place, between two CUDA events."""
        s = self._state
        cudart, stream = s["cudart"], s["stream"]
        shape = (batch, *self._inputs[0].shape[1:])
        if not s["context"].set_input_shape(self._inputs[0].name, shape):
            raise BackendError(f"TensorRT rejected input shape {shape} (profile 1..{self.max_batch})")
        start = _cuda_check(cudart.cudaEventCreate(), "event creation")
        end = _cuda_check(cudart.cudaEventCreate(), "event creation")
        try:
            _cuda_check(cudart.cudaEventRecord(start, stream), "timing")
            if not s["context"].execute_async_v3(int(stream)):
                raise BackendError("TensorRT execute_async_v3 failed; see the TensorRT log (--debug)")
            _cuda_check(cudart.cudaEventRecord(end, stream), "timing")
            _cuda_check(cudart.cudaEventSynchronize(end), "timing")
            return float(_cuda_check(cudart.cudaEventElapsedTime(start, end), "timing"))
        finally:
            cudart.cudaEventDestroy(start)
            cudart.cudaEventDestroy(end)

    def pool_stats(self) -> dict[str, Any] | None:
        pool = self._state.get("pool")
        if pool is None:
            return None
        return {
            **asdict(pool.stats()),
            "reservation_factor": self.config.pool_factor,
            "free_blocks": pool.free_blocks(),  # the soak's fragmentation
        }

    def describe(self) -> dict[str, Any]:
        trt = _trt()
        s = self._state
        return {
            "backend": self.name,
            "version": trt.__version__,
            "precision": self.config.precision,
            "gpu": self.gpu,
            "engine": self.origin,
            "engine_variant": self.variant,
            "memory_pool": self.pool_stats(),
            "memory_pool_reservation": None if not s else {
                "factor": self.config.pool_factor, "activation_bytes": s["act"], "io_bytes": s["io"],
                "capacity": s["capacity"],
            },
        }  # fmt: skip


def _pinned(cudart: Any, count: int, owned: list[int]) -> tuple[int, np.ndarray]:
    """``count`` float32s of page-locked host memory (cudaMallocHost), as (address, numpy view); the address
    is appended to ``owned`` so that it is freed with cudaFreeHost on deactivation."""
    ptr = int(_cuda_check(cudart.cudaMallocHost(count * 4), "pinned host allocation"))
    owned.append(ptr)
    return ptr, np.ctypeslib.as_array((ctypes.c_float * count).from_address(ptr))
