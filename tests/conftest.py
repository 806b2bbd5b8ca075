"""Shared fixtures: seeded RNGs and session-scoped builds of the small models (built once, reused).

Tests that modify a build must copy it first (``copy_build``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _build(tmp_path_factory: pytest.TempPathFactory, model: str, **kw) -> Path:
    from veo_edge.export.source import BuiltinSource
    from veo_edge.pipeline.build import BuildOptions, run_build

    out = tmp_path_factory.mktemp("builds") / model
    run_build(BuildOptions(source=BuiltinSource(model), out=out, quiet=True, **kw))
    return out


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

    return wheel_from_source_tree(Path(__file__).resolve().parents[1], tmp_path_factory.mktemp("wheel"))


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

    from tests.support.dockerd import DockerEngine, EngineUnavailable, remove_root, require_docker

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
        engine.stop()
        remove_root(root)


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
