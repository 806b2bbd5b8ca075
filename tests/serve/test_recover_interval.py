"""``serve --recover-interval``: a standby whose warm-up failed when the server started is warmed again
on the recovery clock, beside the traffic; ``off`` (any case) leaves it skipped; a bad value is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from veo_edge.serve.protocol import encode_infer_request

# on this CPU host auto serves openvino with onnxruntime as its standby; the standby's warm-up (its first
# call, after openvino's activation: well past 1 ms on the fault clock) fails once
FAULTS = {"onnxruntime": {"once_at_s": 0.001}}


def samples(server, name: str) -> dict[str, float]:
    """``backend`` label -> value of the samples called ``name`` on /metrics."""
    text = server.request("GET", "/metrics")[2].decode()
    return {
        s.labels["backend"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def standby(server) -> list[str]:
    return [b for b, v in samples(server, "veo_edge_standby_backend").items() if v == 1]


def test_a_standby_that_failed_its_warm_up_at_start_is_warmed_again(serve, nano_build) -> None:
    env = {"VEO_EDGE_FAULTS": json.dumps(FAULTS)}
    on = serve(nano_build, "--recover-interval", "0.5s", env=env)
    off = serve(nano_build, "--recover-interval", "OFF", env=env)  # any case
    deadline = time.monotonic() + 30
    while standby(on) != ["onnxruntime"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert standby(on) == ["onnxruntime"]
    assert standby(off) == []  # the same failed warm-up, no recovery clock: no standby
    for server in (on, off):
        assert server.request("GET", "/v2/health/ready")[0] == 200
        assert samples(server, "veo_edge_backend_faults_total") == {"onnxruntime": 1.0}


def test_a_standby_skipped_again_and_again_is_one_entry(serve, nano_build) -> None:
    """onnxruntime fails every call: each re-check (on the 0.5 s recovery clock) skips it again, each time with a reason
    that names its moment. The ready body keeps one entry for it, counted, with the latest reason."""
    faults = {"onnxruntime": {"after_s": 0}, "openvino": {"every_nth": 7}}
    server = serve(nano_build, "--recover-interval", "0.5s", env={"VEO_EDGE_FAULTS": json.dumps(faults)})
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    body, hlen = encode_infer_request({"input": x})
    headers = {"Inference-Header-Content-Length": str(hlen)}
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:  # traffic: openvino's every 7th call fails, no standby takes it
        server.request("POST", "/v2/models/vit-nano/infer", body, headers)
    status, ready = server.get_json("/v2/health/ready")
    assert status == 200, ready
    skipped = [s for s in ready["fallback"]["skipped"] if s["backend"] == "onnxruntime"]
    assert len(skipped) == 1 and skipped[0]["times"] >= 2, ready["fallback"]["skipped"]
    assert "injected fault on call 1 (after_s=0 at " in skipped[0]["reason"]  # the latest one


def test_a_bad_recover_interval_is_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "veo_edge.cli.main", "serve", "build", "--recover-interval", "soon"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--recover-interval 'soon' is not a duration" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
