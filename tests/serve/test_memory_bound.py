"""The memory bound holds: parallel gzip/deflate bombs, sent with a Content-Length or chunked, are each
refused (413 over the per-request cap, 503 over the cap across connections), and the server's peak RSS
above idle stays within --max-buffered-bytes plus the stated margin per connection
(``veo_edge.serve.bodies.BODY_MARGIN_PER_CONNECTION``). The peak is the kernel's high-water mark
(VmHWM, reset through /proc/PID/clear_refs before each wave), so no sample can miss it."""

from __future__ import annotations

import http.client
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.serve.conftest import EDGE_MAX_BUFFERED, EDGE_MAX_REQUEST
from veo_edge.serve.bodies import BODY_MARGIN_PER_CONNECTION

psutil = pytest.importorskip("psutil")

#: what a bomb inflates to: 8x the per-request cap
INFLATED = 8 * EDGE_MAX_REQUEST
#: the interpreter's own noise around the waves (threads, allocator arenas, response buffers)
FIXED_SLACK = 8 << 20
#: bursts of bombs in the ratchet test, and how much the idle RSS may grow over them
WAVES = 30
RATCHET_SLACK = 20 << 20


def _bomb(encoding: str) -> bytes:
    # level 1: ~290 KiB compressed, above the size old servers inflated inline on the loop (serialized)
    c = zlib.compressobj(1, zlib.DEFLATED, 31 if encoding == "gzip" else 15)
    zeros = bytes(1 << 20)
    return b"".join(c.compress(zeros) for _ in range(INFLATED >> 20)) + c.flush()


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    return {e: _bomb(e) for e in ("gzip", "deflate")}


def _send(port: int, body: bytes, encoding: str, chunked: bool) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Encoding": encoding, "Content-Type": "application/json"}
    try:
        if chunked:
            pieces = (body[i : i + 16384] for i in range(0, len(body), 16384))
            conn.request("POST", "/v2/models/vit-nano/infer", pieces, headers, encode_chunked=True)
        else:
            conn.request("POST", "/v2/models/vit-nano/infer", body, headers)
        return conn.getresponse().status
    except (ConnectionResetError, BrokenPipeError):
        return 0  # refused while still sending: the answer was a close
    finally:
        conn.close()


def _peak_above(pid: int, idle: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 - idle
    raise AssertionError("no VmHWM in /proc/PID/status")


@pytest.mark.parametrize("parallel", [4, 16])
def test_parallel_bombs_stay_within_the_bound(edge_server, bombs, parallel) -> None:
    pid = edge_server.proc.pid
    idle = psutil.Process(pid).memory_info().rss
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak RSS counts from now
    kinds = [(e, chunked) for e in ("gzip", "deflate") for chunked in (False, True)]
    with ThreadPoolExecutor(parallel) as pool:
        statuses = list(
            pool.map(
                lambda i: _send(edge_server.port, bombs[kinds[i % 4][0]], *kinds[i % 4]), range(parallel)
            )
        )
    assert set(statuses) <= {413, 503, 0} and 413 in statuses, statuses
    peak = _peak_above(pid, idle)
    bound = EDGE_MAX_BUFFERED + parallel * BODY_MARGIN_PER_CONNECTION + FIXED_SLACK
    assert peak <= bound, f"peak RSS {peak >> 20} MiB above idle, bound {bound >> 20} MiB"
    status, _, _ = edge_server.request("GET", "/v2/health/ready")
    assert status == 200  # and the server goes on


def _idle_rss(pid: int, at_most: int) -> int:
    """The server's RSS once it is at most ``at_most`` (the heap is trimmed a moment after a burst), or
    what it is after 10 s of waiting."""
    deadline = time.monotonic() + 10
    while True:
        rss = psutil.Process(pid).memory_info().rss
        if rss <= at_most or time.monotonic() > deadline:
            return rss
        time.sleep(0.2)


def test_idle_rss_does_not_ratchet_over_bursts(serve, nano_build, bombs) -> None:
    """Each burst of large bodies left the heap's freed pages with the process (glibc returns only the
    heap's top): idle RSS climbed 29-31 MiB over 30 waves of 16 bombs, Python's objects flat. A moment
    after a burst has ended the server gives them back (``bodies.release_heap``): 12-14 MiB."""
    server = serve(
        nano_build,
        "--max-request-bytes",
        str(EDGE_MAX_REQUEST),
        "--max-buffered-bytes",
        str(EDGE_MAX_BUFFERED),
    )
    kinds = [(e, chunked) for e in ("gzip", "deflate") for chunked in (False, True)]

    def wave() -> None:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: _send(server.port, bombs[kinds[i % 4][0]], *kinds[i % 4]), range(16)))

    start = psutil.Process(server.proc.pid).memory_info().rss
    for _ in range(WAVES):
        wave()
    idle = _idle_rss(server.proc.pid, start + RATCHET_SLACK)
    assert idle <= start + RATCHET_SLACK, f"idle RSS grew {(idle - start) >> 20} MiB over {WAVES} bursts"


#: caps of the JSON test's server: one 15 MiB body at a time fits
JSON_CAP = 16 << 20


def _send_json(port: int, body: bytes, chunked: bool) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        if chunked:
            pieces = (body[i : i + 65536] for i in range(0, len(body), 65536))
            conn.request("POST", "/v2/models/vit-nano/infer", pieces, {}, encode_chunked=True)
        else:
            conn.request("POST", "/v2/models/vit-nano/infer", body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    except (ConnectionResetError, BrokenPipeError):
        return 0, b""  # refused while still sending (503 over the cap across connections)
    finally:
        conn.close()


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
def test_parallel_json_bodies_stay_within_the_bound(serve, nano_build, chunked) -> None:
    """JSON heads over 1 MiB are decoded in a worker process; the server hands it the body where it lies
    (shared pages), so the bound holds for them too. The bodies were pickled to the worker, two copies
    each outside the cap: 4 parallel 15 MiB JSON bodies took a fresh server 48 MiB above idle (bound 32)."""
    server = serve(nano_build, "--max-request-bytes", str(JSON_CAP), "--max-buffered-bytes", str(JSON_CAP))
    numbers = b",".join([b"0.123456"] * ((15 << 20) // 9))  # 1.7 M numbers: the decode makes 1.7 M floats
    body = b'{"inputs":[{"name":"input","datatype":"FP32","shape":[8,3,32,32],"data":[%s]}]}' % numbers
    pid = server.proc.pid
    idle = psutil.Process(pid).memory_info().rss
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: _send_json(server.port, body, chunked), range(4)))
    statuses = [status for status, _ in answers]
    assert set(statuses) <= {400, 503, 0} and 400 in statuses, statuses
    assert all(b"24576" in text for status, text in answers if status == 400), answers  # decoded whole
    peak = _peak_above(pid, idle)
    bound = JSON_CAP + 4 * BODY_MARGIN_PER_CONNECTION + FIXED_SLACK
    assert peak <= bound, f"peak RSS {peak >> 20} MiB above idle, bound {bound >> 20} MiB"


def test_grpc_messages_count_against_the_same_bound(edge_server) -> None:
    """--max-buffered-bytes is across HTTP and gRPC: with two HTTP bodies held part-way (7 MiB each of
    the 16), a 3 MiB ModelInfer is refused UNAVAILABLE, naming the flag; once they go, the same message
    is taken (and, its tensor being the wrong size, answered INVALID_ARGUMENT by the parser). gRPC had no
    bound across calls: 16 parallel 15 MiB messages took the server 376 MiB above idle against 32."""
    import socket
    import time

    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    held = 7 << 20
    socks = []
    for _ in range(2):  # chunked bodies, unfinished: their bytes are counted as they land
        s = socket.create_connection(("127.0.0.1", edge_server.port))
        s.sendall(b"POST /v2/models/vit-nano/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        s.sendall(f"{held:x}\r\n".encode() + bytes(held) + b"\r\n")
        socks.append(s)
    request = service_pb2.ModelInferRequest(model_name="vit-nano")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=[1, 3, 32, 32])
    assert tensor.name == "input"
    request.raw_input_contents.append(bytes(3 << 20))

    def until(stub, done) -> grpc.RpcError:
        deadline = time.monotonic() + 30
        while True:
            try:
                stub.ModelInfer(request, timeout=30)
                error = None
            except grpc.RpcError as e:
                error = e
            if (error is not None and done(error.code())) or time.monotonic() > deadline:
                assert error is not None, "ModelInfer answered a tensor of the wrong size"
                return error
            time.sleep(0.05)

    def refused() -> float:  # the model's count of gRPC requests answered as HTTP's 503
        from prometheus_client.parser import text_string_to_metric_families

        text = edge_server.request("GET", "/metrics")[2].decode()
        return sum(
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "veo_edge_infer_requests_total" and s.labels.get("protocol") == "grpc"
            and s.labels.get("code") == "503"
        )  # fmt: skip

    before = refused()
    with grpc.insecure_channel(edge_server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:  # until the server has read both bodies' bytes
            e = until(stub, lambda code: code == grpc.StatusCode.UNAVAILABLE)
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e.details()
            assert "--max-buffered-bytes" in e.details() and "request bodies" in e.details(), e.details()
            assert refused() >= before + 1  # counted, per protocol, as the HTTP refusals are by route
        finally:
            for s in socks:
                s.close()
        e = until(stub, lambda code: code != grpc.StatusCode.UNAVAILABLE)  # the bodies' bytes given back
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()


def test_the_worker_reads_a_body_where_it_lies_and_never_another_file() -> None:
    """What the decoding worker does with a body in shared pages, here in this process: it parses the
    same request as from the bytes; handed an fd whose inode is not the body's (a reused fd number), it
    refuses to read it (the server then copies the body instead)."""
    import json
    import os
    import tempfile

    import numpy as np

    from veo_edge.serve.decoder import SharedPages, parse_shared, shared_ref
    from veo_edge.serve.protocol import ModelSpec, parse_infer_request

    model = ModelSpec.from_manifest(
        {
            "model": {"name": "vit-nano"},
            "inputs": [{"name": "input", "shape": [-1, 3, 4, 5], "dtype": "float32"}],
            "outputs": [{"name": "logits", "shape": [-1, 10], "dtype": "float32"}],
            "max_batch": 8,
        }
    )
    x = np.random.default_rng(0).random((2, 3, 4, 5), dtype=np.float32)
    data = json.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 3, 4, 5], "data": x.tolist()}]}
    )
    pages = np.frombuffer(SharedPages.create(1 << 20), np.uint8)
    pages[: len(data)] = np.frombuffer(data.encode(), np.uint8)
    body = pages[: len(data)]
    fd, inode, size = shared_ref(body)
    assert size == len(data) and shared_ref(data.encode()) is None
    parsed = parse_shared(os.getpid(), fd, inode, size, None, model)
    assert np.array_equal(
        parsed.inputs["input"], parse_infer_request(data.encode(), None, model).inputs["input"]
    )
    assert np.array_equal(parsed.inputs["input"], x)
    with tempfile.TemporaryFile() as other, pytest.raises(OSError, match="is no longer the request body"):
        parse_shared(os.getpid(), other.fileno(), inode, size, None, model)
