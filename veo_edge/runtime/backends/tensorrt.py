"""TensorRT backend: the primary GPU path.

Activation, in order: pick the GPU (``gpu=N``, default 0), decide which engine serves (``engine=``:
``fastest`` reads the decision recorded by ``veo-edge engine build``, and makes it when there is none;
see :mod:`veo_edge.engine.selection`), take that engine from the cache or build it
(:mod:`veo_edge.runtime.backends.tensorrt_engine`), reserve one veo-edge memory pool region of
``pool_factor`` (4) x the max-batch activation + I/O need plus the engine's weights, give TensorRT's
runtime an ``IGpuAsyncAllocator`` over that pool (:mod:`~veo_edge.runtime.backends.tensorrt_allocator`),
deserialise the engine (its weights land in the pool), and create a ``USER_MANAGED`` execution context
whose activation memory and I/O buffers are slices of the same pool. Host staging buffers are pinned
(``cudaMallocHost``; :mod:`~veo_edge.runtime.backends.tensorrt_cuda`). Whether the backend can run here
at all is :func:`~veo_edge.runtime.backends.tensorrt_probe.probe`, re-exported here.

What stays outside the pool: the builder's allocations (``veo-edge engine build`` is a one-off whose tactic
scratch is freed when it ends, and sized by the workspace limit rather than by serving), the CUDA
context itself, cuBLAS/cuDNN handles TensorRT's tactics create, and the pinned host buffers.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from veo_edge.builddir import BuildDir
from veo_edge.engine.cache import ChoiceRecord, cache_dir
from veo_edge.engine.config import EngineConfig, io_bytes, pool_capacity
from veo_edge.engine.selection import (
    TIMED_RUNS,
    WARMUP_RUNS,
    Decision,
    Measurement,
    decide,
    median_ms,
    variants_to_build,
)
from veo_edge.errors import BackendError, CudaOutOfMemoryError, ModelLoadError
from veo_edge.runtime.backends.base import Runner, TensorMeta
from veo_edge.runtime.backends.tensorrt_allocator import PoolAllocatorCalls, make_gpu_allocator
from veo_edge.runtime.backends.tensorrt_cuda import _cuda_check, _cudart, _pinned
from veo_edge.runtime.backends.tensorrt_engine import (
    EngineBlob,
    _trt,
    default_config,
    engine_key,
    ensure_engine,
    gpu_identity,
    model_source,
    plugin_engine_possible,
    required_plugin_library,
    set_device_memory,
)
from veo_edge.runtime.backends.tensorrt_probe import probe

__all__ = [
    "PoolAllocatorCalls",
    "TensorRtRunner",
    "choose_variant",
    "default_config",
    "make_gpu_allocator",
    "model_source",
    "probe",
    "select_engine",
]

log = logging.getLogger("veo_edge.runtime.tensorrt")


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
            self._open(st, blob, act, sample, out_shape)
        except Exception as e:
            # The frames of the traceback hold what _open had made (engine, context) until the caller is
            # done with the exception; cleared here, TensorRT gives its memory back to the pool before
            # _release closes it, not afterwards into a closed pool.
            traceback.clear_frames(e.__traceback__)
            self._release(st)  # a partial activation leaks nothing (a retry loop would)
            if isinstance(e, MemPoolOutOfMemoryError):
                raise CudaOutOfMemoryError(f"CUDA out of memory allocating TensorRT buffers: {e}") from e
            if isinstance(e, MemPoolError):  # a VeoEdgeError the runtime would not treat as a backend failure
                raise BackendError(f"the TensorRT memory pool failed: {e}") from e
            raise
        self.origin, self.variant = blob.origin, blob.variant
        st.update(trt=blob.trt, out_shape=out_shape, capacity=capacity, act=act, io=io)
        self._state = st

    def _open(self, st: dict[str, Any], blob: EngineBlob, act: int, sample: tuple, out_shape: tuple) -> None:
        """Runtime, engine, context and buffers, each kept in ``st`` (so that :meth:`_release` finds what
        was made when a later step fails) and nowhere else."""
        trt, cudart, pool = blob.trt, st["cudart"], st["pool"]
        st["stream"] = _cuda_check(cudart.cudaStreamCreate(), "stream creation")
        st["calls"] = PoolAllocatorCalls(pool)
        st["allocator"] = make_gpu_allocator(trt, st["calls"])
        st["runtime"] = trt.Runtime(blob.logger)
        st["runtime"].gpu_allocator = st["allocator"]  # engine weights and TensorRT's scratch: from the pool
        engine = st["engine"] = st["runtime"].deserialize_cuda_engine(blob.blob)
        if engine is None:
            raise BackendError(f"TensorRT could not deserialise {blob.entry.engine}; rebuild it with --force")
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
        self._inputs = [TensorMeta(inputs[0], (None, *sample), "float32")]
        self._outputs = [TensorMeta(outputs[0], (None, *out_shape), "float32")]

    @staticmethod
    def _release(st: dict[str, Any]) -> None:
        """Tear down in dependency order: the stream drained, our own slices back, context, engine,
        runtime (their frees go to the pool through the allocator), the stream, pinned buffers, and the
        pool last, only once nothing holds a slice of it: should a TensorRT object still be referenced
        elsewhere, the pool stays open (it is the allocator's too) and is freed with the last of them."""
        cudart, pool = st["cudart"], st["pool"]
        try:
            if st.get("stream") is not None:
                cudart.cudaStreamSynchronize(st["stream"])
            for name in ("act_ptr", "d_in", "d_out"):  # the stream is drained: reusable at once
                if st.get(name):
                    pool.free(st.pop(name))
            for name in ("context", "engine", "runtime", "allocator"):
                st[name] = None
            if st.get("stream") is not None:
                cudart.cudaStreamDestroy(st["stream"])
            for ptr in st.get("host", []):
                cudart.cudaFreeHost(ptr)
        finally:
            held = pool.stats().in_use
            if held == 0:
                pool.close()
            else:
                log.warning(
                    "TensorRT still holds %d bytes of its memory pool (an engine or context is referenced "
                    "elsewhere): the pool is left open and freed with the last of them",
                    held,
                )

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
