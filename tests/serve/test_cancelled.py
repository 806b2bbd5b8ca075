"""An inference request whose client gives up while its samples run (a gRPC call cancelled by its client
or past its deadline) is counted once, as code 499 and reason CANCELED, and never as answered; serve's
log stays free of asyncio's "exception was never retrieved"; and the request's bytes count against
--max-buffered-bytes until its running samples are done, not only until the client left (cancelled
calls let in far more bytes than the cap)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("tritonclient.grpc")

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
#: one 8-sample vit-nano message (98 KB) fits the budget; two do not
MAX_BUFFERED = 150_000
SLOW = {"VEO_EDGE_FAULTS": json.dumps({"*": {"slow_ms": 1500}})}
DEADLINE_S = 60.0


def _message(n: int) -> bytes:
    from tritonclient.grpc import service_pb2

    x = np.random.default_rng(n).standard_normal((n, 3, 32, 32)).astype(np.float32)
    req = service_pb2.ModelInferRequest(model_name="vit-nano")
    tensor = req.inputs.add(name="input", datatype="FP32")
    tensor.shape.extend(x.shape)
    req.raw_input_contents.append(x.tobytes())
    return req.SerializeToString()


def _metrics(server) -> dict[tuple, float]:
    """(sample name, sorted labels) -> value, for the series these tests read."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(server.request("GET", "/metrics")[2].decode()):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model", "version")))
            out[(s.name, labels)] = s.value
    return out


def _requests(m: dict, protocol: str, code: int) -> float:
    return m.get(("veo_edge_infer_requests_total", (("code", str(code)), ("protocol", protocol))), 0.0)


def _failures(m: dict, reason: str) -> float:
    return m.get(("nv_inference_request_failure", (("reason", reason),)), 0.0)


def _samples(m: dict) -> float:
    return m[("nv_inference_count", ())]


def _wait_for(what: str, predicate, server) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not within {DEADLINE_S} s:\n{server.log.read_text()}"
        time.sleep(0.05)


def _probe(server) -> int:
    """An HTTP infer whose declared 60 KB body fits the budget only while no 8-sample call holds its
    share: 503 at once while one does, else its junk body is read and refused (400); nothing runs."""
    body = b"x" * 60_000
    return server.request("POST", "/v2/models/vit-nano/infer", body, {"Content-Type": "application/json"})[0]


def _quiet_log(server) -> str:
    assert server.stop() == 0, server.log.read_text()
    text = server.log.read_text()
    assert "never retrieved" not in text and "CancelledError" not in text, text
    return text


def test_a_cancelled_call_is_499_and_holds_its_bytes_until_its_samples_ran(serve, nano_build):
    server = serve(
        nano_build, "--max-request-bytes", "110000", "--max-buffered-bytes", str(MAX_BUFFERED), env=SLOW
    )
    before = _metrics(server)
    with grpc.insecure_channel(server.grpc_url) as channel:
        infer = channel.unary_unary(MODEL_INFER)
        first = infer.future(_message(8), timeout=DEADLINE_S)
        # its bytes are held from when it is taken, and its samples submitted in the same step: they run
        _wait_for("the first call's bytes held", lambda: _probe(server) == 503, server)
        first.cancel()
        # the same connection carries the cancellation before this call: the first one's samples still
        # run (1.5 s each batch), so its share is still held and this one does not fit
        with pytest.raises(grpc.RpcError) as refused:
            infer(_message(8), timeout=DEADLINE_S)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()
        assert "request bodies" in refused.value.details()
        _wait_for("the cancelled call counted", lambda: _requests(_metrics(server), "grpc", 499) == 1, server)
        after = _metrics(server)
        assert _samples(after) - _samples(before) == 8, "the cancelled call's samples ran to their end"
        # its share is back: the same call fits now, and is answered
        infer(_message(8), timeout=DEADLINE_S)
    after = _metrics(server)
    assert _requests(after, "grpc", 499) - _requests(before, "grpc", 499) == 1
    assert _failures(after, "CANCELED") - _failures(before, "CANCELED") == 1
    assert _requests(after, "grpc", 503) - _requests(before, "grpc", 503) == 1
    assert _requests(after, "grpc", 200) - _requests(before, "grpc", 200) == 1
    _quiet_log(server)


def test_a_call_past_its_deadline_is_counted_once_as_canceled(serve, nano_build):
    """Each batch takes 1.5 s against a 0.3 s deadline: every call passes it while its samples run."""
    server = serve(nano_build, env=SLOW)
    before = _metrics(server)
    with grpc.insecure_channel(server.grpc_url) as channel:
        infer = channel.unary_unary(MODEL_INFER)
        for n in (1, 8):
            with pytest.raises(grpc.RpcError) as late:
                infer(_message(n), timeout=0.3)
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    _wait_for("both calls counted", lambda: _requests(_metrics(server), "grpc", 499) == 2, server)
    after = _metrics(server)
    assert _failures(after, "CANCELED") - _failures(before, "CANCELED") == 2
    assert _requests(after, "grpc", 200) == _requests(before, "grpc", 200)
    assert after[("nv_inference_request_success", ())] == before[("nv_inference_request_success", ())]
    _quiet_log(server)
