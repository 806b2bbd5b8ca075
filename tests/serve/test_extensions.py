"""Triton's protocol extensions through the real ``tritonclient[http]``: what ``GET /v2`` advertises,
duplicate outputs, all-model statistics with Triton's compute-time convention, the model repository
(model_analyzer's index / load / unload: tests/serve/test_control.py) and classification (``class_count``, with the build's labels)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

tritonclient_http = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

EXPECTED_EXTENSIONS = {
    "binary_tensor_data",
    "classification",
    "model_configuration",
    "model_repository",
    "statistics",
}


def _client(server):
    return tritonclient_http.InferenceServerClient(server.url, network_timeout=60)


def _input(batch: int = 1, seed: int = 0):
    x = np.random.default_rng(seed).standard_normal((batch, 3, 32, 32)).astype(np.float32)
    inp = tritonclient_http.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return inp


def test_advertises_exactly_what_it_implements(nano_server):
    c = _client(nano_server)
    assert set(c.get_server_metadata()["extensions"]) == EXPECTED_EXTENSIONS
    # each advertised extension answers
    assert c.get_model_config("vit-nano")["max_batch_size"] == 8  # model_configuration
    assert c.get_inference_statistics("vit-nano")["model_stats"]  # statistics
    assert c.get_model_repository_index()  # model_repository
    out = tritonclient_http.InferRequestedOutput("logits", class_count=1)  # classification
    assert c.infer("vit-nano", [_input()], outputs=[out]).as_numpy("logits").shape == (1, 1)


def test_duplicate_outputs_are_400(nano_server):
    c = _client(nano_server)
    outs = [
        tritonclient_http.InferRequestedOutput("logits"),
        tritonclient_http.InferRequestedOutput("logits"),
    ]
    with pytest.raises(InferenceServerException, match="output 'logits' is requested twice") as info:
        c.infer("vit-nano", [_input()], outputs=outs)
    assert info.value.status() == "400"


def test_all_model_stats(nano_server):
    c = _client(nano_server)
    c.infer("vit-nano", [_input()])
    every = c.get_inference_statistics()  # GET /v2/models/stats
    assert [m["name"] for m in every["model_stats"]] == ["vit-nano"]
    assert every["model_stats"][0]["inference_count"] >= 1


def test_stats_follow_tritons_convention(serve, nano_build):
    """Each request carries its whole batch's compute time; batch_stats per executed batch size."""
    server = serve(
        nano_build, "--max-queue-delay-ms", "20", env={"VEO_EDGE_FAULTS": json.dumps({"*": {"slow_ms": 20}})}
    )
    c = _client(server)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: _client(server).infer("vit-nano", [_input(seed=i)]), range(32)))
    s = c.get_inference_statistics("vit-nano")["model_stats"][0]
    batches = {b["batch_size"]: b for b in s["batch_stats"]}
    assert max(batches) > 1, batches  # concurrent requests shared batches
    assert sum(b["compute_infer"]["count"] for b in batches.values()) == s["execution_count"]
    assert sum(k * b["compute_infer"]["count"] for k, b in batches.items()) == s["inference_count"]
    # the 32 requests and nothing else: the server's start-up canary is not traffic (nor in Triton's)
    assert s["inference_count"] == s["inference_stats"]["success"]["count"] == 32
    infer = s["inference_stats"]["compute_infer"]
    # every batch ran >= 20 ms (slow_ms), so every request's compute time is >= 20 ms: the per-request
    # mean is not the batch time divided by the batch size
    assert infer["ns"] / infer["count"] >= 20e6, infer
    assert infer["ns"] == pytest.approx(
        sum(k * b["compute_infer"]["ns"] for k, b in batches.items()), rel=1e-3, abs=1000 * len(batches)
    )
    for b in batches.values():
        assert b["compute_infer"]["ns"] >= 20e6 * b["compute_infer"]["count"]


def _classes(strings: np.ndarray) -> list[list[tuple[float, int, str | None]]]:
    out = []
    for row in strings:
        parsed = []
        for s in row:
            parts = (s.decode() if isinstance(s, bytes) else s).split(":")
            parsed.append((float(parts[0]), int(parts[1]), parts[2] if len(parts) > 2 else None))
        out.append(parsed)
    return out


@pytest.mark.parametrize("binary", [True, False])
def test_class_count(nano_server, binary):
    c = _client(nano_server)
    inp = _input(batch=3)
    logits = c.infer("vit-nano", [inp]).as_numpy("logits")
    out = tritonclient_http.InferRequestedOutput("logits", binary_data=binary, class_count=4)
    result = c.infer("vit-nano", [inp], outputs=[out])
    top = result.as_numpy("logits")
    assert top.shape == (3, 4)
    assert result.get_output("logits")["datatype"] == "BYTES"
    for row, got in zip(logits, _classes(top), strict=True):
        want = np.argsort(-row, kind="stable")[:4]
        assert [i for _, i, _ in got] == list(want)
        np.testing.assert_allclose([v for v, _, _ in got], row[want], atol=1e-5)
        assert all(label is None for _, _, label in got)  # this build has no labels


def test_class_count_with_the_builds_labels(serve, nano_build, copy_build):
    build = copy_build(nano_build)
    labels = [f"class {i} ({chr(ord('a') + i)})" for i in range(10)]
    (build / "labels.txt").write_text("\n".join(labels) + "\n")
    server = serve(build)
    c = _client(server)
    out = tritonclient_http.InferRequestedOutput("logits", class_count=2)
    got = _classes(c.infer("vit-nano", [_input()], outputs=[out]).as_numpy("logits"))[0]
    assert [label for _, _, label in got] == [labels[i] for _, i, _ in got]
    assert c.get_model_config("vit-nano")["output"][0]["label_filename"] == "labels.txt"
    with pytest.raises(InferenceServerException, match=r"classification \(class_count\) -1"):
        bad = {"inputs": [], "outputs": [{"name": "logits", "parameters": {"class_count": -1}}]}
        x = np.zeros((1, 3, 32, 32), np.float32)
        bad["inputs"] = [
            {"name": "input", "datatype": "FP32", "shape": [1, 3, 32, 32], "data": x.ravel().tolist()}
        ]
        status, _, body = server.request("POST", "/v2/models/vit-nano/infer", json.dumps(bad).encode())
        raise InferenceServerException(json.loads(body)["error"], status=str(status))
