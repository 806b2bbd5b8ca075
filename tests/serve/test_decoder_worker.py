"""The JSON decoding worker (JSON heads over 1 MiB) is replaced when it dies: killed with SIGKILL (as an
OOM killer does), every later large JSON request used to get 500 ``BrokenProcessPool``, each with a
traceback, until the server restarted, while /v2/health/ready stayed 200. Now the first request to find
it dead starts a new worker, says so in one WARNING line, and is decoded there. An infer request that
ends without the service counting it (its client gone before the answer: 499) still counts in
``veo_edge_infer_requests_total`` and ``nv_inference_request_failure``."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np
import pytest

psutil = pytest.importorskip("psutil")

INFER = "/v2/models/vit-nano/infer"
JSON = {"Content-Type": "application/json"}


def _workers(server) -> list:
    children = psutil.Process(server.proc.pid).children(recursive=True)
    return [c for c in children if "spawn_main" in " ".join(c.cmdline())]


def _json_body(pad: int) -> bytes:
    """An infer request for one picture, its JSON padded with ``pad`` spaces (over 1 MiB: the worker)."""
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    tensor = {"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": x.ravel().tolist()}
    small = json.dumps({"inputs": [tensor]}).encode()
    return small[:-1] + b" " * pad + small[-1:]


def _samples(server, name: str) -> dict[tuple, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(server.request("GET", "/metrics")[2].decode()):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def _infer_counts(server) -> dict[str, float]:
    """code -> veo_edge_infer_requests_total of vit-nano over HTTP."""
    counts = _samples(server, "veo_edge_infer_requests_total")
    return {
        dict(k)["code"]: v
        for k, v in counts.items()
        if ("protocol", "http") in k and ("model", "vit-nano") in k
    }


def _failures(server) -> dict[str, float]:
    """reason -> nv_inference_request_failure of vit-nano."""
    counts = _samples(server, "nv_inference_request_failure")
    return {dict(k)["reason"]: v for k, v in counts.items() if ("model", "vit-nano") in k and v}


def test_a_killed_worker_is_replaced_and_large_json_requests_still_work(serve, nano_build: Path):
    server = serve(nano_build)
    small, large = _json_body(0), _json_body(1_100_000)
    status, _, want = server.request("POST", INFER, small, JSON)
    assert status == 200
    status, _, got = server.request("POST", INFER, large, JSON)  # decoded by the worker
    assert (status, got) == (200, want)

    (dead,) = _workers(server)
    dead.kill()
    dead.wait(30)
    for _ in range(3):  # the first finds the worker dead and starts a new one; the rest use it
        status, _, got = server.request("POST", INFER, large, JSON)
        assert (status, json.loads(got)) == (200, json.loads(want))

    (worker,) = _workers(server)
    assert worker.pid != dead.pid
    log = server.log.read_text()
    died = [line for line in log.splitlines() if "the JSON decoding worker died" in line]
    assert len(died) == 1 and "WARNING" in died[0] and "started a new one" in died[0], log
    assert "Traceback" not in log and "BrokenProcessPool" not in log.replace(died[0], ""), log
    assert server.get_json("/v2/health/ready")[0] == 200
    assert _infer_counts(server) == {"200": 5}


def test_a_client_gone_before_its_answer_counts_as_499(serve, nano_build: Path):
    server = serve(nano_build)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        head = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
        sock.sendall(head.encode() + b'{"inputs": [')  # then leaves, the body unfinished
    for _ in range(200):  # until the server has seen it go (the route's count shows it first)
        responses = _samples(server, "veo_edge_http_responses_total")
        if responses.get((("code", "499"), ("route", "model_infer")), 0):
            break
        server.request("GET", "/v2/health/live")
    assert _infer_counts(server) == {"499": 1}
    assert _failures(server) == {"CANCELED": 1}
