"""The thin TensorRT layer against stand-ins for tensorrt and cuda-python: what it calls, in which
TensorRT version, and how failures map to the runtime's error classes. No TensorRT needed."""

from __future__ import annotations

import enum
from types import SimpleNamespace

import pytest

from veo_edge.errors import BackendError, BackendUnavailableError, CudaOutOfMemoryError, DeviceLostError
from veo_edge.runtime.backends import tensorrt as trt_backend
from veo_edge.runtime.backends import tensorrt_engine as trt_engine


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
    monkeypatch.setattr(trt_engine, "_LOADED_PLUGIN_LIBRARIES", {})


def test_the_plugin_library_loads_once_per_process(tmp_path):
    trt, registry, inits = _fake_trt()
    lib = SimpleNamespace(path=tmp_path / "libveo_edge_plugins.so")
    trt_engine.load_plugins(trt, None, lib)
    # a second activation: loadLibrary would return None (creators already registered), so it is not called
    trt_engine.load_plugins(trt, None, lib)
    assert registry.loaded == [str(lib.path)] and inits == ["", ""]


def test_a_refused_plugin_library_is_a_skip_not_a_silent_success(tmp_path):
    trt, _registry, _ = _fake_trt(handle=None)  # load_library returns None on failure, it never raises
    lib = SimpleNamespace(path=tmp_path / "libveo_edge_plugins.so")
    with pytest.raises(BackendUnavailableError, match=r"could not load the plugin library .*refused it"):
        trt_engine.load_plugins(trt, None, lib)
    assert str(lib.path) not in trt_engine._LOADED_PLUGIN_LIBRARIES


def test_no_plugin_library_only_registers_tensorrts_own():
    trt, registry, inits = _fake_trt()
    trt_engine.load_plugins(trt, None, None)
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
    cache = trt_engine._timing_cache(config, path)
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
    assert trt_engine.device_memory_size(trt, engine) == size
    ctx = _Context()
    trt_engine.set_device_memory(trt, ctx, 4096, size)
    assert ctx.calls == [call]


class _AllocatorBase:  # tensorrt.IGpuAsyncAllocator: the subclass must call its __init__
    def __init__(self):
        self.base_initialised = True


def test_the_allocator_contract_over_a_real_pool(pool_lib):
    from veo_edge.runtime.mempool import MemPool

    with MemPool("host", capacity=1 << 16, overflow=False, library=pool_lib) as pool:
        calls = trt_backend.PoolAllocatorCalls(pool)
        assert calls.allocate(0, 0, 0) == 0 and pool.stats().alloc_count == 0  # size 0: nullptr
        assert calls.allocate(100, 512, 0) == 0 and "alignment 512" in calls.failures[-1]
        assert calls.allocate(100, 48, 0) == 0  # not a power of two
        p = calls.allocate(100, 256, 0)
        q = calls.allocate(100, 0, 7)
        assert p and q and p % 256 == 0
        assert calls.deallocate(0, 0) is True  # TensorRT may free a nullptr it was given
        assert calls.deallocate(p, 0) is True  # stream 0: the legacy default stream
        assert calls.deallocate(p, 0) is False and "not a live slice" in calls.failures[-1]
        assert calls.allocate(1 << 20, 0, 0) == 0 and "memory pool exhausted" in calls.failures[-1]
        assert calls.deallocate(q, 7) is True and pool.stats().in_use == 0


def test_the_tensorrt_allocator_reads_the_stream_where_the_binding_passes_it():
    seen = []

    class Calls:
        def allocate(self, size, alignment, stream):
            seen.append(("alloc", size, alignment, stream))
            return 4096

        def deallocate(self, memory, stream):
            seen.append(("free", memory, stream))
            return True

    alloc = trt_backend.make_gpu_allocator(SimpleNamespace(IGpuAsyncAllocator=_AllocatorBase), Calls())
    assert alloc.base_initialised  # pybind11 needs the base __init__
    # pyCore.cpp (v10.3.0, v11.1): allocHelper(..., size, alignment, cudaStreamPtr, flags)
    assert alloc.allocate_async(512, 256, 0xABC, 0) == 4096
    assert alloc.deallocate_async(4096, 0xABC) is True
    assert alloc.allocate(512, 256, 0) == 4096 and alloc.deallocate(4096) is True  # deprecated: stream 0
    assert alloc.reallocate(4096, 256, 8192) == 0
    assert seen == [
        ("alloc", 512, 256, 0xABC),
        ("free", 4096, 0xABC),
        ("alloc", 512, 256, 0),
        ("free", 4096, 0),
    ]


def test_the_timing_cache_is_written_atomically(tmp_path):
    path = tmp_path / "timing.cache"
    path.write_bytes(b"old cache")

    class Broken:
        def serialize(self):
            raise RuntimeError("serialisation failed")

    with pytest.raises(RuntimeError):
        trt_engine.save_timing_cache(Broken(), path)
    assert path.read_bytes() == b"old cache"  # never torn or emptied
    trt_engine.save_timing_cache(SimpleNamespace(serialize=lambda: memoryview(b"new cache")), path)
    assert path.read_bytes() == b"new cache"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["timing.cache"]  # no temporary left behind
