"""The tests' own Docker engine: it starts, has the local base image, runs a container, and stops."""

from __future__ import annotations

import os


def test_the_engine_runs_a_container_of_the_local_base(docker_engine) -> None:
    out = docker_engine.docker(
        "run",
        "--rm",
        "--network=none",
        "veo-edge/base:bookworm-python3",
        "python3",
        "-c",
        "import venv, sys; print(sys.version_info[:2])",
    )
    assert out.stdout.strip().startswith("(3, ")
    assert docker_engine.pid is not None
    os.kill(docker_engine.pid, 0)  # the engine is the process the fixture started
