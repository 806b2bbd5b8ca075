"""Fault schedules under concurrent load through a real ``veo-edge serve`` (backend auto; on this CPU host:
openvino, then onnxruntime as the warm standby): transient faults, then openvino gone for good, then
every backend gone. No request gets an error while some backend works, readiness says what is true in
each phase, and /metrics (the HTTP port and --metrics-port alike) counts every fault, retry and switch,
and the requests of each protocol."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from veo_edge.serve.protocol import encode_infer_request

grpcclient = pytest.importorskip("tritonclient.grpc")

INFER = "/v2/models/vit-nano/infer"
# openvino: every 7th call fails (transient) until its 60th, then every call (gone for good, also after
# a recovery re-activates it); onnxruntime (its warm-up, the retries, then the traffic) dies after 40
FAULTS = {"openvino": [{"every_nth": 7}, {"dead_after": 60}], "onnxruntime": {"dead_after": 40}}


def _metrics(text: str) -> dict[tuple[str, frozenset], float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k not in ("model", "version")}
            out[(s.name, frozenset(labels.items()))] = s.value
    return out


def _get(m: dict, name: str, **labels) -> float:
    return m.get((name, frozenset(labels.items())), 0.0)


def _round(server, n: int = 8, c: int = 4) -> list[int]:
    """``n`` single-sample requests from ``c`` threads at once; their HTTP statuses."""
    x = np.random.default_rng(len(server.log.name)).standard_normal((1, 3, 32, 32)).astype(np.float32)
    body, hlen = encode_infer_request({"input": x})
    headers = {"Inference-Header-Content-Length": str(hlen)}
    with ThreadPoolExecutor(c) as pool:
        return list(pool.map(lambda _: server.request("POST", INFER, body, headers)[0], range(n)))


@pytest.mark.slow
def test_fault_schedules_lose_nothing_while_a_backend_works_and_readiness_tells_the_truth(serve, nano_build):
    server = serve(nano_build, env={"VEO_EDGE_FAULTS": json.dumps(FAULTS)})

    def scrape(port: int | None = None) -> dict:
        if port is None:
            return _metrics(server.request("GET", "/metrics")[2].decode())
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            return _metrics(r.read().decode())

    def ready() -> int:
        return server.request("GET", "/v2/health/ready")[0]

    m = scrape()
    assert _get(m, "veo_edge_active_backend", backend="openvino") == 1
    assert _get(m, "veo_edge_standby_backend", backend="onnxruntime") == 1

    # phase 1: transient faults on openvino, each batch re-run on the standby; nothing moves
    statuses = []
    for _ in range(5):
        statuses += _round(server)
        assert ready() == 200
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        x = np.zeros((1, 3, 32, 32), np.float32)
        for _ in range(3):
            inp = grpcclient.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            assert client.infer("vit-nano", [inp]).as_numpy("logits").shape == (1, 10)
    finally:
        client.close()
    m = scrape()
    faults = _get(m, "veo_edge_backend_faults_total", backend="openvino", kind="oom")
    assert statuses == [200] * 40 and faults >= 1
    assert _get(m, "veo_edge_retries_total", backend="onnxruntime", outcome="ok") == faults
    assert _get(m, "veo_edge_fallback_switches_total") == 0
    assert _get(m, "veo_edge_infer_requests_total", protocol="http", code="200") == 40
    assert _get(m, "veo_edge_infer_requests_total", protocol="grpc", code="200") == 3
    counted = ("veo_edge_backend_faults", "veo_edge_retries", "veo_edge_fallback", "veo_edge_infer_requests")
    same = {k: v for k, v in m.items() if k[0].startswith(counted)}
    assert {k: v for k, v in scrape(server.metrics_port).items() if k in same} == same  # --metrics-port

    # phase 2: openvino gone for good: its batches are re-run on onnxruntime until traffic moves there
    statuses = []
    while _get(scrape(), "veo_edge_fallback_switches_total") == 0:
        assert len(statuses) < 200, "openvino was never switched away from"
        statuses += _round(server)
    assert set(statuses) == {200}
    assert ready() == 200  # the standby passed the canary at its warm-up: readiness stays up
    m = scrape()
    assert _get(m, "veo_edge_active_backend", backend="onnxruntime") == 1
    assert _get(m, "veo_edge_backend_faults_total", backend="openvino", kind="oom") >= faults + 3
    assert _get(m, "veo_edge_ready") == 1

    # phase 3: onnxruntime dies too: requests fail, readiness drops and stays down, liveness stays up
    statuses = []
    while 500 not in statuses:
        assert len(statuses) < 200, "onnxruntime never failed"
        statuses += _round(server)
    first_error = statuses.index(500)
    assert set(statuses[:first_error]) == {200}, "an error came while onnxruntime still worked"
    deadline = time.monotonic() + 3.0  # three re-check intervals: recovery finds openvino dead too
    while time.monotonic() < deadline:
        assert ready() == 503
        assert server.request("GET", "/v2/health/live")[0] == 200
        time.sleep(0.25)
    m = scrape()
    assert _get(m, "veo_edge_backend_faults_total", backend="onnxruntime", kind="oom") >= 1
    assert _get(m, "veo_edge_ready") == 0
    assert _get(m, "veo_edge_infer_requests_total", protocol="http", code="500") == statuses.count(500)
    # what the log says: the drill itself, and the failures each at most once per 10 s, with a count
    # (every failed batch was a line: 3,500 in 6 s in a walkthrough)
    log = server.log.read_text()
    assert "fault injection is on" in log
    assert 1 <= log.count("a batch failed on every backend") <= 2, log
    assert 1 <= log.count("backend openvino failed a batch") <= 3, log
    # the re-checks skip the same backends for the same reasons: one entry each, counted
    body = server.request("GET", "/v2/health/ready")[2]
    skipped = json.loads(body)["fallback"]["skipped"]
    pairs = [(s["backend"], s["reason"]) for s in skipped]
    assert len(pairs) == len(set(pairs)) and any(s.get("times", 1) > 1 for s in skipped), skipped
