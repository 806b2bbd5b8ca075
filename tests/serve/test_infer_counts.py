"""``veo_edge_infer_requests_total{protocol,code}`` counts every inference request of each protocol by its
outcome, those refused before inference too: a wrong shape and an unregistered shared-memory region
(400, also ``nv_inference_request_failure{reason="INVALID"}``), an unloaded model (503), over HTTP and
gRPC alike (gRPC's code is the HTTP status its gRPC status stands for). Through the real tritonclient."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

TOKEN = "5b0e6c2f9a7d41e38c0f2a6b1d9e7c34"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def _metrics(server) -> dict[tuple[str, frozenset], float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(server.request("GET", "/metrics")[2].decode()):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k not in ("model", "version")}
            out[(s.name, frozenset(labels.items()))] = s.value
    return out


def test_refused_requests_are_counted_by_protocol_and_code(serve, nano_build: Path, tmp_path: Path):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    server = serve(
        nano_build, "--shared-memory", "--model-control-mode", "explicit", "--control-token-file", str(token)
    )
    clients = {
        "http": (httpclient, httpclient.InferenceServerClient(server.url, network_timeout=60)),
        "grpc": (grpcclient, grpcclient.InferenceServerClient(server.grpc_url)),
    }
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)

    def infer(protocol: str, how: str):
        mod, client = clients[protocol]
        data = x[..., :31] if how == "shape" else x
        inp = mod.InferInput("input", list(data.shape), "FP32")
        if how == "region":
            inp.set_shared_memory(f"nope-{protocol}", x.nbytes)
        else:
            inp.set_data_from_numpy(data)
        return client.infer("vit-nano", [inp])

    def refused(protocol: str, how: str, message: str) -> None:
        with pytest.raises(InferenceServerException, match=message):
            infer(protocol, how)

    for protocol in clients:
        refused(protocol, "shape", r"has shape \[1, 3, 32, 31\]")
        refused(protocol, "region", f"names shared-memory region 'nope-{protocol}', which is not registered")
        infer(protocol, "good")
    clients["http"][1].unload_model("vit-nano", headers=AUTH)
    for protocol in clients:
        refused(protocol, "good", "is unloaded")
    clients["http"][1].load_model("vit-nano", headers=AUTH)

    m = _metrics(server)
    for protocol in clients:
        counted = {
            code: m.get(
                ("veo_edge_infer_requests_total", frozenset({"protocol": protocol, "code": code}.items()))
            )
            for code in ("200", "400", "503")
        }
        assert counted == {"200": 1, "400": 2, "503": 1}, (protocol, counted)
    assert m[("nv_inference_request_failure", frozenset({"reason": "INVALID"}.items()))] == 4
