"""The server against the real ``tritonclient[http]`` client: metadata, config, health, infer (binary and
JSON, batch 1 and the max batch), statistics and /metrics."""

from __future__ import annotations

import numpy as np
import pytest

from veo_edge.builddir import BuildDir

tritonclient_http = pytest.importorskip("tritonclient.http")


@pytest.fixture(scope="module")
def client(nano_server):
    c = tritonclient_http.InferenceServerClient(nano_server.url, network_timeout=60)
    yield c
    c.close()


@pytest.fixture(scope="module")
def reference(nano_build):
    """The in-process runtime answer (OpenVINO on the CPU, as the server runs here) and its tolerance."""
    from veo_edge.runtime.loaders import cpu_runner

    build = BuildDir.open(nano_build)
    x = np.random.default_rng(7).standard_normal((build.max_batch, *build.manifest["input_shape"]))
    x = x.astype(np.float32)
    with cpu_runner(build, "openvino") as runner:
        y = next(iter(runner.infer(x).values()))
    # batching groups samples differently from one reference batch; the build's canary tolerance bounds
    # the backend's error against float64, so twice it bounds two runs of it against each other
    return x, y, 2 * build.manifest["canary"]["atol"]


def test_server_metadata_and_health(client):
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "veo-edge"
    assert "binary_tensor_data" in meta["extensions"]


def test_model_metadata_and_config(client, nano_build):
    build = BuildDir.open(nano_build)
    assert client.is_model_ready("vit-nano")
    meta = client.get_model_metadata("vit-nano")
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]
    assert meta["outputs"][0]["shape"][0] == -1
    config = client.get_model_config("vit-nano")
    assert config["max_batch_size"] == build.max_batch
    assert config["input"][0]["dims"] == [3, 32, 32]
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert "max_queue_delay_microseconds" in config["dynamic_batching"]
    assert client.get_model_metadata("vit-nano", model_version="1")["name"] == "vit-nano"


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("binary", [True, False])
def test_infer(client, reference, batch, binary):
    x, y, tol = reference
    inp = tritonclient_http.InferInput("input", [batch, 3, 32, 32], "FP32")
    inp.set_data_from_numpy(x[:batch], binary_data=binary)
    out = tritonclient_http.InferRequestedOutput("logits", binary_data=binary)
    result = client.infer("vit-nano", [inp], outputs=[out], request_id="req-1")
    got = result.as_numpy("logits")
    assert got.shape == (batch, y.shape[1]) and got.dtype == np.float32
    assert np.abs(got - y[:batch]).max() <= tol
    assert result.get_response()["id"] == "req-1"


def test_infer_defaults_and_gzip(client, reference):
    x, y, tol = reference
    inp = tritonclient_http.InferInput("input", [2, 3, 32, 32], "FP32")
    inp.set_data_from_numpy(x[:2])
    for kw in ({}, {"request_compression_algorithm": "gzip"}, {"request_compression_algorithm": "deflate"}):
        got = client.infer("vit-nano", [inp], **kw).as_numpy("logits")  # no outputs: all, in binary
        assert np.abs(got - y[:2]).max() <= tol


def test_errors_reach_the_client(client):
    inp = tritonclient_http.InferInput("input", [1, 3, 32, 32], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 3, 32, 32), np.float32))
    from tritonclient.utils import InferenceServerException as exc

    with pytest.raises(exc, match="unknown model 'vit-tiny'; this server serves 'vit-nano'"):
        client.infer("vit-tiny", [inp])
    bad = tritonclient_http.InferInput("input", [1, 3, 32, 31], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 3, 32, 31), np.float32))
    with pytest.raises(exc, match=r"has shape \[1, 3, 32, 31\], expected input: FP32\[N, 3, 32, 32\]"):
        client.infer("vit-nano", [bad])
    assert not client.is_model_ready("vit-tiny")


def test_statistics(client):
    stats = client.get_inference_statistics("vit-nano")["model_stats"][0]
    assert stats["name"] == "vit-nano"
    assert stats["inference_count"] >= 1 and stats["execution_count"] >= 1
    assert stats["inference_stats"]["success"]["count"] >= 1


def test_health_bodies_report_backend_and_fallback(nano_server):
    status, live = nano_server.get_json("/v2/health/live")
    assert status == 200 and live["live"] is True and live["active_backend"]
    status, ready = nano_server.get_json("/v2/health/ready")
    assert status == 200 and ready["ready"] is True
    assert ready["active_backend"] == live["active_backend"]
    assert ready["canary"]["ok"] is True
    assert set(ready["fallback"]) >= {"count", "switches", "skipped"}


def test_metrics(client, nano_server):
    inp = tritonclient_http.InferInput("input", [1, 3, 32, 32], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 3, 32, 32), np.float32))
    client.infer("vit-nano", [inp])
    status, headers, body = nano_server.request("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    text = body.decode()
    samples = (line.rsplit(" ", 1) for line in text.splitlines() if line and line[0] != "#")
    lines = {name: float(value) for name, value in samples}  # a label value may hold spaces, the value not
    assert lines['nv_inference_request_success{model="vit-nano",version="1"}'] >= 1
    assert lines['nv_inference_exec_count{model="vit-nano",version="1"}'] >= 1
    assert lines['nv_inference_compute_infer_duration_us{model="vit-nano",version="1"}'] > 0
    assert lines['veo_edge_ready{model="vit-nano",version="1"}'] == 1
    assert lines["process_resident_memory_bytes"] > 0
    # every batch the batcher formed says why it closed (the canary's synchronous runs form none)
    closed = [v for k, v in lines.items() if k.startswith('veo_edge_batches_closed_total{model="vit-nano"')]
    assert 1 <= sum(closed) <= lines['nv_inference_exec_count{model="vit-nano",version="1"}']
    lone = 'veo_edge_openvino_batches_total{compile="latency",model="vit-nano",version="1"}'
    if lone in lines:  # serve's default ADAPTIVE hint, on a machine with more than one stream
        assert lines[lone] >= 1  # this client's requests came one at a time: at least one ran alone
    for name in (
        "nv_inference_queue_duration_us",
        "nv_inference_request_duration_us",
        "veo_edge_batch_size_total",
        "veo_edge_active_backend",
        "veo_edge_fallback_switches_total",
        "nv_inference_pending_request_count",
    ):
        assert name in text
