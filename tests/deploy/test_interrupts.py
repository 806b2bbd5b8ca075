"""A deploy interrupted at each of its steps always leaves a healthy release running: Ctrl-C (or SIGTERM,
which the CLI turns into the same exception) restores the previous release at once; a deploy killed
outright (SIGKILL) leaves its journal (``NAME-outgoing``) on the device, and the next ``deploy status``
finishes it. Real containers on the "device" engine, health from Docker's own HEALTHCHECK."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.deploy.conftest import build_tiny_image
from tests.support.net import free_port
from veo_edge.deploy import RunOptions, deploy_container, rollback, status
from veo_edge.deploy.device import OUTGOING_SUFFIX, PARKED_SUFFIX, PREVIOUS_SUFFIX
from veo_edge.deploy.ship import facts_for
from veo_edge.deploy.transfer import transfer_image
from veo_edge.errors import DeployInterruptedError

STEPS = ["renamed", "stopped", "started", "waiting"]


V1, V2 = "veo-test/tiny:v1", "veo-test/tiny:v2"


@pytest.fixture(scope="module")
def device(docker_engine, device_engine):
    """SDK clients of both engines and the facts of two tiny releases on the device (moved once)."""
    import docker

    local = docker.DockerClient(base_url=docker_engine.host)
    client = docker.DockerClient(base_url=device_engine.host)
    facts = {}
    for key, tag in (("v1", V1), ("v2", V2)):
        build_tiny_image(docker_engine, tag, release=key)
        moved = transfer_image(local, client, tag)
        facts[key] = facts_for(client, moved.image_id, tag, None)
    yield client, facts
    local.close()
    client.close()


@pytest.fixture
def release(device, device_engine):
    """A release of v1 running healthy under a fresh name."""
    client, facts = device
    name = f"intr-{free_port()}"
    opts = RunOptions(port=free_port(), stop_timeout=5)
    deploy_container(client, facts["v1"], name, opts, 60)
    yield name, opts
    for n in (name, name + PREVIOUS_SUFFIX, name + OUTGOING_SUFFIX, name + PARKED_SUFFIX):
        device_engine.docker("rm", "-f", n, check=False)


def _running(client, name: str) -> tuple[str, str]:
    c = client.containers.get(name)
    return c.labels["io.veo-edge.deploy.image"], (c.attrs["State"].get("Health") or {}).get("Status")


def _names(client, name: str) -> set[str]:
    return {c.name for c in client.containers.list(all=True) if c.name.startswith(name)}


class _Interrupt:
    """Raise KeyboardInterrupt (what Ctrl-C, and SIGTERM/SIGHUP through the CLI, raise) at one step."""

    def __init__(self, at: str) -> None:
        self.at, self.fired = at, False

    def _fire(self) -> None:
        if not self.fired:  # once: the restore that follows waits with the same callback
            self.fired = True
            raise KeyboardInterrupt("SIGTERM")

    def step(self, name: str) -> None:
        if name == self.at:
            self._fire()

    def progress(self, *_a) -> None:
        if self.at == "waiting":
            self._fire()


@pytest.mark.parametrize("at", STEPS)
def test_an_interrupted_deploy_restores_the_previous_release(device, release, at) -> None:
    client, facts = device
    name, opts = release
    stop = _Interrupt(at)
    with pytest.raises(
        DeployInterruptedError,
        match=rf"interrupted \(SIGTERM\) while deploying veo-test/tiny:v2 as {name}; rolled back to the previous release veo-test/tiny:v1, healthy again",
    ):
        deploy_container(client, facts["v2"], name, opts, 60, stop.progress, stop.step)
    assert _running(client, name) == ("veo-test/tiny:v1", "healthy")
    assert _names(client, name) == {name}  # the new release removed, no journal left


def test_an_interrupted_rollback_keeps_the_current_release(device, release) -> None:
    client, facts = device
    name, opts = release
    deploy_container(client, facts["v2"], name, opts, 60)
    stop = _Interrupt("waiting")
    with pytest.raises(
        DeployInterruptedError,
        match=rf"interrupted \(SIGTERM\) rolling back {name}; back to veo-test/tiny:v2, healthy again",
    ):
        rollback(client, name, 60, stop.progress, stop_timeout=5)
    assert _running(client, name) == ("veo-test/tiny:v2", "healthy")
    assert _names(client, name) == {name, name + PREVIOUS_SUFFIX}


KILLER = """
import os, signal, docker
from veo_edge.deploy import RunOptions, deploy_container
from veo_edge.deploy.ship import facts_for
client = docker.DockerClient(base_url={host!r})
facts = facts_for(client, {image_id!r}, "veo-test/tiny:v2", None)
def step(name):
    if name == {at!r}:
        os.kill(os.getpid(), signal.SIGKILL)
deploy_container(client, facts, {name!r}, RunOptions(port={port}, stop_timeout=5), 60, None, step)
"""


@pytest.mark.parametrize("at", ["renamed", "stopped", "started"])
def test_a_killed_deploy_is_finished_by_the_next_command(device, device_engine, release, at) -> None:
    client, facts = device
    name, opts = release
    code = textwrap.dedent(KILLER).format(host=device_engine.host, image_id=facts["v2"].image_id, at=at,
                                          name=name, port=opts.port)  # fmt: skip
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert name + OUTGOING_SUFFIX in _names(client, name)  # the journal it left
    report = status(client, name, 60)
    if at == "started":  # the new release was already running: kept once healthy
        assert report["recovered"] == f"finished an interrupted deploy: veo-test/tiny:v2 is healthy as {name}"
        assert _running(client, name) == ("veo-test/tiny:v2", "healthy")
        assert report["previous"]["image"] == "veo-test/tiny:v1"
    else:
        assert report["recovered"].startswith(
            "undid an interrupted deploy: rolled back to the previous release"
        )
        assert _running(client, name) == ("veo-test/tiny:v1", "healthy")
    assert name + OUTGOING_SUFFIX not in _names(client, name)
    assert json.dumps(report)  # the CLI prints it as JSON
