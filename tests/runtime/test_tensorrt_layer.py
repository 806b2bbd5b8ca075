"""The thin TensorRT layer against stand-ins for tensorrt and cuda-python: what it calls, in which
TensorRT version, and how failures map to the runtime's error classes. No TensorRT needed."""

from __future__ import annotations

import enum
from types import SimpleNamespace

import pytest

from veo_edge.errors import BackendError, BackendUnavailableError, CudaOutOfMemoryError, DeviceLostError
from veo_edge.runtime.backends import tensorrt as trt_backend


class _Err(enum.IntEnum):  # cuda-python's cudaError_t is an IntEnum
    cudaSuccess = 0
    cudaErrorMemoryAllocation = 2
    cudaErrorInvalidValue = 1
    cudaErrorHardwareStackError = 714


class _Registry:
    def __init__(self, handle):
        self.handle, self.loaded = handle, []

    def load_library(self, path):
        self.loaded.append(path)
        return self.handle


def _fake_trt(handle=object(), version="10.3.0"):
    registry = _Registry(handle)
    inits = []
    trt = SimpleNamespace(
        __version__=version,
        get_plugin_registry=lambda: registry,
        init_libnvinfer_plugins=lambda logger, ns: inits.append(ns) or True,
    )
    return trt, registry, inits


@pytest.fixture(autouse=True)
def _fresh_plugin_memo(monkeypatch):
    monkeypatch.setattr(trt_backend, "_LOADED_PLUGIN_LIBRARIES", {})


def test_the_plugin_library_loads_once_per_process(tmp_path):
    trt, registry, inits = _fake_trt()
    lib = SimpleNamespace(path=tmp_path / "libveo_edge_plugins.so")
    trt_backend.load_plugins(trt, None, lib)
    # a second activation: loadLibrary would return None (creators already registered), so it is not called
    trt_backend.load_plugins(trt, None, lib)
    assert registry.loaded == [str(lib.path)] and inits == ["", ""]


def test_a_refused_plugin_library_is_a_skip_not_a_silent_success(tmp_path):
    trt, _registry, _ = _fake_trt(handle=None)  # load_library returns None on failure, it never raises
    lib = SimpleNamespace(path=tmp_path / "libveo_edge_plugins.so")
    with pytest.raises(BackendUnavailableError, match=r"could not load the plugin library .*refused it"):
        trt_backend.load_plugins(trt, None, lib)
    assert str(lib.path) not in trt_backend._LOADED_PLUGIN_LIBRARIES


def test_no_plugin_library_only_registers_tensorrts_own():
    trt, registry, inits = _fake_trt()
    trt_backend.load_plugins(trt, None, None)
    assert registry.loaded == [] and inits == [""]


class _Config:
    """IBuilderConfig's timing-cache calls: create (None on a corrupt blob), set (False on a mismatch)."""

    def __init__(self, accept_disk: bool, parse_disk: bool = True):
        self.accept_disk, self.parse_disk, self.attached = accept_disk, parse_disk, None

    def create_timing_cache(self, blob):
        if blob and not self.parse_disk:
            return None
        return SimpleNamespace(blob=bytes(blob))

    def set_timing_cache(self, cache, ignore_mismatch):
        assert ignore_mismatch is False
        if cache.blob and not self.accept_disk:
            return False
        self.attached = cache
        return True


@pytest.mark.parametrize(
    ("on_disk", "config", "expect"),
    [
        (None, _Config(accept_disk=True), b""),  # no file: a new cache
        (b"good", _Config(accept_disk=True), b"good"),  # reused
        (b"other-gpu", _Config(accept_disk=False), b""),  # device mismatch: set_timing_cache -> False
        (b"junk", _Config(accept_disk=True, parse_disk=False), b""),  # corrupt: create_timing_cache -> None
    ],
)
def test_the_timing_cache_is_reused_only_when_tensorrt_accepts_it(tmp_path, on_disk, config, expect):
    path = tmp_path / "timing.cache"
    if on_disk is not None:
        path.write_bytes(on_disk)
    cache = trt_backend._timing_cache(config, path)
    assert cache is config.attached and cache.blob == expect


def test_cuda_errors_map_to_the_runtime_error_classes():
    assert trt_backend._cuda_check((_Err.cudaSuccess, 1234), "stream creation") == 1234
    assert trt_backend._cuda_check((_Err.cudaSuccess,), "copy") == []
    assert trt_backend._cuda_check((0,), "copy") == []  # a plain int works too
    with pytest.raises(CudaOutOfMemoryError, match="during input copy"):
        trt_backend._cuda_check((_Err.cudaErrorMemoryAllocation,), "input copy")
    with pytest.raises(DeviceLostError, match=r"cudaError 714"):  # sticky: the context is gone
        trt_backend._cuda_check((_Err.cudaErrorHardwareStackError,), "inference")
    with pytest.raises(BackendError, match=r"CUDA error 1 during output copy") as e:
        trt_backend._cuda_check((_Err.cudaErrorInvalidValue,), "output copy")
    assert not isinstance(e.value, (CudaOutOfMemoryError, DeviceLostError))


class _Context:
    def __init__(self):
        self.calls = []

    def set_device_memory(self, ptr, size):
        self.calls.append(("set_device_memory", ptr, size))

    def __setattr__(self, name, value):
        if name == "device_memory":
            self.calls.append(("device_memory", value))
        else:
            super().__setattr__(name, value)


@pytest.mark.parametrize(
    ("version", "size", "call"),
    [
        ("10.0.1", 111, ("device_memory", 4096)),
        ("10.3.0", 222, ("set_device_memory", 4096, 222)),
        ("11.1.0", 222, ("set_device_memory", 4096, 222)),
    ],
)
def test_activation_memory_uses_the_api_of_the_version(version, size, call):
    trt = SimpleNamespace(__version__=version)
    engine = SimpleNamespace(device_memory_size_v2=222)
    if version.startswith("10.0"):
        engine = SimpleNamespace(device_memory_size=111)  # 10.0 has no _v2
    assert trt_backend.device_memory_size(trt, engine) == size
    ctx = _Context()
    trt_backend.set_device_memory(trt, ctx, 4096, size)
    assert ctx.calls == [call]


class _Mode(enum.Enum):
    INPUT = 1
    OUTPUT = 2


def _activation_stand_ins(monkeypatch, version="10.3.0", out_dtype="float", context=None, cudart=None):
    """tensorrt and cuda-python stand-ins for TensorRtRunner.activate: an engine with input "x" and output
    "y" (one FP32 input; ``out_dtype`` for the output), as load_or_build_engine would hand it over."""
    trt = SimpleNamespace(
        __version__=version,
        TensorIOMode=_Mode,
        DataType=SimpleNamespace(FLOAT="float"),
        ExecutionContextAllocationStrategy=SimpleNamespace(USER_MANAGED="user"),
    )
    engine = SimpleNamespace(
        num_io_tensors=2,
        device_memory_size_v2=1 << 16,
        get_tensor_name=lambda i: ["x", "y"][i],
        get_tensor_mode=lambda n: _Mode.INPUT if n == "x" else _Mode.OUTPUT,
        get_tensor_dtype=lambda n: out_dtype if n == "y" else "float",
        create_execution_context=lambda strategy: context,
    )
    monkeypatch.setattr(trt_backend, "_trt", lambda: trt)
    monkeypatch.setattr(trt_backend, "_cudart", lambda: cudart or SimpleNamespace())
    monkeypatch.setattr(
        trt_backend, "load_or_build_engine", lambda *a, **k: (trt, None, engine, None, "cached")
    )


def test_pool_out_of_memory_at_activation_is_a_cuda_oom(monkeypatch, nano_build):
    from veo_edge.builddir import BuildDir
    from veo_edge.runtime import mempool

    def no_memory(*a, **k):
        raise mempool.MemPoolOutOfMemoryError("cudaMalloc of 5 bytes failed: out of memory")

    _activation_stand_ins(monkeypatch)
    monkeypatch.setattr(mempool, "MemPool", no_memory)
    runner = trt_backend.TensorRtRunner(BuildDir.open(nano_build))
    with pytest.raises(CudaOutOfMemoryError, match="reserving the TensorRT memory pool"):
        runner.activate()
    assert not runner.is_active


def test_an_engine_with_non_fp32_io_is_refused(monkeypatch, nano_build):
    from veo_edge.builddir import BuildDir

    _activation_stand_ins(monkeypatch, version="11.1.0", out_dtype="half")
    with pytest.raises(BackendError, match="one FP32 input and one FP32 output"):
        trt_backend.TensorRtRunner(BuildDir.open(nano_build)).activate()


def test_a_failed_activation_releases_its_stream_and_pool(monkeypatch, nano_build, pool_lib):
    """The context cannot be created (TensorRT returns None): the stream made for it is destroyed and
    the (real, host) pool closed, so a runtime retrying activation leaks nothing."""
    from veo_edge.builddir import BuildDir
    from veo_edge.runtime import mempool

    streams = {"created": 0, "destroyed": 0}

    def create():
        streams["created"] += 1
        return (_Err.cudaSuccess, 1234)

    def destroy(stream):
        streams["destroyed"] += 1
        return (_Err.cudaSuccess,)

    pools = []
    real_pool = mempool.MemPool

    def host_pool(backend, capacity):
        pools.append(real_pool("host", capacity=capacity, library=pool_lib))
        return pools[-1]

    cudart = SimpleNamespace(cudaStreamCreate=create, cudaStreamDestroy=destroy)
    _activation_stand_ins(monkeypatch, context=None, cudart=cudart)
    monkeypatch.setattr(mempool, "MemPool", host_pool)
    with pytest.raises(BackendError, match="could not create an execution context"):
        trt_backend.TensorRtRunner(BuildDir.open(nano_build)).activate()
    assert streams == {"created": 1, "destroyed": 1}
    assert len(pools) == 1
    with pytest.raises(mempool.MemPoolError, match="this memory pool is closed"):
        pools[0].stats()
