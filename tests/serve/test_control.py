"""The control API needs a key: model load/unload off unless ``--model-control-mode explicit``, then
behind a bearer token (HTTP ``Authorization``, gRPC ``authorization`` metadata); ``--restrict-api``
puts more groups behind it; inference and health stay open otherwise. Through the real tritonclient."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.serve.conftest import serve_to_exit

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

TOKEN = "f3c1a9d2b7e84c05a6d19e2f7b3c8a41"
AUTH = {"authorization": f"Bearer {TOKEN}"}  # gRPC metadata keys are lowercase
PROTOCOLS = ["http", "grpc"]


@pytest.fixture(scope="module")
def control_server(nano_build: Path, serve_module, tmp_path_factory):
    token_file = tmp_path_factory.mktemp("secret") / "token"
    token_file.write_text(TOKEN + "\n")
    return serve_module(
        nano_build,
        "--model-control-mode",
        "explicit",
        "--control-token-file",
        str(token_file),
        "--restrict-api",
        "statistics",
    )


def _client(server, protocol: str):
    if protocol == "http":
        return httpclient.InferenceServerClient(server.url, network_timeout=60)
    return grpcclient.InferenceServerClient(server.grpc_url)


def _input(mod, seed: int = 0):
    x = np.random.default_rng(seed).standard_normal((1, 3, 32, 32)).astype(np.float32)
    inp = mod.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return inp


def _error(fn, *args, **kw) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        fn(*args, **kw)
    return info.value


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_model_control_is_off_by_default(nano_server, protocol) -> None:
    c = _client(nano_server, protocol)
    for call in (c.unload_model, c.load_model):
        e = _error(call, "vit-nano", headers=AUTH)
        assert e.status() in ("403", "StatusCode.PERMISSION_DENIED")
        assert "model load/unload is off on this server (--model-control-mode none)" in e.message()
    assert c.is_model_ready("vit-nano")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_without_the_token_control_is_401(control_server, protocol) -> None:
    c = _client(control_server, protocol)
    unauthenticated = ("401", "StatusCode.UNAUTHENTICATED")
    e = _error(c.unload_model, "vit-nano")
    assert e.status() in unauthenticated and "needs a bearer token" in e.message()
    e = _error(c.unload_model, "vit-nano", headers={"authorization": "Bearer " + TOKEN[:-1] + "0"})
    assert e.status() in unauthenticated and "is not this server's" in e.message()
    e = _error(c.get_inference_statistics, "vit-nano")  # --restrict-api statistics
    assert e.status() in unauthenticated
    assert c.get_inference_statistics("vit-nano", headers=AUTH)
    # inference, health and metadata stay open
    mod = httpclient if protocol == "http" else grpcclient
    assert c.is_server_ready() and c.get_model_metadata("vit-nano")
    assert c.infer("vit-nano", [_input(mod)]).as_numpy("logits").shape == (1, 10)


def test_http_401_asks_for_bearer_and_reads_no_body(control_server) -> None:
    status, headers, body = control_server.request(
        "POST", "/v2/repository/models/vit-nano/unload", b"{}", {"Authorization": "Basic dXNlcjpwYXNz"}
    )
    assert status == 401 and headers["www-authenticate"].startswith("Bearer")
    assert headers["connection"] == "close" and "needs a bearer token" in json.loads(body)["error"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_with_the_token_unload_and_load(control_server, protocol) -> None:
    """model_analyzer's calls: index, unload, load (the model serves again after it)."""
    c = _client(control_server, protocol)
    mod = httpclient if protocol == "http" else grpcclient
    index = c.get_model_repository_index(headers=AUTH)
    if protocol == "http":
        assert index == [{"name": "vit-nano", "version": "1", "state": "READY", "reason": ""}]
    else:
        assert [(m.name, m.state) for m in index.models] == [("vit-nano", "READY")]
    c.unload_model("vit-nano", headers=AUTH)
    assert not c.is_model_ready("vit-nano") and not c.is_server_ready()
    e = _error(c.infer, "vit-nano", [_input(mod)])
    assert "is unloaded" in e.message() and e.status() in ("503", "StatusCode.UNAVAILABLE")
    c.unload_model("vit-nano", headers=AUTH)  # idempotent
    c.load_model("vit-nano", headers=AUTH)
    assert c.is_model_ready("vit-nano") and c.is_server_ready()
    assert c.infer("vit-nano", [_input(mod)]).as_numpy("logits").shape == (1, 10)
    e = _error(c.load_model, "vit-tiny", headers=AUTH)
    assert "the repository holds only 'vit-nano'" in e.message()
    e = _error(c.load_model, "vit-nano", headers=AUTH, config=json.dumps({"max_batch_size": 2}))
    assert "load parameters" in e.message() and "are not supported" in e.message()


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--model-control-mode", "explicit"], {}, "--model-control-mode explicit needs a token"),
        (["--restrict-api", "inference,nope"], {}, "--restrict-api nope: unknown group"),
        (["--restrict-api", "inference"], {"VEO_EDGE_CONTROL_TOKEN": "short"}, "has 5 characters"),
    ],
)
def test_a_policy_that_cannot_hold_is_refused_at_start(nano_build, args, env, message) -> None:
    import os

    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VEO_EDGE_CONTROL", "VEO_EDGE_MODEL_CONTROL", "VEO_EDGE_RESTRICT"))
    }
    proc = serve_to_exit(nano_build, *args, env={**clean, **env})
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_the_healthcheck_and_the_image_probe_send_the_token_a_restricted_health_api_asks_for(
    nano_build, serve, tmp_path
) -> None:
    """``--restrict-api health,metadata,inference`` (as an image's VEO_EDGE_RESTRICT_API may set): the
    image's probe reads the server's own token from its environment, ``veo-edge healthcheck`` from
    --token-file; without one the check says what to give, exit 24, not 'down'."""
    import os
    import time

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    server = serve(nano_build, "--restrict-api", "health,metadata,inference",
                   env={"VEO_EDGE_CONTROL_TOKEN_FILE": str(token_file)}, wait_ready=False)  # fmt: skip
    deadline = time.monotonic() + 120
    while server.request("GET", "/v2/health/ready", None, {"Authorization": f"Bearer {TOKEN}"})[0] != 200:
        assert time.monotonic() < deadline, server.log.read_text()
        time.sleep(0.1)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("VEO_EDGE_CONTROL")}

    def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args, "--url", f"http://{server.url}"], capture_output=True,
                              text=True, timeout=120, env={**clean, **(env or {})})  # fmt: skip

    r = run("-m", "veo_edge.cli.main", "healthcheck")
    assert r.returncode == 24, r.stderr
    assert "answered 401" in r.stderr and "--token-file PATH" in r.stderr, r.stderr
    r = run("-m", "veo_edge.cli.main", "healthcheck", "--token-file", str(token_file))
    assert r.returncode == 0 and r.stdout.startswith("healthy:"), r.stderr
    wrong = tmp_path / "wrong"
    wrong.write_text(TOKEN[::-1])
    r = run("-m", "veo_edge.cli.main", "healthcheck", "--token-file", str(wrong))
    assert r.returncode == 24 and "the token given is not this server's" in r.stderr, r.stderr
    r = run("-m", "veo_edge.serve.probe", env={"VEO_EDGE_CONTROL_TOKEN_FILE": str(token_file)})
    assert r.returncode == 0 and r.stdout.startswith("healthy:"), r.stderr
    r = run("-m", "veo_edge.serve.probe")
    assert r.returncode == 24, r.stderr
