"""A first backend that fails its golden canary at start loses its traffic: to a standby that passes its
own canary (a switch, counted, with the reason), or, with none, to nobody: inference is refused (503)
rather than answered by a backend known to be wrong, and readiness stays 503.

The broken backend is a real one: an int8 build whose OpenVINO weights are a fifth zeroed, the manifest
re-hashed so that only the canary can notice (the ONNX that ONNX Runtime runs is untouched)."""

from __future__ import annotations

import hashlib
import json
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from veo_edge.serve.protocol import decode_infer_response, encode_infer_request

INFER = "/v2/models/vit-digits/infer"


def broken_int8(build: Path) -> Path:
    """Zero the int8 weight constants of ``build``'s OpenVINO IR until a fifth of its .bin is zeros (the
    first fifth of the file holds shape constants: zeroing those fails the load instead), and record the
    new sha256 in the manifest, as a build broken before it was hashed would be."""
    xml, blob = build / "openvino" / "model.int8.xml", build / "openvino" / "model.int8.bin"
    data = bytearray(blob.read_bytes())
    zeroed = 0
    for layer in ET.parse(xml).iter("layer"):
        d = layer.find("data")
        if layer.get("type") == "Const" and d is not None and d.get("element_type") == "i8":
            offset, size = int(d.get("offset")), int(d.get("size"))
            data[offset : offset + size] = bytes(size)
            zeroed += size
            if zeroed * 5 >= len(data):
                break
    assert zeroed * 5 >= len(data), "the IR holds too few int8 weights to zero a fifth of it"
    blob.write_bytes(data)
    manifest = json.loads((build / "manifest.json").read_text())
    manifest["artifacts"]["openvino_int8_bin"]["sha256"] = hashlib.sha256(data).hexdigest()
    (build / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return build


def _infer(server, x: np.ndarray):
    body, hlen = encode_infer_request({"input": x})
    status, headers, resp = server.request(
        "POST", INFER, body, {"Inference-Header-Content-Length": str(hlen)}
    )
    return status, headers, resp


def test_a_backend_failing_its_canary_hands_traffic_to_a_standby_that_passes(
    serve, digits_int8_build, copy_build
):
    build = broken_int8(copy_build(digits_int8_build))
    server = serve(build, "--policy", "openvino,onnxruntime")
    status, ready = server.get_json("/v2/health/ready")
    assert status == 200 and ready["active_backend"] == "onnxruntime", ready
    assert ready["canary"]["ok"] is True and ready["canary"]["atol"] < 1e-3  # the f32 rule
    (switch,) = ready["fallback"]["switches"]
    assert (switch["from"], switch["to"]) == ("openvino", "onnxruntime")
    assert switch["reason"].startswith("canary mismatch: canary max abs error"), switch
    assert ready["fallback"]["count"] == 1
    _, _, metrics = server.request("GET", "/metrics")
    assert 'veo_edge_fallback_switches_total{model="vit-digits",version="1"} 1.0' in metrics.decode()
    # answered by the backend that passed: the golden output within the f32 rule
    x = np.load(build / "canary" / "input.npy")
    status, headers, resp = _infer(server, x)
    assert status == 200, resp
    out = next(iter(decode_infer_response(resp, headers.get("inference-header-content-length")).values()))
    expected = np.load(build / "canary" / "expected.npy")
    assert np.abs(out - expected).max() <= ready["canary"]["atol"]
    log = server.log.read_text()
    assert " WARNING not ready: canary failed on openvino: canary max abs error" in log  # handled
    assert " WARNING model 'vit-digits': backend onnxruntime, ready: yes (switched away from openvino" in log


def test_no_backend_passing_the_canary_refuses_inference_and_stays_not_ready(
    serve, digits_int8_build, copy_build
):
    build = broken_int8(copy_build(digits_int8_build))
    server = serve(build, "--policy", "openvino", wait_ready=False)
    status, ready = server.get_json("/v2/health/ready")
    assert status == 503 and ready["active_backend"] is None, ready
    assert ready["fallback"]["switches"][0]["reason"].startswith("canary mismatch:"), ready
    status, _, resp = _infer(server, np.load(build / "canary" / "input.npy"))
    assert status == 503, resp  # not the broken logits
    assert "no backend is active" in json.loads(resp)["error"]
    assert server.get_json("/v2/health/ready")[0] == 503  # re-checked meanwhile: still nothing passes
    _, _, metrics = server.request("GET", "/metrics")
    assert 'veo_edge_ready{model="vit-digits",version="1"} 0.0' in metrics.decode()
    # re-checked for a while (each readiness call wakes the re-checker): the backend that answered
    # wrongly waits out its backoff (the recovery interval, 30 s) rather than being loaded every second
    for _ in range(20):
        status, ready = server.get_json("/v2/health/ready")
        assert status == 503, ready
        time.sleep(0.25)
    assert [s for s in ready["fallback"]["skipped"] if s["backend"] == "openvino"] == [], ready
    # the reason names what failed and where, not a canary "failed" on no backend at all
    assert "canary failed on openvino: canary max abs error" in ready["reason"], ready
    assert "on None" not in ready["reason"], ready
    log = server.log.read_text()
    assert " ERROR model 'vit-digits': backend none, not ready: " in log
    assert " ERROR not ready: no backend passed the canary (openvino: canary max abs error" in log
