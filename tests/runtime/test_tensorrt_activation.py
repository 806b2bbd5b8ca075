"""TensorRtRunner.activate against stand-ins for tensorrt and cuda-python over the real memory pool (its
host backend): the pool sized for the engine, TensorRT's allocator wired before deserialisation, inputs
and outputs staged through pinned memory, and every failed activation giving back its stream, its
engine's memory and its pool, in that order. No TensorRT needed."""

from __future__ import annotations

import enum
from types import SimpleNamespace

import numpy as np
import pytest

from veo_edge.errors import BackendError, CudaOutOfMemoryError
from veo_edge.runtime.backends import tensorrt as trt_backend
from veo_edge.runtime.backends import tensorrt_engine as trt_engine


class _Err(enum.IntEnum):  # cuda-python's cudaError_t is an IntEnum
    cudaSuccess = 0


class _Mode(enum.Enum):
    INPUT = 1
    OUTPUT = 2


class _AllocatorBase:  # tensorrt.IGpuAsyncAllocator: the subclass must call its __init__
    def __init__(self):
        self.base_initialised = True


class _Engine:
    """An ICudaEngine stand-in: its weights come from the runtime's allocator at deserialisation and go back
    to it when the engine is destroyed, as TensorRT's do."""

    def __init__(self, allocator, nbytes, spec, log):
        self.allocator, self.log = allocator, log
        self.weights = allocator.allocate_async(nbytes, 256, 0, 0)
        self.__dict__.update(spec)

    def __del__(self):
        ok = self.allocator.deallocate_async(self.weights, 0)
        self.log.append("engine freed" if ok else "engine free FAILED")


class _Runtime:
    def __init__(self, engine, log):
        self.engine, self.log, self._allocator = engine, log, None
        self.kept = []  # engines something else still references (set by a test)

    @property
    def gpu_allocator(self):
        raise AttributeError("write-only, as in the binding")

    @gpu_allocator.setter
    def gpu_allocator(self, alloc):
        self.log.append("gpu_allocator")
        self._allocator = alloc

    def deserialize_cuda_engine(self, blob):
        # the weights come through the allocator the runtime was given: it must be set by now
        self.log.append("deserialize")
        assert self._allocator is not None
        engine = _Engine(self._allocator, len(blob), self.engine, self.log)
        self.weights = engine.weights
        if self.keep_engine:
            self.kept.append(engine)
        return engine

    keep_engine = False


def _activation_stand_ins(
    monkeypatch, version="10.3.0", out_dtype="float", context=None, cudart=None, log=None
):
    """tensorrt and cuda-python stand-ins for TensorRtRunner.activate: an engine with input "x" and output
    "y" (one FP32 input; ``out_dtype`` for the output), as the engine cache would hand it over."""
    log = log if log is not None else []
    engine = dict(  # the engine's methods; each deserialisation makes an _Engine with them
        num_io_tensors=2,
        get_tensor_name=lambda i: ["x", "y"][i],
        get_tensor_mode=lambda n: _Mode.INPUT if n == "x" else _Mode.OUTPUT,
        get_tensor_dtype=lambda n: out_dtype if n == "y" else "float",
        create_execution_context=lambda strategy: context,
    )
    runtimes = []
    trt = SimpleNamespace(
        __version__=version,
        TensorIOMode=_Mode,
        DataType=SimpleNamespace(FLOAT="float"),
        ExecutionContextAllocationStrategy=SimpleNamespace(USER_MANAGED="user"),
        IGpuAsyncAllocator=_AllocatorBase,
        Runtime=lambda logger: runtimes.append(_Runtime(engine, log)) or runtimes[-1],
    )
    blob = trt_engine.EngineBlob(
        trt, None, "plain", None, SimpleNamespace(engine="e.engine"), "cached", b"w" * 4096, 1 << 16
    )
    monkeypatch.setattr(trt_backend, "_trt", lambda: trt)
    monkeypatch.setattr(trt_backend, "_cudart", lambda: cudart or SimpleNamespace())
    monkeypatch.setattr(trt_backend.TensorRtRunner, "_engine", lambda self, cudart: blob)
    return runtimes


def test_pool_out_of_memory_at_activation_is_a_cuda_oom(monkeypatch, nano_build):
    from veo_edge.builddir import BuildDir
    from veo_edge.runtime import mempool

    def no_memory(*a, **k):
        raise mempool.MemPoolOutOfMemoryError("cudaMalloc of 5 bytes failed: out of memory")

    _activation_stand_ins(monkeypatch, cudart=_Cudart())
    monkeypatch.setattr(mempool, "MemPool", no_memory)
    runner = trt_backend.TensorRtRunner(BuildDir.open(nano_build))
    with pytest.raises(CudaOutOfMemoryError, match="reserving the TensorRT memory pool"):
        runner.activate()
    assert not runner.is_active


class _Cudart:
    """cuda-python stand-in: streams, pinned host memory (real host memory, so the runner's numpy views
    work), copies done at once, and a record of every call."""

    cudaMemcpyKind = SimpleNamespace(cudaMemcpyHostToDevice="h2d", cudaMemcpyDeviceToHost="d2h")

    def __init__(self):
        self.calls, self.pinned, self.buffers = [], {}, {}

    def cudaSetDevice(self, i):
        self.calls.append(("set_device", i))
        return (_Err.cudaSuccess,)

    def cudaStreamCreate(self):
        self.calls.append(("stream_create",))
        return (_Err.cudaSuccess, 1234)

    def cudaStreamDestroy(self, stream):
        self.calls.append(("stream_destroy", stream))
        return (_Err.cudaSuccess,)

    def cudaStreamSynchronize(self, stream):
        return (_Err.cudaSuccess,)

    def cudaMallocHost(self, n):
        import ctypes

        buf = ctypes.create_string_buffer(n)
        self.buffers[ctypes.addressof(buf)] = buf
        self.pinned[ctypes.addressof(buf)] = n
        self.calls.append(("malloc_host", n))
        return (_Err.cudaSuccess, ctypes.addressof(buf))

    def cudaFreeHost(self, ptr):
        self.calls.append(("free_host", ptr))
        return (_Err.cudaSuccess,)

    def cudaMemcpyAsync(self, dst, src, n, kind, stream):
        self.calls.append(("memcpy", kind, src if kind == "h2d" else dst, n))
        return (_Err.cudaSuccess,)


def _host_pools(monkeypatch, pool_lib, log=None):
    from veo_edge.runtime import mempool

    pools = []

    class HostPool(mempool.MemPool):  # the real pool on the host backend; ``log`` records its closing
        def close(self):
            if self._handle is not None and log is not None:
                log.append("pool closed")
            super().close()

    def host_pool(backend, capacity):
        pools.append(HostPool("host", capacity=capacity, library=pool_lib))
        return pools[-1]

    monkeypatch.setattr(mempool, "MemPool", host_pool)
    return pools


def test_an_engine_with_non_fp32_io_is_refused(monkeypatch, nano_build, pool_lib):
    from veo_edge.builddir import BuildDir

    _host_pools(monkeypatch, pool_lib)
    _activation_stand_ins(monkeypatch, version="11.1.0", out_dtype="half", cudart=_Cudart())
    with pytest.raises(BackendError, match="one FP32 input and one FP32 output"):
        trt_backend.TensorRtRunner(BuildDir.open(nano_build)).activate()


def test_a_failed_activation_releases_its_stream_and_pool(monkeypatch, nano_build, pool_lib):
    """The context cannot be created (TensorRT returns None): the stream made for it is destroyed and
    the (real, host) pool closed, so a runtime retrying activation leaks nothing."""
    from veo_edge.builddir import BuildDir
    from veo_edge.runtime import mempool

    cudart = _Cudart()
    pools = _host_pools(monkeypatch, pool_lib)
    _activation_stand_ins(monkeypatch, context=None, cudart=cudart)
    with pytest.raises(BackendError, match="could not create an execution context"):
        trt_backend.TensorRtRunner(BuildDir.open(nano_build)).activate()
    names = [c[0] for c in cudart.calls]
    assert names.count("stream_create") == 1 and names.count("stream_destroy") == 1
    assert len(pools) == 1
    with pytest.raises(mempool.MemPoolError, match="this memory pool is closed"):
        pools[0].stats()


def test_a_failed_activation_gives_tensorrts_memory_back_before_closing_the_pool(
    monkeypatch, nano_build, pool_lib, caplog
):
    """The engine was deserialised (its weights in the pool) when context creation failed: the engine is
    destroyed, its weights freed into the still open pool, and only then the pool closed; not the pool
    first and the engine later, when the caller drops the exception, into a closed pool."""
    from veo_edge.builddir import BuildDir

    log = []
    pools = _host_pools(monkeypatch, pool_lib, log)
    _activation_stand_ins(monkeypatch, context=None, cudart=_Cudart(), log=log)
    with pytest.raises(BackendError, match="could not create an execution context"):
        trt_backend.TensorRtRunner(BuildDir.open(nano_build)).activate()
    assert log == ["gpu_allocator", "deserialize", "engine freed", "pool closed"]
    assert pools[0]._handle is None
    assert "TensorRT allocator" not in caplog.text


def test_a_pool_tensorrt_still_uses_is_left_open(monkeypatch, nano_build, pool_lib, caplog):
    """An engine referenced elsewhere outlives the failed activation: the pool stays open (with a warning
    saying so) and the engine's frees, when it goes, still land in a live pool."""
    from veo_edge.builddir import BuildDir

    log = []
    pools = _host_pools(monkeypatch, pool_lib, log)
    runtimes = _activation_stand_ins(monkeypatch, context=None, cudart=_Cudart(), log=log)
    monkeypatch.setattr(_Runtime, "keep_engine", True)
    with pytest.raises(BackendError, match="could not create an execution context"):
        trt_backend.TensorRtRunner(BuildDir.open(nano_build)).activate()
    assert "pool closed" not in log and "left open" in caplog.text
    runtimes[0].kept.clear()
    assert log[-1] == "engine freed" and pools[0].stats().in_use == 0


class _ContextStandIn:
    def __init__(self):
        self.calls = []

    def set_device_memory(self, ptr, size):
        self.calls.append(("device_memory", ptr, size))

    def set_tensor_address(self, name, ptr):
        self.calls.append(("address", name, ptr))
        return True

    def set_input_shape(self, name, shape):
        self.calls.append(("shape", name, shape))
        return True

    def execute_async_v3(self, stream):
        self.calls.append(("execute", stream))
        return True


def test_activation_sizes_the_pool_wires_tensorrts_allocator_and_stages_through_pinned_memory(
    monkeypatch, nano_build, pool_lib
):
    from veo_edge.builddir import BuildDir
    from veo_edge.engine.config import io_bytes, pool_capacity

    build = BuildDir.open(nano_build)
    cudart, ctx, log = _Cudart(), _ContextStandIn(), []
    pools = _host_pools(monkeypatch, pool_lib)
    runtimes = _activation_stand_ins(monkeypatch, context=ctx, cudart=cudart, log=log)
    runner = trt_backend.TensorRtRunner(build, gpu=1)
    runner.activate()
    sample = tuple(build.manifest["input_shape"])
    out = tuple(build.manifest["outputs"][0]["shape"][1:])
    io = io_bytes(sample, out, build.max_batch)
    # 4 x (activations + I/O at max batch) + the engine's weights, which TensorRT allocates through the pool
    assert pools[0].stats().capacity == pool_capacity(1 << 16, io, 4.0, weights=4096)
    assert cudart.calls[0] == ("set_device", 1)  # --gpu 1 before anything touches the device
    assert log == ["gpu_allocator", "deserialize"]
    assert runtimes[0].weights != 0 and runtimes[0]._allocator.base_initialised
    stats = runner.pool_stats()
    assert stats["reservation_factor"] == 4.0 and stats["in_use"] >= 4096 + (1 << 16)
    x = np.random.default_rng(0).standard_normal((3, *sample)).astype(np.float32)
    runner._infer({"x": x})
    pinned = set(cudart.pinned)
    copies = [c for c in cudart.calls if c[0] == "memcpy"]
    assert [c[1] for c in copies] == ["h2d", "d2h"]
    assert all(c[2] in pinned for c in copies)  # both copies touch page-locked staging, never x itself
    assert copies[0][3] == x.nbytes
    h_in = runner._state["h_in"][1][: x.size]
    assert np.array_equal(h_in, x.reshape(-1))
    runner.deactivate()
    freed = {c[1] for c in cudart.calls if c[0] == "free_host"}
    assert freed == pinned
    assert [c[0] for c in cudart.calls].count("stream_destroy") == 1
