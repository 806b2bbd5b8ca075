"""Image names Docker would refuse are refused first, in one line, before any work or engine: a bad
``--image`` used to fail after the whole build and image as "internal error: DockerException", and
``verify``/``deploy`` of one as "internal error: APIError 400"."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from veo_edge.errors import UsageError
from veo_edge.packaging.image import check_reference

GOOD = [
    "vit-tiny",
    "veo-edge/vit-tiny:1",
    "localhost:5000/a/b:tag",
    "registry.local:5000/team/model:v1.2-x",
    "127.0.0.1:5000/x",
    "a__b/c-d.e:latest",
    "ubuntu@sha256:" + "a" * 64,
]
BAD = ["Veo-Walk/BAD TAG::1", "NotAValid::Tag", "UPPER:1", "Abc/def:1", "a//b", "-a:1", "a:", "a:-x", "x:1:2"]


@pytest.mark.parametrize("ref", GOOD)
def test_references_docker_takes_pass(ref: str) -> None:
    check_reference(ref, "--image")


@pytest.mark.parametrize("ref", BAD)
def test_references_docker_refuses_are_usage_errors(ref: str) -> None:
    with pytest.raises(UsageError, match=rf"--image {ref!r} is not an image reference Docker takes"):
        check_reference(ref, "--image")


def test_image_ids_pass_where_an_image_may_be_named_by_id() -> None:
    check_reference("sha256:" + "0" * 64, "IMAGE", image_id=True)
    check_reference("0123456789ab", "IMAGE", image_id=True)


def _veo(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "veo_edge.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_the_commands_refuse_a_bad_name_before_any_engine_or_build(tmp_path) -> None:
    nowhere = f"unix://{tmp_path}/no-engine.sock"  # refused before an engine is even asked
    for args in (
        ["verify", "NotAValid::Tag"],
        ["deploy", "NotAValid::Tag", "--to", nowhere],
        ["build", "--model", "vit-nano", "--target", "cpu", "--image", "Veo-Walk/BAD TAG::1", "--out",
         str(tmp_path / "b")],
    ):  # fmt: skip
        r = _veo(*args, DOCKER_HOST=nowhere)
        assert r.returncode == 2, (args, r.stderr)
        assert (
            "is not an image reference Docker takes" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        )
    assert not (tmp_path / "b").exists()
    # verify with no engine: what to do, and not an image build's --context-only
    r = _veo("verify", "veo-edge/vit-nano:1", DOCKER_HOST=nowhere)
    assert r.returncode == 41 and r.stderr.rstrip().endswith(
        "start a Docker engine or set DOCKER_HOST to one"
    )
