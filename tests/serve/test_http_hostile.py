"""HTTP/1.1 under hostile input, through raw sockets against a real server: smuggling attempts (each a
400 and a closed connection, never two requests out of one), chunked bodies, HEAD on a kept-alive
connection, head limits and the read deadline, a global cap on buffered bodies, bounded metric labels,
and an event loop that keeps answering probes while large JSON requests are decoded."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import struct
import threading
import time

import numpy as np
import pytest

from veo_edge.serve.protocol import decode_infer_response, encode_infer_request

INFER = "/v2/models/vit-nano/infer"
SMUGGLED = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"


def _exchange(port: int, data: bytes, timeout: float = 10.0) -> tuple[bytes, bool]:
    """Send ``data`` (without half-closing); (everything received, whether the server closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            return out, False
        return out, True


def _read_response(s: socket.socket, data: bytes = b"") -> bytes:
    """One whole response (head and Content-Length body) from a blocking socket; ``data``: what was
    already received of it (the result then holds only the rest)."""
    already = len(data)
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(re.search(rb"content-length: (\d+)", head, re.IGNORECASE).group(1))
    while len(body) < length and (chunk := s.recv(65536)):
        body += chunk
    return (head + b"\r\n\r\n" + body)[already:]


def _x(batch: int = 1) -> np.ndarray:
    return np.random.default_rng(3).standard_normal((batch, 3, 32, 32)).astype(np.float32)


# (id, raw request, who rejects it: "llhttp" = the parser uvicorn runs, "guard" = our protocol subclass)
SMUGGLING = [
    (
        "two different Content-Length",
        b"POST /v2 HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 50\r\n\r\nhello",
        "llhttp",
    ),
    (
        "two equal Content-Length",
        b"POST /v2 HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        "llhttp",
    ),
    ("Content-Length +50", b"POST /v2 HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello", "llhttp"),
    ("Content-Length 4_8", b"POST /v2 HTTP/1.1\r\nContent-Length: 0_5\r\n\r\nhello", "llhttp"),
    ("Content-Length list", b"POST /v2 HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nhello", "llhttp"),
    (
        "Content-Length with chunked",
        b"POST /v2 HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "llhttp",
    ),
    (
        "Transfer-Encoding xchunked",
        b"POST /v2 HTTP/1.1\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
        "llhttp",
    ),
    ("bare LF in request line", b"GET /v2 HTTP/1.1\nHost: x\r\n\r\n", "llhttp"),
    ("bare LF in a header", b"GET /v2 HTTP/1.1\r\nHost: x\nX-A: b\r\n\r\n", "llhttp"),
    ("bare LF line ends", b"GET /v2 HTTP/1.1\nHost: x\n\n", "llhttp"),
    ("bare CR in request line", b"GET /v2\r HTTP/1.1\r\nHost: x\r\n\r\n", "llhttp"),
    ("bare CR in a header", b"GET /v2 HTTP/1.1\r\nHost: x\rX-A: b\r\n\r\n", "llhttp"),
    ("obs-fold header", b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n", "llhttp"),
    ("space before colon", b"GET /v2 HTTP/1.1\r\nHost : x\r\n\r\n", "llhttp"),
    ("HTTP/1.x", b"GET /v2 HTTP/1.x\r\nHost: x\r\n\r\n", "llhttp"),
    ("HTTP/1.10", b"GET /v2 HTTP/1.10\r\nHost: x\r\n\r\n", "llhttp"),
    ("lowercase http/1.1", b"GET /v2 http/1.1\r\nHost: x\r\n\r\n", "llhttp"),
    ("HTTP/2.0 in an HTTP/1 line", b"GET /v2 HTTP/2.0\r\nHost: x\r\n\r\n", "guard"),
    ("HTTP/0.9 version", b"GET /v2 HTTP/0.9\r\n\r\n", "guard"),
    (
        "bad chunk size",
        b"POST /v2 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5x\r\nhello\r\n0\r\n\r\n",
        "llhttp",
    ),
]


@pytest.mark.parametrize(("data", "by"), [c[1:] for c in SMUGGLING], ids=[c[0] for c in SMUGGLING])
def test_smuggling_is_400_and_closed(nano_server, data, by):
    resp, closed = _exchange(nano_server.port, data + SMUGGLED)
    assert resp.startswith(b"HTTP/1.1 400 "), resp[:300]
    assert closed, "the connection must be closed after a malformed request"
    statuses = re.findall(rb"(?:^|\r\n)HTTP/1\.1 \d{3} ", resp)
    assert len(statuses) == 1, f"a second request was parsed out of one ({by}): {resp!r}"
    body = json.loads(resp.split(b"\r\n\r\n", 1)[1])
    assert body["error"]


def test_head_on_a_kept_alive_connection(nano_server):
    resp, _ = _exchange(
        nano_server.port,
        b"HEAD /v2 HTTP/1.1\r\nHost: x\r\n\r\nGET /v2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    head, rest = resp.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 ")
    length = int(re.search(rb"content-length: (\d+)", head).group(1))
    assert length > 0  # the length GET would have, and no body after it
    assert rest.startswith(b"HTTP/1.1 200 "), rest[:100]
    _, second_body = rest.split(b"\r\n\r\n", 1)
    assert json.loads(second_body)["name"] == "veo-edge"
    assert len(second_body) == length


def _data_segments_in(s: socket.socket) -> int:
    """TCP segments with data this socket has received (Linux's tcp_info.tcpi_data_segs_in)."""
    return struct.unpack_from("I", s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256), 152)[0]


def test_a_response_is_one_send(nano_server):
    """Head and body leave in one send (serve.transport.OneSend): each answer reaches the client as one
    TCP segment, HEAD's too. Two sends (uvicorn's way) wake the client twice and read 40 here."""
    with socket.create_connection(("127.0.0.1", nano_server.port), timeout=10) as s:
        before = _data_segments_in(s)
        for method in ["GET"] * 19 + ["HEAD"]:
            s.sendall(f"{method} /v2/models/vit-nano HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            head = _read_response(s) if method == "GET" else s.recv(65536)
            assert head.startswith(b"HTTP/1.1 200 "), head[:200]
        assert _data_segments_in(s) - before == 20


def _chunks(data: bytes, size: int):
    for i in range(0, len(data), size):
        yield data[i : i + size]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_chunked_request_bodies(nano_server, binary):
    x = _x(2)
    body, hlen = encode_infer_request({"input": x}, binary=binary)
    headers = {"Inference-Header-Content-Length": str(hlen)} if hlen else {}
    answers = []
    for chunked in (False, True):
        conn = http.client.HTTPConnection("127.0.0.1", nano_server.port, timeout=30)
        try:
            if chunked:
                conn.request("POST", INFER, body=_chunks(body, 1000), headers=headers, encode_chunked=True)
            else:
                conn.request("POST", INFER, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            assert resp.status == 200, data
            answers.append(decode_infer_response(data, resp.getheader("Inference-Header-Content-Length")))
        finally:
            conn.close()
    plain, chunked = answers
    np.testing.assert_array_equal(plain["logits"], chunked["logits"])


def test_chunked_body_over_the_limit_is_413(serve, nano_build):
    server = serve(nano_build, "--max-request-bytes", "65536")
    head = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    chunk = b"%x\r\n" % 8192 + b"a" * 8192 + b"\r\n"
    resp, closed = _exchange(server.port, head + chunk * 10)
    assert resp.startswith(b"HTTP/1.1 413 "), resp[:200]
    assert b"chunked request body exceeds 65536 bytes" in resp
    assert closed


def test_head_limits_are_431(nano_server):
    many = b"".join(b"X-%d: y\r\n" % i for i in range(150))
    resp, closed = _exchange(nano_server.port, b"GET /v2 HTTP/1.1\r\n" + many + b"\r\n")
    assert resp.startswith(b"HTTP/1.1 431 ") and b"more than 100 header lines" in resp
    assert closed
    # a head still arriving is cut off at the limit (uvicorn alone would buffer it whole)
    with socket.create_connection(("127.0.0.1", nano_server.port), timeout=10) as s:
        s.sendall(b"GET /v2 HTTP/1.1\r\nX-Long: ")
        try:
            for _ in range(200):
                s.sendall(b"a" * 8192)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed while we were still sending
        resp = s.recv(65536)
    assert resp.startswith(b"HTTP/1.1 431 "), resp[:200]


def test_slow_client_gets_408(serve, nano_build):
    server = serve(nano_build, "--read-timeout", "1")
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n")  # ... and the rest never comes
        resp = b""
        while chunk := s.recv(65536):
            resp += chunk
    assert resp.startswith(b"HTTP/1.1 408 "), resp
    assert b"did not arrive within 1 s" in resp
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{{".encode())
        resp = b""
        while chunk := s.recv(65536):
            resp += chunk
    assert resp.startswith(b"HTTP/1.1 408 "), resp
    assert server.request("GET", "/v2/health/live")[0] == 200


def _metric(server, name: str) -> float:
    _, _, body = server.request("GET", "/metrics")
    m = re.search(rf"^{re.escape(name)} (\S+)$", body.decode(), re.MULTILINE)
    assert m, name
    return float(m.group(1))


def test_global_cap_on_buffered_bodies(serve, nano_build):
    """Twelve clients that send most of an 8 MB body and stall: the server holds at most the global cap;
    bodies only announced (a Content-Length, no bytes) hold nothing of it."""
    mb = 1 << 20
    server = serve(nano_build, "--max-request-bytes", str(8 * mb), "--max-buffered-bytes", str(16 * mb))
    before = _metric(server, "process_resident_memory_bytes")
    x = _x(1)
    body, hlen = encode_infer_request({"input": x})
    infer_headers = {"Inference-Header-Content-Length": str(hlen)}
    stalled, rejected = [], 0
    try:
        for _ in range(6):  # announce 8 MB each, send none of it
            s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            s.sendall(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {8 * mb}\r\n\r\n".encode())
            stalled.append(s)
        assert server.request("POST", INFER, body, infer_headers)[0] == 200
        for _ in range(12):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            s.sendall(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {8 * mb}\r\n\r\n".encode())
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                s.sendall(b"\0" * (7 * mb))
            s.settimeout(0.5)
            try:
                answer = s.recv(65536)
            except TimeoutError:
                answer = b""
            except ConnectionResetError:  # refused and closed while we were still sending: a reset
                rejected += 1
                s.close()
                continue
            if answer:
                s.settimeout(30)
                with contextlib.suppress(ConnectionResetError):
                    answer += _read_response(s, answer)
                assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
                assert b"--max-buffered-bytes" in answer
                rejected += 1
                s.close()
            else:
                stalled.append(s)
        assert len(stalled) <= 6 + 2 and rejected >= 10, (len(stalled), rejected)
        grown = _metric(server, "process_resident_memory_bytes") - before
        assert grown < 12 * 7 * mb / 2, f"RSS grew by {grown / mb:.0f} MiB with the bodies capped at 16 MiB"
        # two stalled uploads hold 14 of the 16 MiB: a small request still fits, a large one does not
        assert server.request("POST", INFER, body, infer_headers)[0] == 200
        answer = _expect_continue(server.port, 4 * mb)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"--max-buffered-bytes" in answer, answer[:300]
    finally:
        for s in stalled:
            s.close()
    deadline = time.monotonic() + 30
    while True:  # their budget comes back once they are gone
        answer = _expect_continue(server.port, 4 * mb)
        if not answer.startswith(b"HTTP/1.1 503 ") or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert answer.startswith(b"HTTP/1.1 100 Continue"), answer[:300]


def _expect_continue(port: int, size: int) -> bytes:
    """Announce a ``size``-byte body with ``Expect: 100-continue``; the server's first answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(
            f"POST {INFER} HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: {size}\r\n\r\n".encode()
        )
        first = s.recv(65536)
        if first.startswith(b"HTTP/1.1 100 "):
            return first
        return first + _read_response(s, first)


def test_metrics_label_routes_not_paths(nano_server):
    rng = np.random.default_rng(5)
    paths = [f"/v2/x{rng.integers(1 << 40):x}/{i}" for i in range(300)]
    paths += [f"/v2/models/m{i}/infer" for i in range(50)]  # unknown models still label as the route
    for p in paths:
        status, _, _ = nano_server.request("GET", p)
        assert status in (404, 405)
    _, _, body = nano_server.request("GET", "/metrics")
    text = body.decode()
    routes = set(
        re.findall(r'^veo_edge_http_responses_total\{code="\d+",route="([^"]+)"\}', text, re.MULTILINE)
    )
    from veo_edge.serve.http import ROUTES

    assert routes <= {r[0] for r in ROUTES} | {"unknown", "protocol"}, routes
    assert "unknown" in routes
    assert not any(p.split("/")[2] in text for p in paths[:300])


def test_large_json_does_not_block_the_event_loop(nano_server):
    """Two 25 MB JSON requests: the liveness probe is answered while both are still being decoded.

    The requests are rejected right after decoding (a wrong shape), so a server that decodes on its
    event loop has written at least one 400 before it can answer the probe."""
    x = _x(1)
    head = {
        "inputs": [
            {"name": "input", "datatype": "FP32", "shape": [1, 3, 32, 33], "data": x.ravel().tolist()}
        ],
        "parameters": {"pad": [[0.5, [1, 2]]] * 1_700_000},  # nested: slow to decode on any machine
    }
    body = json.dumps(head).encode()
    assert len(body) > 25_000_000
    socks = [socket.create_connection(("127.0.0.1", nano_server.port), timeout=120) for _ in range(2)]
    request = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    senders = [threading.Thread(target=s.sendall, args=(request,)) for s in socks]
    for t in senders:
        t.start()
    for t in senders:
        t.join(120)
    time.sleep(0.3)  # let the server take in the last bytes of both bodies (an ordering test, not a timing)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", nano_server.port, timeout=120)
        conn.request("GET", "/v2/health/live")
        assert conn.getresponse().status == 200
        conn.close()
        pending = []
        for s in socks:
            s.setblocking(False)
            try:
                pending.append(not s.recv(1, socket.MSG_PEEK))
            except BlockingIOError:
                pending.append(True)
        assert all(pending), "the liveness probe waited until a large JSON request was decoded"
        for s in socks:
            s.setblocking(True)
            s.settimeout(120)
            answer = _read_response(s)
            assert answer.startswith(b"HTTP/1.1 400 ") and b"has shape [1, 3, 32, 33]" in answer, answer[:300]
    finally:
        for s in socks:
            s.close()


def test_concurrent_clients_and_a_dead_one(nano_server):
    """A client that dies mid-body frees its budget; others are answered meanwhile."""
    s = socket.create_connection(("127.0.0.1", nano_server.port), timeout=10)
    s.sendall(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n".encode() + b"{" * 5000)
    results = []

    def one():
        results.append(nano_server.request("GET", "/v2/health/ready")[0])

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    s.close()
    assert results == [200] * 4
