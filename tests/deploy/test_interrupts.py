"""A deploy interrupted at each of its steps always leaves a healthy release running: Ctrl-C (or SIGTERM,
which the CLI turns into the same exception) restores the previous release at once; a deploy killed
outright (SIGKILL) leaves its journal (``NAME-outgoing``) on the device, and the next ``deploy status``
finishes it. A rollback whose restart fails (the engine cannot start the previous release, or it starts
but is not healthy) keeps that container under NAME and says so. Real containers on the "device" engine,
health from Docker's own HEALTHCHECK."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.cli.test_cli import veo
from tests.deploy.conftest import build_tiny_image
from tests.support.net import free_port
from veo_edge.deploy import RunOptions, deploy_container, rollback, status
from veo_edge.deploy.device import OUTGOING_SUFFIX, PARKED_SUFFIX, PREVIOUS_SUFFIX
from veo_edge.deploy.ship import facts_for
from veo_edge.deploy.transfer import transfer_image
from veo_edge.errors import DeployInterruptedError, RollbackFailedError

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
    device_engine.docker("volume", "rm", "-f", opts.volume(name), check=False)


def _running(client, name: str) -> tuple[str, str]:
    c = client.containers.get(name)
    return c.labels["io.veo-edge.deploy.image"], (c.attrs["State"].get("Health") or {}).get("Status")


def _names(client, name: str) -> set[str]:
    return {c.name for c in client.containers.list(all=True) if c.name.startswith(name)}


class _Interrupt:
    """Raise KeyboardInterrupt (what Ctrl-C, and SIGTERM/SIGHUP through the CLI, raise) at one step."""

    def __init__(self, at: str, signal_name: str = "SIGTERM") -> None:
        self.at, self.fired, self.signal_name = at, False, signal_name

    def _fire(self) -> None:
        if not self.fired:  # once: the restore that follows waits with the same callback
            self.fired = True
            # the CLI names SIGTERM and SIGHUP; Python's own Ctrl-C (SIGINT) comes with no name
            raise KeyboardInterrupt(self.signal_name) if self.signal_name else KeyboardInterrupt()

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
    stop = _Interrupt(at, "" if at == "waiting" else "SIGTERM")  # a Ctrl-C while waiting
    said = "SIGINT, Ctrl-C" if at == "waiting" else "SIGTERM"
    with pytest.raises(
        DeployInterruptedError,
        match=rf"interrupted \({said}\) while deploying veo-test/tiny:v2 as {name}; rolled back to the previous release veo-test/tiny:v1, healthy again",
    ):
        deploy_container(client, facts["v2"], name, opts, 60, stop.progress, stop.step)
    assert _running(client, name) == ("veo-test/tiny:v1", "healthy")
    assert _names(client, name) == {name}  # the new release removed, no journal left


def test_an_interrupted_rollback_keeps_the_current_release(device, release) -> None:
    client, facts = device
    name, opts = release
    deploy_container(client, facts["v2"], name, opts, 60)
    stop = _Interrupt("waiting", "")  # Ctrl-C: named, not "interrupted ()"
    with pytest.raises(
        DeployInterruptedError,
        match=rf"interrupted \(SIGINT, Ctrl-C\) rolling back {name}; back to veo-test/tiny:v2, healthy again",
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


# --- a rollback whose restart fails ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def bad(docker_engine, device):
    """The facts of a tiny release that never becomes healthy, on the device."""
    import docker

    client, _ = device
    local = docker.DockerClient(base_url=docker_engine.host)
    tag = build_tiny_image(docker_engine, "veo-test/tiny:bad", release="bad", healthy=False)
    moved = transfer_image(local, client, tag)
    local.close()
    return facts_for(client, moved.image_id, tag, None)


class _Sabotage:
    """While the new release is waited for, break the stopped outgoing one for real (once)."""

    def __init__(self, name: str, act) -> None:
        self.name, self.act, self.done = name, act, False

    def progress(self, container: str, *_a) -> None:
        if container == self.name and not self.done:
            self.done = True
            self.act()


def _failed_deploy(client, bad, name: str, opts, act) -> str:
    """Deploy the bad release over ``name``, ``act`` on the stopped previous release while the deploy
    waits; the RollbackFailedError's message, checked to start with the bad release's verdict."""
    sabotage = _Sabotage(name, act)
    with pytest.raises(RollbackFailedError) as raised:
        deploy_container(client, bad, name, opts, 30, sabotage.progress)
    message = str(raised.value)
    assert sabotage.done
    assert message.startswith(
        f"veo-test/tiny:bad did not become healthy as {name}: Docker reports it unhealthy; "
    )
    return message


def test_a_rollback_whose_restart_fails_keeps_the_previous_container_and_says_so(
    device, device_engine, release, bad
) -> None:
    client, _ = device
    name, opts = release

    def lose_the_cache_volume() -> None:  # its data directory gone: the engine cannot mount it any more
        volume = json.loads(device_engine.docker("volume", "inspect", opts.volume(name)).stdout)[0]
        shutil.rmtree(volume["Mountpoint"])

    message = _failed_deploy(client, bad, name, opts, lose_the_cache_volume)
    assert (
        f"; the previous release veo-test/tiny:v1 is kept as container {name} but did not start again ("
        in message
    )
    assert "error mounting" in message  # the engine's own reason
    assert f"start it by hand (docker start {name}) once that is fixed" in message
    assert _names(client, name) == {name}  # the bad release removed, v1 kept under NAME, no journal left
    assert client.containers.list(all=True, filters={"ancestor": bad.image_id}) == []
    assert client.containers.get(name).labels["io.veo-edge.deploy.image"] == "veo-test/tiny:v1"

    report = status(client, name, 30)
    assert report["recovered"] is None  # nothing to finish: the journal was closed
    current = report["current"]
    assert (current["container"], current["image"], current["state"]) == (name, "veo-test/tiny:v1", "exited")
    assert "error mounting" in current["error"]  # why it is not running, where the message sends the user
    r = veo("deploy", "status", name, "--to", device_engine.host)
    assert r.returncode == 0, r.stderr
    assert re.match(rf"current: {name} veo-test/tiny:v1 exited\S* \(.*error mounting", r.stdout)


def test_a_rollback_whose_restart_is_unhealthy_keeps_the_previous_container_and_says_so(
    device, device_engine, release, bad, tmp_path
) -> None:
    client, _ = device
    name, opts = release
    sick = tmp_path / "sick"
    sick.write_text("cache checksum mismatch\n")

    def make_it_sick() -> None:  # the tiny image's healthcheck fails while /cache/sick exists
        device_engine.docker("cp", str(sick), f"{name + OUTGOING_SUFFIX}:/cache/sick")

    message = _failed_deploy(client, bad, name, opts, make_it_sick)
    assert (
        f"; the release veo-test/tiny:v1 was restarted under {name} but is not healthy either "
        "(Docker reports it unhealthy)" in message
    )
    assert _names(client, name) == {name}
    assert client.containers.list(all=True, filters={"ancestor": bad.image_id}) == []
    report = status(client, name, 30)
    assert report["recovered"] is None
    current = report["current"]
    assert (current["container"], current["image"], current["state"], current["health"]) == (
        name, "veo-test/tiny:v1", "running", "unhealthy"
    )  # fmt: skip
    assert current["last_healthcheck"] == "sick: cache checksum mismatch"
