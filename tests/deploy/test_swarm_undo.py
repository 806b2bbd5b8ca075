"""An interrupt that lands while a swarm deploy is asking the swarm to undo itself (the rollback request on
the wire) still ends in the line saying where the service stands, and exit 130. The deploy talks to the
real swarm through a unix-socket relay that holds the rollback request back, interrupts the deploy
(SIGINT, as Ctrl-C does) and never forwards that one request; every other request goes through."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from tests.deploy.test_swarm import image_id, swarm_deploy


class HoldRollback:
    """A relay from a unix socket to an engine's; a request whose head asks for ``rollback=previous``
    sends SIGINT to ``pid`` and is held (never forwarded) until the relay closes."""

    def __init__(self, upstream: Path) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="veo-relay-", dir="/tmp"))  # socket paths: 108 bytes at most
        self.path, self.upstream = self.dir / "relay.sock", upstream
        self.pid: int | None = None
        self.held = threading.Event()
        self.closing = threading.Event()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(self.path))
        self._server.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def host(self) -> str:
        return f"unix://{self.path}"

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            up.connect(str(self.upstream))
            threading.Thread(target=self._pump, args=(client, up, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if requests and b"rollback=previous" in data and self.pid is not None:
                    self.held.set()
                    os.kill(self.pid, signal.SIGINT)  # the deploy is now blocked on this request's answer
                    self.closing.wait(120)
                    return
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.closing.set()
        self._server.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def test_an_interrupt_during_the_rollback_request_still_says_where_the_service_stands(
    docker_engine, swarm_engine, test_images
) -> None:
    r = swarm_deploy(docker_engine, swarm_engine, test_images["v1"], "--name", "undo-intr",
                     "--update-monitor", "3", "--update-delay", "0", "--allow-unsigned")  # fmt: skip
    assert r.returncode == 0, r.stderr
    # v2 onto the swarm first, directly: the deploy through the relay moves no image, only asks
    import docker

    from veo_edge.deploy.transfer import transfer_image

    local, target = (docker.DockerClient(base_url=e.host) for e in (docker_engine, swarm_engine))
    transfer_image(local, target, test_images["v2"])
    local.close()
    target.close()
    relay = HoldRollback(swarm_engine.socket)
    argv = ["deploy", test_images["v2"], "--swarm", "--to", relay.host, "--name", "undo-intr",
            "--timeout", "1", "--allow-unsigned"]  # fmt: skip
    # v2 cannot be healthy within 1 s (its monitor window is 3 s): the deploy asks for the rollback
    proc = subprocess.Popen([sys.executable, "-m", "veo_edge.cli.main", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "DOCKER_HOST": docker_engine.host})  # fmt: skip
    relay.pid = proc.pid
    try:
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
        relay.close()
    said = " ".join(err.split())
    assert relay.held.is_set(), err
    assert proc.returncode == 130, err
    assert "interrupted (Ctrl-C) while deploying veo-test/app:v2 as service undo-intr (" in said, err
    assert "was not healthy within 1 s" in said, err
    # the swarm never got the request: it carries on with v2, and the line says so
    where = "interrupted while asking the swarm to undo the deploy of service undo-intr; it stands at "
    assert re.search(re.escape(where) + r"(updating|completed), on veo-test/app:v2 \(", said), err
    assert "`veo-edge deploy rollback undo-intr --swarm` asks for the rollback again" in said, err
    spec = json.loads(swarm_engine.docker("service", "inspect", "undo-intr").stdout)[0]["Spec"]
    assert spec["TaskTemplate"]["ContainerSpec"]["Image"] == image_id(docker_engine, test_images["v2"])
    swarm_engine.docker("service", "rm", "undo-intr", check=False)
