"""``serve --recover-interval``: a standby whose warm-up failed when the server started is warmed again
on the recovery clock, beside the traffic; ``off`` (any case) leaves it skipped; a bad value is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from prometheus_client.parser import text_string_to_metric_families

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
