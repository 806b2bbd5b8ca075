"""``veo-edge healthcheck --url`` and the image's probe name where the golden build directory came from
when it is not the served build: ``--build-dir`` when given so, ``VEO_EDGE_BUILD_DIR`` when the
environment named it (the message named the flag to a container whose HEALTHCHECK has no flags)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from veo_edge.serve.health import EXIT_CODES

#: the image's probe and the CLI, each run as a process
COMMANDS = (["veo_edge.serve.probe"], ["veo_edge.cli.main", "healthcheck"])


def _run(module: list[str], *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *module, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


def test_a_wrong_golden_build_is_named_by_where_it_came_from(nano_server, video_nano_build: Path):
    url = f"http://{nano_server.url}"
    env = {"VEO_EDGE_BUILD_DIR": str(video_nano_build)}
    wrong = f"VEO_EDGE_BUILD_DIR={video_nano_build} is not the build the server at {url} serves"
    for module in COMMANDS:
        r = _run(module, "--url", url, "--model-name", "vit-nano", env=env)
        assert r.returncode == EXIT_CODES["canary mismatch"], r.stderr
        assert wrong in r.stderr and "unset VEO_EDGE_BUILD_DIR to use the server's canary" in r.stderr
        assert "--build-dir" not in r.stderr, r.stderr
    # given as the flag, the flag is named (the environment's is not used then)
    flags = ("--url", url, "--model-name", "vit-nano", "--build-dir", str(video_nano_build))
    r = _run(["veo_edge.cli.main", "healthcheck"], *flags, env=env)
    assert r.returncode == EXIT_CODES["canary mismatch"], r.stderr
    assert f"--build-dir {video_nano_build} is not the build the server at {url} serves" in r.stderr
    assert "leave --build-dir out" in r.stderr and "VEO_EDGE_BUILD_DIR" not in r.stderr
