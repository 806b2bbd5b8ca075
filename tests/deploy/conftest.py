"""Engines and images for the deploy tests, all on this machine.

``docker_engine`` (tests/conftest.py) is the build host: the images are built there. ``device_engine`` is
a second dockerd with its own data root and socket standing in for a Jetson or an A100 host; ``swarm_engine``
is a third one, a single-node swarm manager whose node is labelled ``veo.target=cpu``. The small test
images are real images FROM the local Debian base with a HEALTHCHECK whose verdict the image decides (a
file the main process writes, or always failing, or a main process that exits), so the deploy's health
gate and rollback run against Docker's own health status.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.support.dockerd import BASE_IMAGE, DockerEngine, EngineUnavailable
from tests.support.net import free_port
from tests.support.servers import fleet_lock

HEALTH = "--interval=1s --timeout=3s --retries=2"
IMAGES = {
    # healthy one second after start; RELEASE distinguishes image ids; PID 1 exits on SIGTERM (as the
    # server does), so a stop does not wait out its timeout
    "good": (
        f'HEALTHCHECK {HEALTH} CMD ["python3", "-c", "import os, sys; sys.exit(not os.path.exists(\'/tmp/ok\'))"]\n'
        'CMD ["python3", "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); '
        "time.sleep(1); open('/tmp/ok', 'w').write('ok'); time.sleep(10**6)\"]\n"
    ),
    "unhealthy": (
        f'HEALTHCHECK {HEALTH} CMD ["python3", "-c", "print(\'model canary mismatch: max abs 3.2 > 1e-3\'); raise SystemExit(1)"]\n'
        'CMD ["python3", "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); '
        "print('serving a broken model', flush=True); time.sleep(10**6)\"]\n"
    ),
    "crashing": (
        f'HEALTHCHECK {HEALTH} CMD ["true"]\n'
        'CMD ["python3", "-c", "print(\'fatal: cannot open model.bin\', flush=True); raise SystemExit(3)"]\n'
    ),
    "nohealth": 'CMD ["sleep", "1000000"]\n',
}


def build_image(engine: DockerEngine, kind: str, tag: str, release: str = "1") -> str:
    ctx = Path(tempfile.mkdtemp(prefix="veo-img-"))
    try:
        (ctx / "Dockerfile").write_text(
            f"FROM {BASE_IMAGE}\nLABEL io.veo-edge.target=cpu io.veo-edge.release={release}\n"
            f"USER 10001\n{IMAGES[kind]}"
        )
        r = engine.docker("build", "-q", "-t", tag, str(ctx), check=False)
        assert r.returncode == 0, f"docker build of the {kind} test image failed: {r.stderr}"
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    return tag


#: a ~2 MB image made of the base image's shell, sleep and C library (no Python): healthy one second after
#: start, for tests whose point is moving an image that the target does not have yet (over ssh, through a
#: registry) without moving the 170 MB base each time. A file ``/cache/sick`` (in the release's cache
#: volume, which ``docker cp`` can write even into a stopped read-only container) fails its healthcheck,
#: which prints the file's first line: a test's way to make a release turn unhealthy from outside
TINY = f"""FROM scratch
COPY --from={BASE_IMAGE} /lib/x86_64-linux-gnu/libc.so.6 /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 /lib/x86_64-linux-gnu/
COPY --from={BASE_IMAGE} /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 /lib64/
COPY --from={BASE_IMAGE} /bin/dash /bin/sh
COPY --from={BASE_IMAGE} /bin/sleep /bin/sleep
ADD tmp.tar /
HEALTHCHECK {HEALTH} CMD ["/bin/sh", "-c", "if [ -e /cache/sick ]; then read -r why < /cache/sick; echo sick: $why; exit 1; fi; test -f /tmp/ok"]
CMD ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 1; : > /tmp/ok; while :; do sleep 1; done"]
"""


def build_tiny_image(engine: DockerEngine, tag: str, release: str, healthy: bool = True) -> str:
    """The tiny image; ``healthy=False``: its main process never reports ready, so it turns unhealthy."""
    ctx = Path(tempfile.mkdtemp(prefix="veo-img-"))
    body = TINY if healthy else TINY.replace("sleep 1; : > /tmp/ok; ", "")
    try:
        # /tmp as in any distribution (1777): without it in the image, Docker 20.10 mounts the tmpfs of a
        # restarted container unwritable for a non-root user
        import tarfile

        with tarfile.open(ctx / "tmp.tar", "w") as tar:
            info = tarfile.TarInfo("tmp")
            info.type, info.mode = tarfile.DIRTYPE, 0o1777
            tar.addfile(info)
        (ctx / "Dockerfile").write_text(
            body + f"LABEL io.veo-edge.target=cpu io.veo-edge.release={release}\nUSER 10001\n"
        )
        r = engine.docker("build", "-q", "-t", tag, str(ctx), check=False)
        assert r.returncode == 0, f"docker build of the tiny test image failed: {r.stderr}"
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    return tag


@pytest.fixture(scope="session")
def test_images(docker_engine) -> dict[str, str]:
    """The small test images on the build host, by role."""
    return {
        "v1": build_image(docker_engine, "good", "veo-test/app:v1", "1"),
        "v2": build_image(docker_engine, "good", "veo-test/app:v2", "2"),
        "unhealthy": build_image(docker_engine, "unhealthy", "veo-test/app:unhealthy"),
        "crashing": build_image(docker_engine, "crashing", "veo-test/app:crashing"),
        "nohealth": build_image(docker_engine, "nohealth", "veo-test/app:nohealth"),
    }


def _engine(prefix: str, extra: list[str] | None = None) -> DockerEngine:
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    engine = DockerEngine(root, extra_args=extra or [])
    try:
        engine.start()
    except EngineUnavailable as e:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"the build host's engine ran but a second one did not start: {e}")
    return engine


@pytest.fixture(scope="session")
def device_engine(docker_engine):
    """A second engine, the "device": deploys transfer images into it."""
    engine = _engine("veo-dev-")
    yield engine
    engine.close(wait=False)


@pytest.fixture(scope="session")
def swarm_engine(docker_engine):
    """A third engine, a single-node swarm manager on loopback ports of its own, node labelled cpu; it
    holds /tmp/veo-swarm.lock while it lives."""
    with fleet_lock():
        yield from _swarm_engine()


def _swarm_engine():
    engine = _engine("veo-sw-")
    listen = free_port()
    r = engine.docker(
        "swarm", "init", "--advertise-addr", "127.0.0.1", "--listen-addr", f"127.0.0.1:{listen}",
        "--data-path-port", str(free_port(20000, 49151)), check=False,
    )  # fmt: skip
    assert r.returncode == 0, f"docker swarm init failed: {r.stderr}"
    node = engine.docker("node", "ls", "-q").stdout.split()[0]
    engine.docker("node", "update", "--label-add", "veo.target=cpu", node)
    yield engine
    for sid in engine.docker("service", "ls", "-q", check=False).stdout.split():
        engine.docker("service", "rm", sid, check=False)
    engine.docker("swarm", "leave", "--force", check=False)
    engine.close(wait=False)
