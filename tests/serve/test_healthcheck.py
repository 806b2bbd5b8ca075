"""``veo-edge healthcheck``: exit 0 when healthy; a distinct non-zero code and a one-line reason for a
server that is down, not ready, serving the wrong model or a corrupt golden output, or too slow."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.serve.conftest import QUIET_PORTS
from tests.support.net import free_port
from veo_edge.serve.health import EXIT_CODES
from veo_edge.serve.protocol import decode_infer_response


def _healthcheck(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "veo_edge.cli.main", "healthcheck", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _probe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The image's HEALTHCHECK entry (what healthcheck/healthcheck.sh runs inside a veo-edge image)."""
    return subprocess.run(
        [sys.executable, "-m", "veo_edge.serve.probe", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def _url(server) -> str:
    return f"http://{server.url}"


def _corrupt_golden(build: Path) -> Path:
    expected = build / "canary" / "expected.npy"
    y = np.load(expected)
    np.save(expected, y + 1.0)
    return build


def test_healthy_server(nano_server, nano_build):
    r = _healthcheck("--url", _url(nano_server), "--timeout", "20")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("healthy: http://127.0.0.1:")
    r = _healthcheck("--url", _url(nano_server), "--build-dir", str(nano_build), "--json")
    assert r.returncode == 0, r.stderr
    assert '"healthy": true' in r.stdout
    r = _healthcheck("--url", _url(nano_server) + "/v2")  # the API's own path, given by habit
    assert r.returncode == 0, r.stderr


def test_the_image_probe_checks_as_the_command_line_does(nano_server, nano_build, copy_build):
    url = _url(nano_server)
    cli, probe = _healthcheck("--url", url), _probe("--url", url)
    assert cli.returncode == probe.returncode == 0, (cli.stderr, probe.stderr)
    assert probe.stdout == cli.stdout and probe.stdout.startswith(f"healthy: {url} (canary max abs")
    # the golden canary from VEO_EDGE_BUILD_DIR, as the command line reads it; a modified one is refused
    assert _probe("--url", url, env={"VEO_EDGE_BUILD_DIR": str(nano_build)}).returncode == 0
    r = _probe("--url", url, env={"VEO_EDGE_BUILD_DIR": str(_corrupt_golden(copy_build(nano_build)))})
    assert r.returncode == EXIT_CODES["build modified"], r.stderr
    assert r.stderr.startswith("error: ") and "canary/expected.npy has sha256" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = _probe("--url", url, "--model-name", "vit-tiny")
    assert r.returncode == EXIT_CODES["not ready"] and "unknown model 'vit-tiny'" in r.stderr, r.stderr
    r = _probe("--url", f"http://127.0.0.1:{free_port()}", "--timeout", "5")
    assert r.returncode == EXIT_CODES["down"] and "no server answers at" in r.stderr, r.stderr
    for bad in (["--timeout", "0"], ["--timeout", "nan"], ["--no-such-option"]):
        r = _probe("--url", url, *bad)
        assert r.returncode == 2 and r.stderr.strip() and not r.stdout, (bad, r.stderr)
    # what makes it the probe: none of the command line's framework is imported
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "veo_edge.serve.probe", "--url", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")
    }
    assert "veo_edge.serve.health" in imported
    assert not imported & {"typer", "click", "rich", "pydantic"}, sorted(
        imported & {"typer", "click", "rich", "pydantic"}
    )


def test_the_canary_endpoint_answers_json_or_the_binary_form(nano_server, nano_build):
    """The probe asks for the binary form (0.6 MB instead of ~3 MB of JSON text for a 224x224 input);
    both carry the same tensors and rule, and a client that does not ask gets JSON as before."""
    host, port = nano_server.url.rsplit(":", 1)

    def get(headers: dict[str, str]) -> tuple[dict[str, str], bytes]:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            conn.request("GET", "/v2/models/vit-nano/canary", headers=headers)
            resp = conn.getresponse()
            assert resp.status == 200
            return {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    head, body = get({})
    assert (
        head["content-type"].startswith("application/json") and "inference-header-content-length" not in head
    )
    doc = json.loads(body)
    head, blob = get({"Accept": "application/octet-stream"})
    assert head["content-type"] == "application/octet-stream"
    hlen = int(head["inference-header-content-length"])
    arrays = decode_infer_response(blob, hlen)
    rule = {k: doc[k] for k in ("atol", "min_cosine", "backend", "precision")}
    assert json.loads(blob[:hlen])["parameters"] == rule and doc["precision"] == "f32"
    for name in ("input", "expected"):
        assert arrays[name].dtype == np.float32 and list(arrays[name].shape) == doc[name]["shape"]
        np.testing.assert_array_equal(arrays[name].ravel(), np.asarray(doc[name]["data"], dtype=np.float32))
    assert len(blob) == hlen + 4 * (arrays["input"].size + arrays["expected"].size) < len(body)


def test_local_mode(nano_build):
    r = _healthcheck("--build-dir", str(nano_build), "--timeout", "60")
    assert r.returncode == 0, r.stderr
    assert "healthy:" in r.stdout


def test_golden_file_corrupted_locally(nano_server, nano_build, copy_build):
    """The probe's own golden output is corrupt: its checksum no longer matches the manifest."""
    bad = _corrupt_golden(copy_build(nano_build))
    r = _healthcheck("--url", _url(nano_server), "--build-dir", str(bad))
    assert r.returncode == EXIT_CODES["build modified"] == 30, r.stderr
    assert "was modified after it was built: canary/expected.npy has sha256" in r.stderr
    r = _healthcheck("--build-dir", str(bad))
    assert r.returncode == EXIT_CODES["build modified"], r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_server_with_corrupted_golden_refuses_to_start(nano_build, copy_build, tmp_path):
    """A golden output that no longer matches the manifest is refused at start, not a 503 later."""
    bad = _corrupt_golden(copy_build(nano_build))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "veo_edge.cli.main",
            "serve",
            str(bad),
            "--port",
            "0",
            *QUIET_PORTS,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 30, r.stderr
    assert "canary/expected.npy has sha256" in r.stderr and "the manifest records" in r.stderr
    assert "serving" not in r.stderr


def test_wrong_model(video_nano_build, nano_build, nano_server, serve):
    # asked for a model the server does not serve
    r = _healthcheck("--url", _url(nano_server), "--model-name", "vit-tiny")
    assert r.returncode == EXIT_CODES["not ready"], r.stderr
    assert "unknown model 'vit-tiny'" in r.stderr
    # a different model served under the expected name: it is not the build given, whose golden canary
    # does not even fit it (before the server named its build, the inference said so: HTTP 400)
    server = serve(video_nano_build, "--model-name", "vit-nano")
    r = _healthcheck("--url", _url(server), "--build-dir", str(nano_build))
    assert r.returncode == EXIT_CODES["canary mismatch"], r.stderr
    assert f"--build-dir {nano_build} is not the build the server at {_url(server)} serves" in r.stderr


def test_server_down():
    start = time.monotonic()
    r = _healthcheck("--url", f"http://127.0.0.1:{free_port()}", "--timeout", "5")
    assert r.returncode == EXIT_CODES["down"], r.stderr
    assert "no server answers at" in r.stderr
    assert time.monotonic() - start < 30  # generous: bounds a hang, not a speed


def test_timeout_on_a_server_that_never_answers():
    with socket.socket() as s:  # listens (the kernel completes handshakes) but never reads or replies
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        r = _healthcheck("--url", f"http://127.0.0.1:{s.getsockname()[1]}", "--timeout", "1")
    assert r.returncode == EXIT_CODES["timeout"], r.stderr
    assert "timed out" in r.stderr or "did not finish within 1 s" in r.stderr


def test_usage_errors():
    r = _healthcheck("--timeout", "0")
    assert r.returncode == 2 and "--timeout 0.0 must be positive" in r.stderr
    r = _healthcheck("--url", "https://127.0.0.1:8000")
    assert r.returncode == 2 and "speaks plain HTTP (serve has no TLS): use http://" in r.stderr
    r = _healthcheck("--url", "grpc://127.0.0.1:8001")
    assert r.returncode == 2 and "the healthcheck speaks HTTP: give the server's HTTP port" in r.stderr


def test_a_port_that_is_not_kserve_http_is_named_as_such():
    """Pointed at a gRPC port (HTTP/2 answers an HTTP/1.1 request with bytes http.client cannot read) or
    at an HTTP server that is not KServe v2 (a Prometheus endpoint answers every path): one line that
    says so, exit 20 ("down"), no raw bytes and no internal error."""
    import threading
    from concurrent import futures
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))  # grpcio, no service
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        r = _healthcheck("--url", f"http://127.0.0.1:{port}", "--timeout", "10")
    finally:
        server.stop(None)
    assert r.returncode == EXIT_CODES["down"], r.stderr
    assert "but not in HTTP/1.1 (a gRPC port answers in HTTP/2)" in r.stderr and "\\x00" not in r.stderr

    class Metrics(BaseHTTPRequestHandler):  # as prometheus_client's server: the metrics on any path
        def do_GET(self) -> None:
            body = b"# HELP up 1\nup 1\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    http_server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=http_server.serve_forever, daemon=True).start()
    try:
        r = _healthcheck("--url", f"http://127.0.0.1:{http_server.server_port}", "--timeout", "10")
    finally:
        http_server.shutdown()
        http_server.server_close()
    assert r.returncode == EXIT_CODES["down"], r.stderr
    assert "answers, but not as a KServe v2 server (GET /v2/health/ready gave no JSON" in r.stderr
    assert "internal error" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("script", ["healthcheck/healthcheck.sh"])
def test_docker_wrapper_maps_failures_to_1(script):
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run(
        ["sh", str(root / script)],
        env={
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "VEO_EDGE_HEALTH_URL": f"http://127.0.0.1:{free_port()}",
            "VEO_EDGE_HEALTH_TIMEOUT": "3",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1, r.stderr
    assert "unhealthy" in r.stdout + r.stderr
