"""A server over an int8 build says which precision it computes at (metadata, config, /metrics), and its
healthcheck applies the canary tolerance of that precision: the int8 one the build recorded, or, once
the build falls back to ONNX Runtime f32, the f32 one; a --build-dir that is not the served build is
refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def test_an_int8_build_is_served_at_int8_and_says_so(digits_int8_build: Path, serve) -> None:
    server = serve(digits_int8_build)
    status, meta = server.get_json("/v2/models/vit-digits")
    assert status == 200 and meta["parameters"]["precision"] == "int8"
    status, config = server.get_json("/v2/models/vit-digits/config")
    assert status == 200 and config["parameters"]["precision"] == {"string_value": "int8"}
    _, _, metrics = server.request("GET", "/metrics")
    line = 'veo_edge_active_precision{backend="openvino",model="vit-digits",precision="int8",version="1"} 1.0'
    assert line in metrics.decode()
    r = subprocess.run(
        [sys.executable, "-m", "veo_edge.cli.main", "healthcheck", "--url", f"http://{server.url}", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert '"healthy": true' in r.stdout


F32_FALLBACK = {"VEO_EDGE_FAULTS": json.dumps({"openvino": {"fail_at_start": True}})}


@pytest.fixture(scope="module")
def fell_back(serve_module, digits_int8_build: Path):
    """The int8 build served by ONNX Runtime f32: OpenVINO (its int8 backend) refused at start."""
    return serve_module(digits_int8_build, "--policy", "openvino,onnxruntime", env=F32_FALLBACK)


def _healthcheck(*args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "veo_edge.cli.main", "healthcheck", "--json", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_an_int8_build_served_at_f32_publishes_and_is_checked_by_the_f32_rule(fell_back, digits_int8_build):
    f32 = json.loads((digits_int8_build / "manifest.json").read_text())["canary"]
    status, meta = fell_back.get_json("/v2/models/vit-digits")
    assert status == 200 and meta["parameters"]["precision"] == "f32", meta
    status, canary = fell_back.get_json("/v2/models/vit-digits/canary")
    assert status == 200, canary
    assert (canary["atol"], canary["min_cosine"]) == (f32["atol"], f32["min_cosine"])  # not int8's
    assert (canary["backend"], canary["precision"]) == ("onnxruntime", "f32")
    status, headers, body = fell_back.request(
        "GET", "/v2/models/vit-digits/canary", headers={"Accept": "application/octet-stream"}
    )
    head = json.loads(body[: int(headers["inference-header-content-length"])])
    assert head["parameters"]["atol"] == f32["atol"] and head["parameters"]["precision"] == "f32"
    # the probe applies it, with or without the build directory
    for args in ((), ("--build-dir", str(digits_int8_build))):
        r = _healthcheck("--url", f"http://{fell_back.url}", *args)
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert report["canary"]["atol"] == f32["atol"] and report["precision"] == "f32", report


def test_healthcheck_refuses_a_build_dir_the_server_does_not_serve(fell_back, digits_int8_build, copy_build):
    """Another build of the same model (here its int8 rule made loose) is not the served one: its rule
    would judge the server by a build it does not run."""
    other = copy_build(digits_int8_build)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["canary"]["precisions"]["int8"]["atol"] = 10.0
    manifest["canary"]["atol"] = 10.0
    (other / "manifest.json").write_text(json.dumps(manifest, indent=2))
    r = _healthcheck("--url", f"http://{fell_back.url}", "--build-dir", str(other))
    assert r.returncode == 22, (r.stdout, r.stderr)  # canary mismatch: not the served build's
    assert f"--build-dir {other} is not the build the server at http://{fell_back.url} serves" in r.stderr
    assert "give the server's own build directory, or leave --build-dir out" in r.stderr
