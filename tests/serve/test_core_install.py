"""A core-only install (the checkout's wheel, ``pip install``-ed with its dependencies into a fresh virtual
environment, no extras) serves: whatever ``veo-edge serve`` needs at run time is a core dependency. Uses
pip's configured indexes and cache; the wheel is the session's (``veo_wheel``, built once).

The environment is made without pip (no ``ensurepip``: pip and setuptools, which veo-edge does not declare,
are not there to hide a missing dependency) and this interpreter's pip installs into it (``pip --python``,
pip 22.3+). ``--no-compile``: byte-compiling every installed module (most of them never imported) is the
slowest part of the install and no part of what is proven; what serving imports is compiled as it loads."""

from __future__ import annotations

import json
import subprocess
import sys
import venv

import pytest

from tests.serve.conftest import start_server


@pytest.mark.slow
def test_core_install_serves(nano_build, veo_wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = str(env_dir / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check"]
    r = subprocess.run(
        [*pip, "install", "--quiet", "--no-compile", str(veo_wheel)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # core only: no test or export dependencies came along
    r = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    r = subprocess.run([python, "-c", "import hypothesis"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    # tritonclient[grpc] is core: the gRPC front end serves with the stubs it ships
    r = subprocess.run(
        [str(env_dir / "bin" / "veo-edge"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "serve" in r.stdout
    server = start_server(nano_build, tmp_path / "serve.log", python=python)
    try:
        status, ready = server.get_json("/v2/health/ready")
        assert status == 200 and ready["ready"] is True
        status, _, body = server.request("GET", "/metrics")
        assert status == 200 and b"nv_inference_request_success" in body
        meta = json.loads(server.request("GET", "/v2")[2])
        assert "model_repository" in meta["extensions"]
        assert server.grpc_port is not None  # gRPC listens too
    finally:
        assert server.stop() == 0, server.log.read_text()
    log = server.log.read_text()
    assert "Traceback" not in log
    assert (
        str(env_dir)
        in subprocess.run(
            [python, "-c", "import veo_edge; print(veo_edge.__file__)"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        ).stdout
    )
