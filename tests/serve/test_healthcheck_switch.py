"""The healthcheck reads the canary's rule, then asks for the answer: a server that switches backends in
between (an f32 standby's tight rule read, the answer from the int8 backend that took traffic back)
failed the check falsely. On a mismatch it looks again; if the backend or its precision changed, it
reads the rule again; either way it asks again, up to ASKS times (an answer from a transient fault's
retry on a standby of another precision is right by that one's rule). The server here is a small KServe v2 stand-in whose backend
switches at a chosen moment (a real server's switch cannot be timed between two requests); the
healthcheck, the thing under test, is the real one."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from veo_edge.serve.health import ASKS, CanaryMismatchError, check_server

#: the rule each precision publishes; the answer (1.1 where 1.0 is expected) meets int8's only
RULES = {"f32": 1e-5, "int8": 0.5}


def _server(switch_after_infers: int | None, right_from: int | None = None):
    """A stand-in serving model "m" on f32 (onnxruntime) that moves to int8 (openvino) once it has
    answered ``switch_after_infers`` infers (None: never); from infer ``right_from`` on (None: never) its
    answer is f32's (as when an answer came from another precision's standby before)."""
    state = {"infers": 0}

    def precision() -> str:
        moved = switch_after_infers is not None and state["infers"] >= switch_after_infers
        return "int8" if moved else "f32"

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _json(self, obj) -> None:
            body = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            p = precision()
            backend = {"f32": "onnxruntime", "int8": "openvino"}[p]
            if self.path == "/v2/models/m":
                params = {"backend": backend, "precision": p}
                self._json({"name": "m", "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 4]}],
                            "parameters": params})  # fmt: skip
            elif self.path == "/v2/models/m/canary":
                tensor = {"shape": [1, 4], "data": [1.0, 0.0, 0.0, 0.0]}
                self._json({"input": tensor, "expected": tensor, "atol": RULES[p], "min_cosine": 0.9})
            else:  # live, ready (naming the model), the model's ready
                self._json({"model": "m", "ready": True})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            state["infers"] += 1
            first = 1.0 if right_from is not None and state["infers"] >= right_from else 1.1
            # the answer of the backend serving after this call: int8's once the switch is due
            self._json(
                {"outputs": [{"name": "out", "datatype": "FP32", "shape": [1, 4], "data": [first, 0, 0, 0]}]}
            )

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, state


def test_a_switch_between_the_rule_and_the_answer_is_read_again() -> None:
    server, state = _server(switch_after_infers=1)
    try:
        report = check_server(f"http://127.0.0.1:{server.server_address[1]}", timeout=10)
    finally:
        server.shutdown()
    assert report["healthy"] and report["precision"] == "int8" and report["backend"] == "openvino"
    assert state["infers"] == 2  # the first answer against f32's rule, the second against int8's


def test_a_wrong_answer_without_a_switch_is_still_a_mismatch() -> None:
    server, state = _server(switch_after_infers=None)
    try:
        with pytest.raises(CanaryMismatchError, match=r"model 'm' at http://127\.0\.0\.1"):
            check_server(f"http://127.0.0.1:{server.server_address[1]}", timeout=10)
    finally:
        server.shutdown()
    assert state["infers"] == ASKS  # asked again, and wrong every time


def test_an_answer_from_a_retry_on_another_precision_is_asked_again() -> None:
    """A transient fault's batch re-run on a standby of another precision answers by that precision's
    rule: the first answer misses the served rule, the next (on the served backend) meets it."""
    server, state = _server(switch_after_infers=None, right_from=2)
    try:
        report = check_server(f"http://127.0.0.1:{server.server_address[1]}", timeout=10)
    finally:
        server.shutdown()
    assert report["healthy"] and report["precision"] == "f32" and state["infers"] == 2
