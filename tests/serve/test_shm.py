"""Triton's system shared-memory extension through the real tritonclient (HTTP and gRPC) and its
``utils.shared_memory``: round trips, status, every bad region (a 400 that breaks nothing), mappings
released on unregister, the CUDA endpoints' refusal where CUDA is absent, and the extension being off by
default."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from veo_edge.builddir import BuildDir
from veo_edge.export.parity import seeded_inputs
from veo_edge.runtime.loaders import cpu_runner

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
shm = pytest.importorskip("tritonclient.utils.shared_memory")
from tritonclient.utils import InferenceServerException  # noqa: E402

PROTOCOLS = ["http", "grpc"]


def _client(server, protocol: str):
    if protocol == "http":
        return httpclient.InferenceServerClient(server.url, network_timeout=60)
    return grpcclient.InferenceServerClient(server.grpc_url)


def _mod(protocol: str):
    return httpclient if protocol == "http" else grpcclient


@pytest.fixture
def regions(request):
    """Factory of client-side segments (``/veo-test-<pid>-<name>``), destroyed at teardown."""
    made = []

    def _make(name: str, size: int):
        key = f"/veo-test-{os.getpid()}-{request.node.name[-20:]}-{name}".replace("[", "-").replace("]", "")
        handle = shm.create_shared_memory_region(name, key, size)
        made.append(handle)
        return handle, key

    yield _make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def _error(fn, *args, **kw) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        fn(*args, **kw)
    return info.value


def _bad(e: InferenceServerException) -> bool:
    return e.status() in ("400", "StatusCode.INVALID_ARGUMENT")


def _mapped(server, key: str) -> bool:
    """Whether the server process maps the segment ``key`` now."""
    return f"/dev/shm/{key.lstrip('/')}" in Path(f"/proc/{server.proc.pid}/maps").read_text()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_round_trip_moves_no_tensor_bytes(edge_server, nano_build, regions, protocol) -> None:
    c, mod = _client(edge_server, protocol), _mod(protocol)
    x = seeded_inputs((3, 32, 32), 3, seed=21)
    hin, kin = regions("in", x.nbytes + 64)
    hout, kout = regions("out", 4096)
    shm.set_shared_memory_region(hin, [x], offset=64)
    c.register_system_shared_memory(f"in-{protocol}", kin, x.nbytes, offset=64)
    c.register_system_shared_memory(f"out-{protocol}", kout, 4096)
    try:
        status = c.get_system_shared_memory_status()
        names = {r["name"] for r in status} if protocol == "http" else set(status.regions)
        assert {f"in-{protocol}", f"out-{protocol}"} <= names
        inp = mod.InferInput("input", list(x.shape), "FP32")
        inp.set_shared_memory(f"in-{protocol}", x.nbytes)
        out = mod.InferRequestedOutput("logits")
        out.set_shared_memory(f"out-{protocol}", 3 * 10 * 4, offset=128)
        result = c.infer("vit-nano", [inp], outputs=[out])
        got = shm.get_contents_as_numpy(hout, np.float32, [3, 10], offset=128)
        with cpu_runner(BuildDir.open(nano_build), "onnxruntime") as r:
            want = r.infer(x)["logits"]
        tol = 2 * BuildDir.open(nano_build).manifest["canary"]["atol"]
        assert float(np.abs(got - want).max()) <= tol
        if protocol == "http":  # no data, and no parameters: Triton's C++ client (perf_analyzer) would
            entry = result.get_output("logits")  # read them as binary data and need binary_data_size
            assert entry == {"name": "logits", "datatype": "FP32", "shape": [3, 10]}
        else:
            assert result.get_response().raw_output_contents[0] == b""
        assert _mapped(edge_server, kin)
    finally:
        c.unregister_system_shared_memory(f"in-{protocol}")
        c.unregister_system_shared_memory(f"out-{protocol}")
    assert not _mapped(edge_server, kin) and not _mapped(edge_server, kout)  # released on unregister


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_regions_are_400_and_break_nothing(edge_server, regions, protocol) -> None:
    c, mod = _client(edge_server, protocol), _mod(protocol)
    x = seeded_inputs((3, 32, 32), 1, seed=3)
    h, key = regions("seg", x.nbytes)
    shm.set_shared_memory_region(h, [x])
    p = protocol
    for args, message in [
        ((f"missing-{p}", f"/veo-no-such-key-{os.getpid()}", 64), "cannot open shared-memory key"),
        ((f"escape-{p}", "/../../etc/passwd", 64), "is not a segment name"),
        ((f"big-{p}", key, x.nbytes + 1), f"needs bytes 0..{x.nbytes + 1} of shared-memory key"),
    ]:
        e = _error(c.register_system_shared_memory, *args)
        assert _bad(e) and message in e.message(), e.message()
    if p == "http":  # no key: the offset is optional, and the answer says so
        path = "/v2/systemsharedmemory/region/nokey/register"
        status, _, body = edge_server.request("POST", path, json.dumps({"byte_size": 64}).encode())
        assert status == 400 and "needs a string 'key' (and, if given, an integer 'offset')" in body.decode()
    c.register_system_shared_memory(f"seg-{p}", key, x.nbytes)
    try:
        e = _error(c.register_system_shared_memory, f"seg-{p}", key, x.nbytes)
        assert "is already registered" in e.message()

        def infer(region: str, size: int, offset: int = 0, out: tuple | None = None):
            inp = mod.InferInput("input", list(x.shape), "FP32")
            inp.set_shared_memory(region, size, offset=offset)
            outs = None
            if out is not None:
                outs = [mod.InferRequestedOutput("logits")]
                outs[0].set_shared_memory(*out)
            return c.infer("vit-nano", [inp], outputs=outs)

        for call, message in [
            ((f"nope-{p}", x.nbytes), f"names shared-memory region 'nope-{p}', which is not registered"),
            ((f"seg-{p}", x.nbytes, 4), f"needs bytes 4..{x.nbytes + 4} of shared-memory region"),
            ((f"seg-{p}", 16), "has shared_memory_byte_size 16, its shape [1, 3, 32, 32] of FP32 needs"),
            ((f"seg-{p}", x.nbytes, 0, (f"seg-{p}", 8)), "the output needs 40 bytes"),
            ((f"seg-{p}", x.nbytes, 0, (f"seg-{p}", 40, x.nbytes)), "of shared-memory region"),
        ]:
            e = _error(infer, *call)
            assert _bad(e) and message in e.message(), e.message()
        y = infer(f"seg-{p}", x.nbytes)  # the region still works after every refusal
        assert (y.get_output("logits") if p == "http" else y.as_numpy("logits")) is not None
    finally:
        c.unregister_system_shared_memory(f"seg-{p}")
    assert c.is_server_ready()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_segment_shrunk_or_replaced_after_register_is_400_not_a_crash(
    edge_server, regions, protocol
) -> None:
    """Touching a mapping past its segment's end is SIGBUS: a client that truncates its segment after
    registering it would kill the server. The request gets a 400 and the server serves on."""
    c, mod = _client(edge_server, protocol), _mod(protocol)
    x = seeded_inputs((3, 32, 32), 1, seed=5)
    _, key = regions("shrunk", x.nbytes)
    c.register_system_shared_memory(f"shrunk-{protocol}", key, x.nbytes)
    try:
        fd = os.open(f"/dev/shm/{key.lstrip('/')}", os.O_RDWR)
        os.ftruncate(fd, 0)
        os.close(fd)
        inp = mod.InferInput("input", list(x.shape), "FP32")
        inp.set_shared_memory(f"shrunk-{protocol}", x.nbytes)
        e = _error(c.infer, "vit-nano", [inp])
        assert _bad(e) and f"has shrunk to 0 bytes since region 'shrunk-{protocol}'" in e.message(), (
            e.message()
        )
        # the same key made again: the mapping is the old segment's, which the client no longer sees
        os.unlink(f"/dev/shm/{key.lstrip('/')}")
        fd = os.open(f"/dev/shm/{key.lstrip('/')}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, x.nbytes)
        os.close(fd)
        e = _error(c.infer, "vit-nano", [inp])
        assert _bad(e) and "was re-created after region" in e.message(), e.message()
    finally:
        c.unregister_system_shared_memory(f"shrunk-{protocol}")
    assert edge_server.proc.poll() is None and c.is_server_ready()


def test_unregistered_while_in_use(regions) -> None:
    """A request holding a region keeps its mapping; once unregistered, its output is a 400, not a write
    into memory its client gave up; the mapping goes with the last request."""
    from veo_edge.serve.protocol import InferRequest, ProtocolError, RequestedOutput, ShmInput, ShmRef
    from veo_edge.serve.shm import ShmRegistry

    x = seeded_inputs((3, 32, 32), 1, seed=8)
    h, key = regions("seg", x.nbytes)
    shm.set_shared_memory_region(h, [x])
    maps = Path("/proc/self/maps")

    def mappings() -> int:  # this process is the client too: it maps the segment itself
        return maps.read_text().count(f"/dev/shm{key}")

    client_only = mappings()
    registry = ShmRegistry(enabled=True)
    registry.register_system("r", key, 0, x.nbytes)
    ref = ShmRef("r", 0, x.nbytes)
    output = RequestedOutput("logits", True, 0, ShmRef("r", 0, 40))
    request = InferRequest({}, [output], 1, shm_inputs={"input": ShmInput(ref, x.shape, x.dtype)})
    lease = registry.attach(request)
    np.testing.assert_array_equal(request.inputs["input"], x)  # read in place
    registry.unregister("system", "r")
    assert registry.status("system") == []
    with pytest.raises(ProtocolError, match="'r' was unregistered while the request used it") as info:
        lease.write(ShmRef("r", 0, 40), b"\0" * 40)
    assert info.value.status == 400
    assert mappings() == client_only + 1  # still mapped: the request holds it
    del request
    lease.release()
    assert mappings() == client_only
    registry.register_system("again", key, 0, x.nbytes)
    assert mappings() == client_only + 1
    registry.close()  # shutdown unmaps every region; the client's segment stays
    assert mappings() == client_only and Path(f"/dev/shm{key}").exists()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cuda_shared_memory_refused_where_cuda_is_absent(edge_server, protocol) -> None:
    c = _client(edge_server, protocol)
    import base64

    try:
        from cuda.bindings import runtime

        if runtime.cudaGetDeviceCount()[1] > 0:
            pytest.skip("this host has a CUDA device")
    except ImportError:
        pass
    e = _error(c.register_cuda_shared_memory, "gpu", base64.b64encode(bytes(64)), 0, 1024)
    assert e.status() in ("501", "StatusCode.UNIMPLEMENTED")
    assert "CUDA shared memory is not available on this host" in e.message()
    status = c.get_cuda_shared_memory_status()
    assert (status if protocol == "http" else list(status.regions)) == []
    c.unregister_cuda_shared_memory()  # nothing to do, not an error (perf_analyzer cleans up with it)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_off_by_default(nano_server, regions, protocol) -> None:
    c = _client(nano_server, protocol)
    _, key = regions("seg", 64)
    e = _error(c.register_system_shared_memory, "seg", key, 64)
    assert e.status() in ("403", "StatusCode.PERMISSION_DENIED")
    assert "shared memory is off on this server" in e.message()
    meta = c.get_server_metadata()
    extensions = meta["extensions"] if protocol == "http" else meta.extensions
    assert "system_shared_memory" not in extensions
    c.unregister_system_shared_memory()
