"""With no backend active, ``GET /v2/models/NAME/canary`` is 503 with a one-line reason, as infer is: no
rule is served and nothing would answer the canary (it published the build's own rule with ``backend:
null``). ``veo-edge healthcheck --url`` takes that 503 as not ready (exit 21), not as a canary mismatch
(22): a server whose backend went between its ready answer and the canary is not ready."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.serve.test_canary_switch import broken_int8
from veo_edge.serve.health import EXIT_CODES, NotReadyError, check_server


def test_the_canary_of_a_model_with_no_backend_is_503(serve, digits_int8_build, copy_build):
    build = broken_int8(copy_build(digits_int8_build))
    server = serve(build, "--policy", "openvino", wait_ready=False)
    assert server.get_json("/v2/health/ready")[1]["active_backend"] is None
    for accept in ("application/json", "application/octet-stream"):
        status, _, body = server.request("GET", "/v2/models/vit-digits/canary", headers={"Accept": accept})
        assert status == 503, body
        error = json.loads(body)["error"]
        assert error.startswith("no backend is active for model 'vit-digits', so no canary rule is served")
        assert "\n" not in error
    assert server.get_json("/v2/models/vit-digits")[1]["parameters"]["backend"] == "none"


def test_the_healthcheck_takes_a_canary_503_as_not_ready() -> None:
    """A KServe stand-in that says ready, then has no backend when the canary is asked for (a real
    server's loss of its backend cannot be timed between two requests); the healthcheck is the real one."""
    reason = "no backend is active for model 'm', so no canary rule is served"

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            status, obj = 200, {"model": "m", "ready": True}
            if self.path == "/v2/models/m":
                obj = {"name": "m", "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 4]}],
                       "parameters": {"backend": "openvino", "precision": "f32"}}  # fmt: skip
            elif self.path == "/v2/models/m/canary":
                status, obj = 503, {"error": reason}
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(
            NotReadyError, match=f"model 'm' is not ready at {url} \\(HTTP 503\\): {reason}"
        ) as e:
            check_server(url, timeout=10)
    finally:
        server.shutdown()
    assert e.value.exit_code == EXIT_CODES["not ready"]
