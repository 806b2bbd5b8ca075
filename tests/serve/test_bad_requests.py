"""Bad requests against a live server: each gets a 4xx with a JSON error naming the problem, and the
server stays live, ready and correct afterwards (including after a hypothesis fuzz over HTTP)."""

from __future__ import annotations

import gzip
import json
import socket

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from veo_edge.serve.protocol import encode_infer_request

INFER = "/v2/models/vit-nano/infer"


def _good(batch: int = 1, binary: bool = True) -> tuple[bytes, dict]:
    x = np.random.default_rng(0).standard_normal((batch, 3, 32, 32)).astype(np.float32)
    body, hlen = encode_infer_request({"input": x}, binary=binary)
    return body, ({"Inference-Header-Content-Length": str(hlen)} if hlen else {})


def _json(item_overrides: dict) -> bytes:
    item = {"name": "input", "datatype": "FP32", "shape": [1, 3, 32, 32], "data": [0.0] * 3072}
    item.update(item_overrides)
    return json.dumps({"inputs": [item]}).encode()


_body, _headers = _good()
BAD_HTTP = [
    ("POST", INFER, b"{oops", {}, 400, "not valid JSON"),
    ("POST", INFER, b"", {}, 400, "not valid JSON"),
    ("POST", INFER, b'"just a string"', {}, 400, "the request must be a JSON object"),
    ("POST", INFER, _json({"name": "image"}), {}, 400, "unknown input 'image'"),
    ("POST", INFER, _json({"shape": [1, 3, 32, 33]}), {}, 400, r"has shape \[1, 3, 32, 33\]"),
    ("POST", INFER, _json({"shape": [9, 3, 32, 32]}), {}, 400, "has batch 9, expected 1..8"),
    ("POST", INFER, _json({"datatype": "INT64"}), {}, 400, "has datatype 'INT64', expected FP32"),
    ("POST", INFER, _json({"datatype": "BYTES"}), {}, 400, "has datatype 'BYTES', expected FP32"),
    ("POST", INFER, _json({"data": [0.0] * 3071}), {}, 400, "has 3071 elements"),
    ("POST", INFER, _json({"data": [float("nan")] + [0.0] * 3071}), {}, 400, "holds NaN or infinite"),
    (
        "POST",
        INFER,
        _json({"data": [1e308] * 3072}).replace(b"1e+308", b"1e999", 1),
        {},
        400,
        "NaN or infinite",
    ),
    ("POST", INFER, _body[:-10], _headers, 400, "binary data is truncated"),
    ("POST", INFER, _body, {"Inference-Header-Content-Length": "99999999"}, 400, "but the body has"),
    ("POST", INFER, _body, {"Inference-Header-Content-Length": "abc"}, 400, "is not an integer"),
    ("POST", INFER, _body, {"Content-Encoding": "br"}, 415, "Content-Encoding 'br' is not supported"),
    ("POST", INFER, b"not gzip", {"Content-Encoding": "gzip"}, 400, "gzip request body is corrupt"),
    ("POST", INFER, gzip.compress(b" " * (80 << 20)), {"Content-Encoding": "gzip"}, 413, "decompressed"),
    ("POST", "/v2/models/vit-tiny/infer", _body, _headers, 404, "unknown model 'vit-tiny'"),
    ("POST", "/v2/models/vit-nano/versions/7/infer", _body, _headers, 404, "has no version '7'"),
    ("GET", INFER, None, {}, 405, "use POST for /infer"),
    ("POST", "/v2/health/ready", b"", {}, 405, "use GET"),
    ("GET", "/v3/anything", None, {}, 404, "no route for GET /v3/anything"),
    ("GET", "/v2/models/vit-nano/bogus", None, {}, 404, "no route"),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status", "match"),
    BAD_HTTP,
    ids=[f"{c[4]}-{c[5][:30]}" for c in BAD_HTTP],
)
def test_bad_request(nano_server, method, path, body, headers, status, match):
    got, resp_headers, resp = nano_server.request(method, path, body, headers)
    assert got == status, resp
    assert resp_headers["content-type"] == "application/json"
    assert json.loads(resp)["error"]
    import re

    assert re.search(match, json.loads(resp)["error"]), resp


def _raw(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


BAD_RAW = [
    (b"GARBAGE\r\n\r\n", b"400", b"malformed HTTP/1.1 request"),
    (b"GET /v2 HTTP/1.1\r\nno colon here\r\n\r\n", b"400", b"malformed HTTP/1.1 request"),
    (b"GET /v2 HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", b"431", b"request head exceeds"),
    (
        b"POST /v2/models/vit-nano/infer HTTP/1.1\r\nContent-Length: 999999999999\r\n\r\n",
        b"413",
        b"the limit is",
    ),
    (b"POST /v2/models/vit-nano/infer HTTP/1.1\r\nContent-Length: -5\r\n\r\n", b"400", b"Content-Length"),
    (b"POST /v2/models/vit-nano/infer HTTP/1.1\r\nContent-Length: x\r\n\r\n", b"400", b"Content-Length"),
]


@pytest.mark.parametrize(("data", "status", "match"), BAD_RAW, ids=[m.decode()[:30] for _, _, m in BAD_RAW])
def test_bad_http(nano_server, data, status, match):
    resp = _raw(nano_server.port, data)
    assert resp.startswith(b"HTTP/1.1 " + status), resp[:200]
    assert match in resp


def test_client_hanging_up_mid_body_and_slow_clients(nano_server):
    """A client that sends half a body and leaves, and one that opens and says nothing, harm nobody."""
    with socket.create_connection(("127.0.0.1", nano_server.port), timeout=5) as s:
        s.sendall(b"POST /v2/models/vit-nano/infer HTTP/1.1\r\nContent-Length: 1000\r\n\r\n" + b"{" * 10)
    idle = socket.create_connection(("127.0.0.1", nano_server.port), timeout=5)
    try:
        assert nano_server.request("GET", "/v2/health/live")[0] == 200
    finally:
        idle.close()


def test_keep_alive_and_pipelining(nano_server):
    body, headers = _good()
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    one = (f"POST {INFER} HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {len(body)}\r\n\r\n").encode() + body
    resp = _raw(nano_server.port, one * 3 + b"GET /v2/health/live HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert resp.count(b"HTTP/1.1 200 OK") == 4


@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    body=st.binary(max_size=400),
    hlen=st.one_of(st.none(), st.integers(-2, 500).map(str), st.text(max_size=4)),
)
def test_fuzz_over_http(nano_server, body, hlen):
    headers = (
        {}
        if hlen is None
        else {"Inference-Header-Content-Length": hlen.encode("utf-8", "replace").decode("latin-1")}
    )
    status, _, resp = nano_server.request("POST", INFER, body, headers)
    assert 400 <= status < 500, resp


def test_still_healthy_and_correct_after_abuse(nano_server):
    assert nano_server.request("GET", "/v2/health/live")[0] == 200
    status, ready = nano_server.get_json("/v2/health/ready")
    assert status == 200, ready
    body, headers = _good(batch=8)
    status, resp_headers, _ = nano_server.request("POST", INFER, body, headers)
    assert status == 200
    assert "inference-header-content-length" in resp_headers
