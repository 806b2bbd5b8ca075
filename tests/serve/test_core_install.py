"""A core-only install (``pip install .`` into a fresh virtual environment, no extras) serves: whatever
``veo-edge serve`` needs at run time is a core dependency. Uses pip's configured indexes and cache."""

from __future__ import annotations

import json
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

from tests.serve.conftest import start_server

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_core_install_serves(nano_build, tmp_path):
    src = tmp_path / "src"  # a copy: pip must not write build/ or *.egg-info into the checkout
    shutil.copytree(ROOT / "veo_edge", src / "veo_edge", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for spec in ROOT.glob("plugins/*/spec.json"):
        (src / spec.parent.relative_to(ROOT)).mkdir(parents=True)
        shutil.copy(spec, src / spec.relative_to(ROOT))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    r = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(src)],
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
