"""Several models in one `veo-edge serve`: each with its own readiness and batcher, a model repository
folder, unknown models, one metrics registry; and the discovery rules on their own."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from veo_edge.errors import BuildDirError, UsageError
from veo_edge.export.parity import seeded_inputs
from veo_edge.serve.health import check_server
from veo_edge.serve.protocol import decode_infer_response, encode_infer_request
from veo_edge.serve.repository import find_models


def _infer(server, name: str, x: np.ndarray):
    body, hlen = encode_infer_request({"input": x})
    status, headers, out = server.request(
        "POST", f"/v2/models/{name}/infer", body, {"Inference-Header-Content-Length": str(hlen)}
    )
    return status, out if status != 200 else decode_infer_response(
        out, headers.get("inference-header-content-length")
    )


def test_each_model_has_its_own_readiness(
    serve, nano_build: Path, video_nano_build: Path, tmp_path: Path
) -> None:
    """A model whose canary does not match is not ready; the other one is, and serves."""
    broken = tmp_path / "broken" / "vit-nano"
    shutil.copytree(nano_build, broken)
    expected = broken / "canary" / "expected.npy"
    np.save(expected, np.load(expected) + 1.0)
    # a build whose golden output is wrong but consistently recorded (made elsewhere, say): it passes the
    # load-time verification, so the server starts and the canary itself fails
    import json

    from veo_edge.builddir import artifact_entry, write_manifest

    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["artifacts"]["canary_expected"] = artifact_entry(broken, expected)
    manifest.pop("schema_version", None)
    write_manifest(broken, manifest)
    server = serve([broken, video_nano_build], wait_ready=False)
    status, nano = server.get_json("/v2/models/vit-nano/ready")
    assert status == 503 and not nano["ready"] and "canary" in nano["reason"]
    status, video = server.get_json("/v2/models/veo-video-nano/ready")
    assert status == 200 and video["ready"] and video["model"] == "veo-video-nano"
    status, whole = server.get_json("/v2/health/ready")
    assert status == 503 and not whole["ready"] and whole["reason"].startswith("vit-nano: ")
    assert whole["models"]["veo-video-nano"]["ready"] is True

    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert not client.is_model_ready("vit-nano") and client.is_model_ready("veo-video-nano")
    assert not client.is_server_ready()
    client.close()
    from veo_edge.builddir import BuildDir

    x = seeded_inputs(tuple(BuildDir.open(video_nano_build).manifest["input_shape"]), 1, 0)
    status, out = _infer(server, "veo-video-nano", x)
    assert status == 200 and out["logits"].shape[0] == 1


def test_a_repository_folder_serves_each_build_under_its_folder_name(
    serve, nano_build: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    for name in ("cats", "dogs"):
        shutil.copytree(nano_build, repo / name)
    (repo / "notes").mkdir()  # a folder without a manifest is not a model
    server = serve([repo])
    for name in ("cats", "dogs"):
        status, meta = server.get_json(f"/v2/models/{name}")
        assert status == 200 and meta["name"] == name
        assert server.get_json(f"/v2/models/{name}/ready")[0] == 200
    x = seeded_inputs((3, 32, 32), 2, 1)
    for _ in range(3):
        status, out = _infer(server, "cats", x)
        assert status == 200 and out["logits"].shape == (2, 10)
    # each model its own runtime and batcher: only cats counted the six samples (the canaries: none)
    cats = server.get_json("/v2/models/cats/stats")[1]["model_stats"][0]
    dogs = server.get_json("/v2/models/dogs/stats")[1]["model_stats"][0]
    assert (cats["inference_count"], dogs["inference_count"]) == (6, 0)
    # Triton counts requests in inference_stats, samples in inference_count: three requests of two
    assert (
        cats["inference_stats"]["success"]["count"] == cats["inference_stats"]["compute_infer"]["count"] == 3
    )
    # a repository of several models: the healthcheck asks which one (a usage error, not 'not ready')
    with pytest.raises(UsageError, match=r"serves several models \(cats, dogs\); pass --model-name"):
        check_server(f"http://{server.url}", timeout=30)
    # the healthcheck of one model of a repository: its golden canary from the server, in the binary form
    assert check_server(f"http://{server.url}", model_name="dogs", timeout=30)["model"] == "dogs"
    status, body = server.get_json("/v2/models/vit-nano")
    assert status == 404 and body["error"] == "unknown model 'vit-nano'; this server serves: cats, dogs"
    status, _, metrics = server.request("GET", "/metrics")
    text = metrics.decode()
    assert 'nv_inference_count{model="cats",version="1"} 6.0' in text
    assert 'nv_inference_request_success{model="cats",version="1"} 3.0' in text
    assert 'nv_inference_count{model="dogs",version="1"}' in text
    assert text.count("# TYPE process_resident_memory_bytes") == 1
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30) as r:
        assert 'nv_inference_count{model="cats",version="1"}' in r.read().decode()


def test_find_models_rules(nano_build: Path, video_nano_build: Path, tmp_path: Path, caplog) -> None:
    assert [e.name for e in find_models([nano_build, video_nano_build])] == ["vit-nano", "veo-video-nano"]
    repo = tmp_path / "repo"  # a repository with a build, a half-copied one, a hidden folder and a file
    (repo / "copying" / "openvino").mkdir(parents=True)
    (repo / ".cache").mkdir()
    (repo / "README.txt").write_text("models")
    (repo / "mine").symlink_to(nano_build)
    assert [e.name for e in find_models([repo])] == ["mine"]
    assert "model repository" in caplog.text and "not serving copying/ (no manifest.json" in caplog.text
    assert ".cache" not in caplog.text
    assert [e.name for e in find_models([nano_build], "mine")] == ["mine"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        BuildDirError, match=r"empty is neither a build directory \(no manifest.json\) nor a model"
    ):
        find_models([tmp_path / "empty"])
    with pytest.raises(BuildDirError, match=r"does not exist; run `veo-edge build` first"):
        find_models([tmp_path / "nowhere"])
    with pytest.raises(UsageError, match=r"two builds would serve as model 'vit-nano'"):
        find_models([nano_build, nano_build])
    with pytest.raises(UsageError, match=r"--model-name names one model, but 2 are served"):
        find_models([nano_build, video_nano_build], "mine")
