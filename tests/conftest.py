"""Shared fixtures: seeded RNGs and session-scoped builds of the small models (built once, reused).

Tests that modify a build must copy it first (``copy_build``).

Under pytest-xdist (``make test`` runs ``-n 3 --dist loadgroup``) each worker is a process of its own with
its own session fixtures. So that a build is still made once, the expensive ones (``shared``) are made
under a file lock in the directory all workers' temporary roots share, and the first worker to ask builds
while the others wait. Tests are grouped so that a test file runs on one worker (its module fixtures are
made once), every test of the session's ``cpu_image`` runs on one worker (one image build) and the
other Docker tests on one other (each group with its own engine)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from veo_edge.privacy import keep_telemetry_off

# the tests build and serve in their own processes too: as the veo-edge command does, they keep OpenVINO's
# and ONNX Runtime's usage telemetry off (OpenVINO's sent ~30 events and cost ~2 s of CPU per model
# conversion; veo_edge/privacy.py)
keep_telemetry_off()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


#: fixtures that start a Docker engine: every test that uses one (directly or not) runs in a Docker group
DOCKER_FIXTURES = frozenset({"docker_engine"})
#: the group of the cpu image, swarm and fleet-server tests (a test module may name it as its xdist_group)
FLEET_GROUP = "docker-image"


def pytest_itemcollected(item: pytest.Item) -> None:
    """Under xdist's ``loadgroup``: a group per test file, and two for the Docker tests. Marked as each
    test is collected, so the marks are there before any ``pytest_collection_modifyitems`` (xdist's
    reads them there)."""
    option = item.config.option
    # in a worker xdist sets dist to "no" and loadgroup to whether the run's --dist was loadgroup
    if not (getattr(option, "loadgroup", False) or getattr(option, "dist", "no") == "loadgroup"):
        return
    if item.get_closest_marker("xdist_group") is None:
        item.add_marker(pytest.mark.xdist_group(_group(item)))


def _group(item: pytest.Item) -> str:
    """The tests of the session's cpu image and of the swarm and fleet servers on one worker (they hold
    /tmp/veo-swarm.lock, re-entrant only within a process), the other Docker tests (small test images on
    one device) on another, each group with its engine; every other test file on any worker."""
    names = set(getattr(item, "fixturenames", ()))
    if names & {"cpu_image", "swarm_engine"}:
        return FLEET_GROUP
    if DOCKER_FIXTURES & names:
        return "docker"
    return item.nodeid.split("::")[0]


def shared(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], object]) -> Path:
    """``make(path)`` once for the whole run, whichever worker asks first; the others wait for it and
    reuse the result. ``name`` keys what is made (two fixtures that make different things must not share
    a name). A ``make`` that fails is retried by the next worker that asks, and fails there too."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's root, above each worker's own
    root = root / "shared"
    root.mkdir(exist_ok=True)
    out, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)
            make(out)
            done.touch()
    return out


def _build(tmp_path_factory: pytest.TempPathFactory, model: str, **kw) -> Path:
    from veo_edge.export.source import BuiltinSource
    from veo_edge.pipeline.build import BuildOptions, run_build

    def make(root: Path) -> None:
        run_build(BuildOptions(source=BuiltinSource(model), out=root / model, quiet=True, **kw))

    key = "-".join([model, *(f"{k}={v}" for k, v in sorted(kw.items()))])
    return shared(tmp_path_factory, f"build-{key}", make) / model


@pytest.fixture(scope="session")
def nano_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished build of vit-nano (max batch 8). Read-only: use copy_build to change it."""
    return _build(tmp_path_factory, "vit-nano")


@pytest.fixture(scope="session")
def video_nano_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished build of veo-video-nano (max batch 8). Read-only."""
    return _build(tmp_path_factory, "veo-video-nano")


@pytest.fixture(scope="session")
def video_tiny_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished build of veo-video-tiny, the full-size video model (8 frames, 2x16x16 tubelets). Read-only."""
    return _build(tmp_path_factory, "veo-video-tiny")


@pytest.fixture(scope="session")
def digits_int8_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """vit-digits (trained on real data) built --cpu-precision int8 on its own calibration set, guarded
    on its own test split. Read-only."""
    return _build(tmp_path_factory, "vit-digits", cpu_precision="int8", plugins=False)


@pytest.fixture(scope="session")
def veo_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkout's veo-edge wheel (``pip wheel`` of a copy of the checkout, so its build/ stays
    untouched), built once for the session."""
    from veo_edge.packaging.ownwheel import wheel_from_source_tree

    made: list[Path] = []

    def make(root: Path) -> None:
        root.mkdir()
        made.append(wheel_from_source_tree(Path(__file__).resolve().parents[1], root))

    root = shared(tmp_path_factory, "wheel", make)
    (wheel,) = made or root.glob("veo_edge-*.whl")
    return wheel


@pytest.fixture
def copy_build(tmp_path: Path):
    """Copy a session build into this test's tmp dir, for tests that modify or corrupt it."""

    def _copy(src: Path) -> Path:
        dst = tmp_path / src.name
        shutil.copytree(src, dst)
        return dst

    return _copy


# --- a real Docker engine (images and deploy tests) --------------------------------------------------


@pytest.fixture(scope="session")
def docker_engine():
    """A dockerd of the tests' own (data root and socket under /tmp), with the local Debian base image
    imported; stopped by its PID at the end of the session. Skips where dockerd is not installed,
    unless VEO_EDGE_REQUIRE_DOCKER=1 (CI) makes that a failure."""
    import tempfile

    from tests.support.dockerd import DockerEngine, EngineUnavailable, require_docker

    root = Path(tempfile.mkdtemp(prefix="veo-dk-", dir="/tmp"))
    engine = DockerEngine(root)
    try:
        engine.start()
    except EngineUnavailable as e:
        shutil.rmtree(root, ignore_errors=True)
        if require_docker():
            pytest.fail(f"VEO_EDGE_REQUIRE_DOCKER=1 but no Docker engine: {e}")
        pytest.skip(f"no Docker engine here: {e}")
    try:
        engine.ensure_base_image()
        yield engine
    finally:
        engine.close(wait=False)


@pytest.fixture(scope="session")
def cpu_image(docker_engine, nano_build: Path, tmp_path_factory: pytest.TempPathFactory):
    """The signed cpu image of vit-nano, built once for the session."""
    import docker

    from tests.support.dockerd import BASE_IMAGE
    from tests.support.images import TAG, ed25519_pem
    from veo_edge.packaging.context import ContextOptions, assemble_context
    from veo_edge.packaging.image import build_image
    from veo_edge.targets import get_target

    work = tmp_path_factory.mktemp("image")
    key = ed25519_pem(work / "sign.pem")
    client = docker.DockerClient(base_url=docker_engine.host, timeout=900)
    ctx = assemble_context(
        ContextOptions(
            build_dir=nano_build, target=get_target("cpu"), out=work / "ctx", base_image=BASE_IMAGE
        )
    )
    log: list[str] = []
    built = build_image(ctx, tag=TAG, sign_key=key, progress=log.append, client=client)
    print(
        f"\ncpu image {TAG}: {built.size / 1e6:.1f} MB, {len(built.manifest['files'])} files in the manifest"
    )
    yield SimpleNamespace(
        engine=docker_engine,
        client=client,
        ctx=ctx,
        built=built,
        key=key,
        work=work,
        log=log,
        build=nano_build,
    )
    client.close()
