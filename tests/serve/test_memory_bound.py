"""The memory bound holds: parallel gzip/deflate bombs, sent with a Content-Length or chunked, are each
refused (413 over the per-request cap, 503 over the cap across connections), and the server's peak RSS
above idle stays within --max-buffered-bytes plus the stated margin per connection
(``veo_edge.serve.bodies.BODY_MARGIN_PER_CONNECTION``). The peak is the kernel's high-water mark
(VmHWM, reset through /proc/PID/clear_refs before each wave), so no sample can miss it."""

from __future__ import annotations

import http.client
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
