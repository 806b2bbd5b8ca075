"""A full queue answers 503 with a JSON body that says so; the server recovers once the load is gone."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from veo_edge.serve.protocol import encode_infer_request


def test_overload_is_503_then_recovers(serve, nano_build):
    server = serve(
        nano_build, "--max-queue", "1", env={"VEO_EDGE_FAULTS": json.dumps({"*": {"slow_ms": 50}})}
    )
    x = np.zeros((4, 3, 32, 32), np.float32)  # 4 samples > a queue of 1
    body, hlen = encode_infer_request({"input": x})
    headers = {"Inference-Header-Content-Length": str(hlen)}
    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(lambda _: server.request("POST", "/v2/models/vit-nano/infer", body, headers), range(8))
        )
    statuses = [a[0] for a in answers]
    assert set(statuses) <= {200, 503} and 503 in statuses
    error = json.loads(next(a[2] for a in answers if a[0] == 503))["error"]
    assert error.startswith("overloaded:")
    one, hlen1 = encode_infer_request({"input": x[:1]})
    assert (
        server.request(
            "POST", "/v2/models/vit-nano/infer", one, {"Inference-Header-Content-Length": str(hlen1)}
        )[0]
        == 200
    )
    assert server.request("GET", "/v2/health/ready")[0] == 200


def test_an_infer_past_the_timeout_is_504_and_the_next_one_is_answered(serve, nano_build):
    """Each batch runs 1.5 s (slow_ms) against a 0.3 s --infer-timeout: the request is answered 504 with
    the reason once the timeout passes; with the timeout raised the same request is answered."""
    slow = {"VEO_EDGE_FAULTS": json.dumps({"*": {"slow_ms": 1500}})}
    x = np.zeros((1, 3, 32, 32), np.float32)
    body, hlen = encode_infer_request({"input": x})
    headers = {"Inference-Header-Content-Length": str(hlen)}
    server = serve(nano_build, "--infer-timeout", "0.3", env=slow)
    status, _, payload = server.request("POST", "/v2/models/vit-nano/infer", body, headers)
    assert status == 504, payload
    assert json.loads(payload)["error"] == "inference did not finish within 0.3 s"
    patient = serve(nano_build, "--infer-timeout", "30", env=slow)
    status, _, payload = patient.request("POST", "/v2/models/vit-nano/infer", body, headers)
    assert status == 200, payload
