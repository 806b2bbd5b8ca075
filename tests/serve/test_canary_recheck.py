"""The server's own canary, beyond the start: run once more before a wrong answer costs a backend its
traffic (a first wrong answer that is right the second time keeps it); a later re-check's wrong answer
(after a request failed on every backend) moves traffic off the backend; and a wrong answer given by the
standby in place of an active backend that failed the canary's batch is the standby's: the standby is
dropped and named, the active backend keeps its traffic (it was blamed, and traffic moved to the standby
that had answered wrongly).

Wrong answers are real runners' answers made wrong by the fault configuration (``"error": "wrong"``:
the real output plus 1 in every value), on the calls the configuration names: with ``--policy
openvino,onnxruntime`` openvino's call 1 is the start canary (the first backend is not warm-checked) and
onnxruntime's call 1 its warm-up as the standby."""

from __future__ import annotations

import json
import os
import time

import numpy as np

from tests.serve.conftest import serve_to_exit
from veo_edge.serve.protocol import encode_infer_request

INFER = "/v2/models/vit-nano/infer"
POLICY = ("--policy", "openvino,onnxruntime")


def _serve(serve, build, faults: dict, **kw):
    return serve(build, *POLICY, env={"VEO_EDGE_FAULTS": json.dumps(faults)}, **kw)


def _infer(server) -> int:
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    body, hlen = encode_infer_request({"input": x})
    return server.request("POST", INFER, body, {"Inference-Header-Content-Length": str(hlen)})[0]


def _wait_ready_on(server, backend: str, timeout: float = 60.0) -> dict:
    """Poll readiness (each poll wakes the re-checker) until it is 200 on ``backend``; a bound on a hang."""
    deadline = time.monotonic() + timeout
    while True:
        status, ready = server.get_json("/v2/health/ready")
        if (status == 200 and ready["active_backend"] == backend) or time.monotonic() > deadline:
            assert status == 200 and ready["active_backend"] == backend, ready
            return ready
        time.sleep(0.1)


def test_a_first_wrong_canary_answer_that_is_right_again_keeps_the_traffic(serve, nano_build):
    faults = {"openvino": {"oom_after": 0, "recover_after": 1, "error": "wrong"}}  # call 1 only
    server = _serve(serve, nano_build, faults)
    status, ready = server.get_json("/v2/health/ready")
    assert status == 200 and ready["active_backend"] == "openvino", ready
    assert ready["fallback"] == {"count": 0, "switches": [], "skipped": []}, ready
    assert ready["canary"]["ok"] is True and ready["standby_backend"] == "onnxruntime"
    assert _infer(server) == 200
    log = server.log.read_text()
    first = log.index(" WARNING not ready: canary failed on openvino: canary max abs error")
    assert log.index("canary matched on openvino: ready") > first
    assert "traffic moved" not in log


def test_a_later_recheck_whose_canary_is_wrong_moves_traffic_off_the_backend(serve, nano_build):
    faults = {
        # call 1: the start canary, right; 2 and 3 (a request, and its last retry) raise; then wrong
        "openvino": [
            {"oom_after": 1, "recover_after": 3, "error": "backend"},
            {"oom_after": 3, "error": "wrong"},
        ],
        "onnxruntime": {"oom_after": 1, "recover_after": 2, "error": "backend"},  # the request's retry
    }
    server = _serve(serve, nano_build, faults)
    status, ready = server.get_json("/v2/health/ready")
    assert status == 200 and ready["active_backend"] == "openvino" and ready["fallback"]["count"] == 0
    assert _infer(server) == 500  # failed on every backend: readiness re-checks, and the canary is wrong
    ready = _wait_ready_on(server, "onnxruntime")
    (switch,) = ready["fallback"]["switches"]
    assert (switch["from"], switch["to"]) == ("openvino", "onnxruntime"), switch
    assert switch["reason"].startswith("canary mismatch: canary max abs error"), switch
    assert ready["canary"]["ok"] is True
    assert _infer(server) == 200
    log = server.log.read_text()
    assert " WARNING not ready: canary failed on openvino: canary max abs error" in log
    assert "backend openvino failed (canary mismatch: canary max abs error" in log


def test_a_standby_answering_wrongly_for_a_failed_active_backend_is_the_one_dropped(serve, nano_build):
    faults = {
        "openvino": {"oom_after": 0, "recover_after": 2, "error": "backend"},  # the canary's batch, twice
        "onnxruntime": {"oom_after": 1, "error": "wrong"},  # right at its warm-up, wrong after
    }
    server = _serve(serve, nano_build, faults)
    status, ready = server.get_json("/v2/health/ready")
    assert status == 200 and ready["active_backend"] == "openvino", ready
    assert ready["fallback"]["switches"] == [] and ready["fallback"]["count"] == 0, ready
    assert ready["standby_backend"] is None, ready  # dropped, and not warmed again before its backoff
    (skipped,) = ready["fallback"]["skipped"]  # the drop and why, as any skipped backend's
    assert skipped["backend"] == "onnxruntime", skipped
    assert skipped["reason"].startswith(
        "standby dropped: it answered the canary wrongly (canary mismatch: canary max abs error"
    ), skipped
    assert ready["canary"]["ok"] is True
    assert _infer(server) == 200
    metrics = server.request("GET", "/metrics")[2].decode()
    wrong = 'veo_edge_backend_faults_total{backend="onnxruntime",kind="wrong_answer",model="vit-nano",version="1"} 1.0'
    assert wrong in metrics.splitlines(), metrics
    log = server.log.read_text()
    assert (
        " WARNING not ready: canary failed on onnxruntime: canary max abs error" in log
        and "it answered in place of openvino, which failed the batch: it is dropped as a standby" in log
    ), log
    assert " WARNING standby onnxruntime dropped: it answered the canary wrongly (canary mismatch:" in log
    assert "canary failed on openvino" not in log and "backend openvino failed (canary" not in log


def test_a_wrong_answer_spec_that_names_no_call_is_refused_in_one_line(nano_build):
    """``{"error": "wrong"}`` alone names no call to make wrong: it was accepted and injected nothing."""
    env = {**os.environ, "VEO_EDGE_FAULTS": json.dumps({"openvino": {"error": "wrong"}})}
    r = serve_to_exit(nano_build, *POLICY, env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "error: fault option error='wrong' for 'openvino' names no call to fail; add a rule that does "
        "(oom_after, dead_after, every_nth, every_s, after_s, once_at_s), e.g. "
        '{"openvino": {"every_nth": 3, "error": "wrong"}}'
    ], r.stderr
