"""Every refused inference request shows in ``veo_edge_infer_requests_total{protocol,code}``, those the
transport refuses before the service sees them too: HTTP 401 (no token), 413 (over --max-request-bytes)
and 404 (no such model or version), a gRPC ModelInfer without its token (401), one whose message does
not decode (400), one naming a model the server does not have (404) and one over --max-request-bytes,
which grpcio refuses before any handler (413). A request refused before any
model of the server was known counts under ``model=""`` (never under the name a client sent). They
were counted only by route in ``veo_edge_http_responses_total`` (HTTP), or nowhere (gRPC)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from veo_edge.serve.protocol import encode_infer_request

grpc = pytest.importorskip("grpc")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

TOKEN = "0c7d3e9a51f24b6e8a9d2c4f6b1e3a57"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def _counts(server) -> dict[tuple[str, str, str], float]:
    """(model, protocol, code) -> veo_edge_infer_requests_total."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(server.request("GET", "/metrics")[2].decode()):
        for s in family.samples:
            if s.name == "veo_edge_infer_requests_total":
                out[(s.labels["model"], s.labels["protocol"], s.labels["code"])] = s.value
    return out


def _body() -> tuple[bytes, dict[str, str]]:
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    body, hlen = encode_infer_request({"input": x})
    return body, {"Inference-Header-Content-Length": str(hlen)}


def _message(x: np.ndarray) -> bytes:
    """A serialized ModelInferRequest for vit-nano carrying ``x`` as raw contents."""
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name="vit-nano")
    tensor = req.inputs.add(name="input", datatype="FP32")
    tensor.shape.extend(x.shape)
    req.raw_input_contents.append(x.tobytes())
    return req.SerializeToString()


def _grpc_refused(server, message, metadata=()) -> grpc.StatusCode:
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary(MODEL_INFER)
        with pytest.raises(grpc.RpcError) as info:
            call(message, timeout=30, metadata=metadata)
    return info.value.code()


def _grpc_no_message_by_the_deadline(server, metadata) -> grpc.StatusCode:
    """A ModelInfer call (streamed, as the server registers it) whose message is still to come when its
    0.5 s deadline passes."""
    release = threading.Event()

    def messages():
        release.wait(30)  # the message never comes before the deadline
        return
        yield

    try:
        with grpc.insecure_channel(server.grpc_url) as channel, pytest.raises(grpc.RpcError) as info:
            channel.stream_unary(MODEL_INFER)(messages(), timeout=0.5, metadata=metadata)
    finally:
        release.set()
    return info.value.code()


def test_refusals_before_the_service_count_by_protocol_and_code(serve, nano_build: Path, tmp_path: Path):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    server = serve(
        nano_build,
        *("--control-token-file", str(token), "--restrict-api", "inference", "--max-request-bytes", "65536"),
    )
    body, head = _body()
    infer = "/v2/models/vit-nano/infer"
    assert server.request("POST", infer, body, head)[0] == 401
    assert server.request("POST", infer, bytes(70000), {**AUTH, "Content-Type": "application/json"})[0] == 413
    assert server.request("POST", "/v2/models/nope/infer", body, {**AUTH, **head})[0] == 404
    assert server.request("POST", "/v2/models/vit-nano/versions/7/infer", body, {**AUTH, **head})[0] == 404
    assert server.request("POST", infer, body, {**AUTH, **head})[0] == 200

    meta = (("authorization", f"Bearer {TOKEN}"),)
    assert _grpc_refused(server, b"\x0b", meta) == grpc.StatusCode.INVALID_ARGUMENT  # does not decode
    # over --max-request-bytes: grpcio refuses it as it comes, before any handler could read it, with the
    # token or without; each counts as 413 under model "" (no model is known from an unread message)
    big = _message(np.zeros((1, 3, 100, 100), np.float32))  # 120 kB, over the 64 kB cap
    assert _grpc_refused(server, big, meta) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _grpc_refused(server, big) == grpc.StatusCode.RESOURCE_EXHAUSTED
    # a client whose deadline passes before its message came gave up: 499, not "too large"
    assert _grpc_no_message_by_the_deadline(server, meta) == grpc.StatusCode.DEADLINE_EXCEEDED
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = np.zeros((1, 3, 32, 32), np.float32)
    inp = grpcclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        client.infer("nope", [inp], headers={"authorization": f"Bearer {TOKEN}"})
    with pytest.raises(InferenceServerException, match=r"StatusCode\.UNAUTHENTICATED"):
        client.infer("vit-nano", [inp])

    assert _counts(server) == {
        ("vit-nano", "http", "401"): 1,
        ("vit-nano", "http", "413"): 1,
        ("", "http", "404"): 1,  # no such model: refused before a model was known
        ("vit-nano", "http", "404"): 1,  # the model, without that version
        ("vit-nano", "http", "200"): 1,
        ("", "grpc", "400"): 1,
        ("", "grpc", "404"): 1,
        ("", "grpc", "413"): 2,
        ("", "grpc", "499"): 1,
        ("vit-nano", "grpc", "401"): 1,
    }


def test_a_model_set_counts_refusals_before_a_model_is_known(serve, nano_build, video_nano_build):
    server = serve([nano_build, video_nano_build])
    body, head = _body()
    assert server.request("POST", "/v2/models/nope/infer", body, head)[0] == 404
    assert _grpc_refused(server, b"\x0b") == grpc.StatusCode.INVALID_ARGUMENT
    assert _counts(server) == {("", "http", "404"): 1, ("", "grpc", "400"): 1}
