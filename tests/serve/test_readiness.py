"""Readiness tells the truth: it drops when no backend works and comes back when one recovers; with
``--policy`` a CPU host falls back from one CPU backend to another and stays ready; a standby whose
package crashes the process at import is skipped, and the server serves on; a GPU backend asked for on a
host without a GPU falls back to the CPU chain with a warning, or with --no-fallback is a one-line error."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from tests.serve.conftest import serve_to_exit
from veo_edge.runtime.fallback import SWITCH_AFTER
from veo_edge.serve.protocol import encode_infer_request

INFER = "/v2/models/vit-nano/infer"


def _infer(server):
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    body, hlen = encode_infer_request({"input": x})
    return server.request("POST", INFER, body, {"Inference-Header-Content-Length": str(hlen)})


@pytest.fixture
def cpu_only() -> None:
    from veo_edge.runtime.probes import probe_gpu

    if probe_gpu().ok:
        pytest.skip("an NVIDIA GPU is visible; these tests pin a CPU-only machine's fallback")


def _wait_ready(server, want: int, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status, body = server.get_json("/v2/health/ready")
        if status == want or time.monotonic() > deadline:
            assert status == want, body
            return body
        time.sleep(0.1)


def test_readiness_drops_on_a_failing_backend_and_comes_back(serve, nano_build):
    # call 1 (the start-up canary) works, calls 2..6 fail, then the backend heals
    faults = {"openvino": {"oom_after": 1, "recover_after": 6}}
    server = serve(nano_build, "--policy", "openvino", env={"VEO_EDGE_FAULTS": json.dumps(faults)})
    status, _, body = _infer(server)
    assert status == 500 and "injected fault" in json.loads(body)["error"]
    status, ready = server.get_json("/v2/health/ready")
    assert status == 503 and ready["ready"] is False
    assert "a request failed on the backend" in ready["reason"] or "canary failed" in ready["reason"]
    assert server.request("GET", "/v2/models/vit-nano/ready")[0] == 503
    assert server.request("GET", "/v2/health/live")[0] == 200  # alive, just not ready
    ready = _wait_ready(server, 200)  # the re-checks reach the healed calls
    assert ready["canary"]["ok"] is True
    assert _infer(server)[0] == 200


def test_no_working_backend_is_not_ready(serve, nano_build):
    faults = {"*": {"oom_after": 0}}
    server = serve(
        nano_build,
        "--policy",
        "openvino,onnxruntime",
        env={"VEO_EDGE_FAULTS": json.dumps(faults)},
        wait_ready=False,
    )
    status, ready = server.get_json("/v2/health/ready")
    assert status == 503 and ready["ready"] is False
    assert "no backend is active" in ready["reason"] or "canary failed" in ready["reason"]
    status, _, body = _infer(server)
    assert status in (500, 503), body


def test_policy_falls_back_between_cpu_backends(serve, nano_build):
    """openvino fails every call after the start-up canary: each request is re-run on onnxruntime (the
    warm standby) and answered; after SWITCH_AFTER failures in a row traffic moves there, and readiness
    never drops (onnxruntime passed the canary at its warm-up)."""
    faults = {"openvino": {"oom_after": 1}}
    server = serve(
        nano_build, "--policy", "openvino,onnxruntime", env={"VEO_EDGE_FAULTS": json.dumps(faults)}
    )
    ready = server.get_json("/v2/health/ready")[1]
    assert (ready["active_backend"], ready["standby_backend"]) == ("openvino", "onnxruntime")
    for _ in range(SWITCH_AFTER):
        assert _infer(server)[0] == 200
        status, ready = server.get_json("/v2/health/ready")
        assert status == 200, ready
    assert ready["active_backend"] == "onnxruntime" and ready["canary"]["ok"] is True
    assert ready["standby_backend"] is None  # nothing after onnxruntime in this policy
    assert ready["fallback"]["switches"][0]["from"] == "openvino"


def test_a_standby_whose_import_crashes_is_skipped_and_the_server_serves(serve, nano_build, tmp_path):
    """An ``onnxruntime`` whose import dies of SIGSEGV (as ONNX Runtime does on aarch64 under QEMU) first
    on the path: the child import takes the crash, onnxruntime is skipped with the reason, and OpenVINO
    serves, ready, with no standby. Without the child check the server itself died at its standby."""
    shadow = tmp_path / "crashing" / "onnxruntime"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("import ctypes\nctypes.string_at(0)  # a real SIGSEGV\n")
    server = serve(nano_build, env={"PYTHONPATH": str(shadow.parent), "PYTHONFAULTHANDLER": ""})
    status, ready = server.get_json("/v2/health/ready")
    assert status == 200 and ready["active_backend"] == "openvino", ready
    assert ready["standby_backend"] is None
    skipped = {s["backend"]: s["reason"] for s in ready["fallback"]["skipped"]}
    assert "killed a child process with SIGSEGV" in skipped["onnxruntime"], ready
    assert _infer(server)[0] == 200
    assert server.proc.poll() is None


def test_a_forced_gpu_backend_falls_back_to_the_cpu_chain_with_a_warning(serve, nano_build, cpu_only):
    server = serve(nano_build, "--backend", "tensorrt")
    status, ready = server.get_json("/v2/health/ready")
    assert status == 200 and (ready["active_backend"], ready["standby_backend"]) == (
        "openvino",
        "onnxruntime",
    )
    assert _infer(server)[0] == 200
    warning = next(line for line in server.log.read_text().splitlines() if "fell back" in line)
    assert " WARNING model 'vit-nano': backend openvino (fell back from --backend tensorrt;" in warning
    assert "skipped tensorrt: no usable NVIDIA GPU" in warning


def test_a_forced_gpu_backend_with_no_fallback_is_one_line_and_exit_8(nano_build, cpu_only):
    import subprocess
    import sys

    argv = [sys.executable, "-m", "veo_edge.cli.main", "serve", str(nano_build), "--port", "0"]
    r = subprocess.run(
        [*argv, "--grpc-port", "-1", "--metrics-port", "-1", "-b", "tensorrt", "--no-fallback"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 8, r.stderr
    error = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "(tried tensorrt): tensorrt: no usable NVIDIA GPU" in error[0]
    assert "Fallback is off (--no-fallback)" in error[0] and "Traceback" not in r.stderr


def test_bad_policy_is_a_usage_error(nano_build):
    import contextlib
    import socket
    import subprocess
    import sys

    # said before any port is bound: even with the default metrics port taken, the policy is what is wrong
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(OSError):  # taken already, by someone else: the same case
            stack.enter_context(socket.create_server(("127.0.0.1", 8002)))
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "veo_edge.cli.main",
                "serve",
                str(nano_build),
                "--policy",
                "openvino,bogus",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert r.returncode == 2, r.stderr
    assert "unknown backend 'bogus'" in r.stderr and "metrics" not in r.stderr


def test_a_malformed_fault_schedule_is_one_line_with_no_warning_before_it(nano_build):
    """It was the 'fault injection is on' warning, then the error: two lines where one was promised."""
    import os

    r = serve_to_exit(nano_build, env={**os.environ, "VEO_EDGE_FAULTS": "{bad"})
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        line for line in r.stderr.splitlines() if line.startswith("error: VEO_EDGE_FAULTS is not valid JSON")
    ], r.stderr
