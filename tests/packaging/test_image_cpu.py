"""End to end with a real Docker engine (tests/support/dockerd.py): the cpu image of vit-nano on the
local Debian base, built once per session through the Docker SDK and signed; run with --read-only and
host networking on a free port until Docker reports it healthy; a tritonclient inference reproduces the
build's canary; a derived image with one byte of a model file changed refuses to start."""

from __future__ import annotations

import json
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.images import TAG, ed25519_pem, infer_canary
from tests.support.net import free_port
from veo_edge.errors import ImageTrustError

MAX_IMAGE_BYTES = 500 * 1000 * 1000  # the target for the cpu image


def _wait_healthy(engine, name: str, timeout: float = 240.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = json.loads(engine.docker("inspect", "-f", "{{json .State}}", name).stdout)
        health = (state.get("Health") or {}).get("Status")
        if health == "healthy":
            probe = json.loads(engine.docker("inspect", "-f", "{{json .Config.Healthcheck}}", name).stdout)
            assert probe["Test"] == ["CMD", "/opt/veo-edge/healthcheck/healthcheck.sh"], probe  # the image's
            return health
        if not state["Running"]:
            logs = engine.docker("logs", name, check=False)
            pytest.fail(f"container exited {state['ExitCode']}: {logs.stdout[-800:]} {logs.stderr[-800:]}")
        time.sleep(1.0)
    logs = engine.docker("logs", name, check=False)
    pytest.fail(f"not healthy within {timeout:.0f} s (health {health}): {logs.stderr[-800:]}")


def _run_detached(engine, image: str, name: str, port: int, *env: str) -> None:
    """The image's own HEALTHCHECK (command, timeout, start period, retries) decides, probed every 2 s
    instead of the image's 10 s: Docker says healthy at the first probe after the server is ready, not at
    the next multiple of 10 s (the Docker 20.10 here has no --health-start-interval)."""
    args = ["run", "-d", "--name", name, "--read-only", "--tmpfs", "/cache:rw,uid=10001,gid=10001"]
    args += ["--health-interval", "2s"]
    args += ["--network", "host", "-e", f"VEO_EDGE_PORT={port}", "-e", "VEO_EDGE_HOST=127.0.0.1"]
    args += ["-e", f"VEO_EDGE_GRPC_PORT={free_port()}"]  # host networking: never Triton's fixed 8001
    for e in env:
        args += ["-e", e]
    engine.docker(*args, image)


def test_image_labels_user_healthcheck_size(cpu_image) -> None:
    from veo_edge.packaging.image import LABEL_KEY, LABEL_MANIFEST

    attrs = cpu_image.client.images.get(TAG).attrs
    labels, config = attrs["Config"]["Labels"], attrs["Config"]
    build_manifest = json.loads((cpu_image.build / "manifest.json").read_text())
    assert labels["io.veo-edge.model.name"] == "vit-nano"
    assert labels["io.veo-edge.model.sha256"] == build_manifest["artifacts"]["onnx"]["sha256"]
    assert labels["org.opencontainers.image.revision"] == cpu_image.ctx.build_args["VCS_REF"]
    # the venv stage's last image (~560 MB, untagged) is the build cache: kept, and said; the engine is
    # named as given
    assert any(
        line.startswith("image: 1 untagged stage image(s) of this build kept as its build cache")
        for line in cpu_image.log
    )
    assert any(
        f"with the engine at DOCKER_HOST={cpu_image.engine.host}" in line for line in cpu_image.log
    ) or (not any("DOCKER_HOST=" in line for line in cpu_image.log))
    assert labels["io.veo-edge.target"] == "cpu" and labels["io.veo-edge.precision"] == "fp32"
    assert labels["org.opencontainers.image.version"] == cpu_image.ctx.build_args["VEO_EDGE_VERSION"]
    for key in ("cuda", "tensorrt", "jetpack"):
        assert labels[f"io.veo-edge.{key}.version"] == "none"
    assert labels[LABEL_KEY] == cpu_image.built.manifest["signing_key"]
    assert len(labels[LABEL_MANIFEST]) == 64
    assert config["User"] == "10001:10001"
    assert config["Healthcheck"]["Test"] == ["CMD", "/opt/veo-edge/healthcheck/healthcheck.sh"]
    assert config["Entrypoint"] == ["/opt/veo-edge/bin/entrypoint.sh"]
    assert attrs["Size"] <= MAX_IMAGE_BYTES, f"cpu image is {attrs['Size'] / 1e6:.0f} MB"
    # the manifest covers the venv, the model, the scripts, the SELinux module and the SBOM
    files = cpu_image.built.manifest["files"]
    for rel in ("model/openvino/model.bin", "bin/entrypoint.sh", "healthcheck/healthcheck.sh",
                "selinux/veo_edge.pp", "sbom.cdx.json", "requirements.lock"):  # fmt: skip
        assert rel in files
    assert any(p.startswith("venv/lib/python3.11/site-packages/openvino/") for p in files)
    assert not any("torch" in p.split("/")[:5] for p in files)
    # the venv is pruned (veo_edge.packaging.prune): no Intel GPU plugin, no tests, no debug sections
    site = "venv/lib/python3.11/site-packages/"
    assert f"{site}openvino/libs/libopenvino_intel_cpu_plugin.so" in files
    assert not any(
        p.startswith((f"{site}openvino/libs/libopenvino_intel_gpu", f"{site}numpy/tests/")) for p in files
    )
    (ext,) = (p for p in files if p.startswith(f"{site}ml_dtypes/_ml_dtypes_ext"))
    assert files[ext]["bytes"] < 5_000_000, f"ml_dtypes' module is {files[ext]['bytes']} bytes: not stripped"
    # next to the image: the same manifest, signature and key
    inside = json.dumps(cpu_image.built.manifest, sort_keys=True)
    assert (
        json.dumps(json.loads((cpu_image.ctx.path / "image-manifest.json").read_text()), sort_keys=True)
        == inside
    )
    assert (cpu_image.ctx.path / "image-manifest.dsse.json").is_file()
    # the build output was streamed into the progress display
    assert any(line.startswith("Step ") for line in cpu_image.log)


def test_read_only_container_gets_healthy_and_serves_the_canary(cpu_image) -> None:
    engine, port, name = cpu_image.engine, free_port(), "veo-test-cpu"
    _run_detached(engine, TAG, name, port)
    try:
        _wait_healthy(engine, name)
        result = infer_canary(port, cpu_image.build)
        assert result.ok, result
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=10) as r:
            ready = json.loads(r.read())
        assert ready["ready"] and ready["active_backend"] == "openvino"
        # ONNX Runtime's CPU provider is in the image: the warm standby a failed batch is re-run on
        assert ready["standby_backend"] == "onnxruntime", ready
        logs = engine.docker("logs", name)
        out = logs.stdout + logs.stderr
        assert "every sha256 matches the image manifest; signed by sha256:" in out
        assert "serving with OpenVINO on the CPU" in out
    finally:
        engine.docker("rm", "-f", name, check=False)


def test_gpu_entrypoint_without_a_gpu_falls_back_to_openvino_and_says_so(cpu_image) -> None:
    """The entrypoint's GPU-target path, on a machine without a GPU: it says it falls back, and the
    readiness body names the CPU backend and why the GPU ones were skipped."""
    engine, port, name = cpu_image.engine, free_port(), "veo-test-nogpu"
    _run_detached(engine, TAG, name, port, "VEO_EDGE_TARGET=a100")
    try:
        _wait_healthy(engine, name)
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=10) as r:
            ready = json.loads(r.read())
        assert ready["active_backend"] == "openvino"
        assert {s["backend"] for s in ready["fallback"]["skipped"]} >= {"tensorrt"}
        logs = engine.docker("logs", name)
        assert "FALLBACK: no GPU visible in this container" in logs.stderr
    finally:
        engine.docker("rm", "-f", name, check=False)


def test_one_changed_byte_in_a_model_file_refuses_to_start(cpu_image, tmp_path: Path) -> None:
    from veo_edge.packaging.imagetrust import verify_image

    engine = cpu_image.engine
    data = bytearray((cpu_image.build / "openvino" / "model.bin").read_bytes())
    data[len(data) // 2] ^= 0x01
    (tmp_path / "model.bin").write_bytes(bytes(data))
    (tmp_path / "Dockerfile").write_text(
        f"FROM {TAG}\nCOPY model.bin /opt/veo-edge/model/openvino/model.bin\n"
    )
    tampered = "veo-edge/vit-nano:test-tampered"
    engine.docker("build", "-q", "-t", tampered, str(tmp_path))
    try:
        r = engine.docker(
            "run", "--rm", "--read-only", "--network", "none", tampered, check=False, timeout=120
        )
        assert r.returncode == 65, r.stdout + r.stderr
        assert "REFUSING TO START" in r.stderr
        assert "model/openvino/model.bin has sha256" in r.stderr
        assert "veo-edge serving" not in r.stdout + r.stderr
        # a changed image has no signature of its own: refused for that first; past it (--allow-unsigned)
        # the file check still names the changed file
        with pytest.raises(ImageTrustError, match=r"is unsigned: no signature image"):
            verify_image(tampered, client=cpu_image.client)
        with pytest.raises(ImageTrustError, match=r"model/openvino/model.bin has sha256"):
            verify_image(tampered, client=cpu_image.client, allow_unsigned=True)
    finally:
        engine.docker("rmi", "-f", tampered, check=False)


def test_verify_from_outside_pins_the_key(cpu_image, tmp_path: Path) -> None:
    import shutil
    import subprocess
    import sys

    from veo_edge.packaging import localkey, signing
    from veo_edge.packaging.imagetrust import verify_image

    pub = signing.load_private_key(cpu_image.key).public_key()
    volumes = {v.id for v in cpu_image.client.volumes.list()}
    report = verify_image(TAG, trusted_key=signing.fingerprint(pub), client=cpu_image.client)
    assert report["ok"] and report["signed_by"] == signing.fingerprint(pub)
    # the containers it reads the image through go with the anonymous /cache volume the image declares
    assert {v.id for v in cpu_image.client.volumes.list()} == volumes
    other = signing.fingerprint(signing.load_private_key(ed25519_pem(tmp_path / "other.pem")).public_key())
    code = "from veo_edge.cli.main import main; import sys; main(sys.argv[1:])"
    env = {**cpu_image.engine.env, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env.pop("VEO_EDGE_TRUSTED_KEY", None)
    none = subprocess.run(
        [sys.executable, "-c", code, "verify", TAG], env=env, capture_output=True, text=True
    )
    assert none.returncode == ImageTrustError.exit_code and "no trusted key" in none.stderr, none.stderr
    # the machine that built it (its local key signed it) pins that key without being told
    (tmp_path / "config" / "veo-edge").mkdir(parents=True)
    shutil.copy(cpu_image.key, tmp_path / "config" / "veo-edge" / localkey.PRIVATE_NAME)
    (tmp_path / "config" / "veo-edge" / localkey.PUBLIC_NAME).write_bytes(signing.public_pem(pub))
    ok = subprocess.run([sys.executable, "-c", code, "verify", TAG], env=env, capture_output=True, text=True)
    assert ok.returncode == 0 and "every sha256 matches" in ok.stdout, ok.stderr
    assert "trusted: the local key" in ok.stdout
    bad = subprocess.run([sys.executable, "-c", code, "verify", TAG, "--key", other], env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == ImageTrustError.exit_code and "not by the trusted key" in bad.stderr


def test_save_carries_the_signature_image_so_a_loaded_image_verifies_on_another_engine(
    cpu_image, tmp_path: Path
) -> None:
    """An air-gapped device gets the image by ``docker load``: the archive holds the signature image too
    (both named), and a second engine that never saw either verifies the loaded image by the pin."""
    import docker

    from tests.support.dockerd import DockerEngine
    from veo_edge.packaging import signing
    from veo_edge.packaging.engineimages import save_image
    from veo_edge.packaging.imagetrust import verify_image

    built = cpu_image.built
    out = save_image(cpu_image.client, TAG, tmp_path / "img.tar", lambda _m: None, built.signature_tag)
    with tarfile.open(out) as tar:
        index = json.loads(tar.extractfile("manifest.json").read())
    assert sorted(t for i in index for t in i["RepoTags"]) == sorted([TAG, built.signature_tag])
    assert not list(tmp_path.glob(".img.tar.part-*"))
    device = DockerEngine(Path(tempfile.mkdtemp(prefix="veo-air-", dir="/tmp"))).start()
    try:
        device.docker("load", "-i", str(out))
        client = docker.DockerClient(base_url=device.host, timeout=300)
        pin = signing.fingerprint(signing.load_private_key(cpu_image.key).public_key())
        report = verify_image(TAG, pin, client=client)
        assert report["verified"] and report["image_id"] == built.id
        assert report["signature"] == f"signature image {built.signature_tag}"
        client.close()
    finally:
        device.close()


def test_a_builds_dangling_stage_images_go_and_other_builds_stay(docker_engine, tmp_path: Path) -> None:
    """The classic builder leaves the last image of every stage but the target untagged: the build's own
    are removed (found from its output), a dangling image another build left is not."""
    import docker

    from tests.support.dockerd import BASE_IMAGE
    from veo_edge.packaging.engineimages import BuildTrace, drop_stage_images
    from veo_edge.packaging.image import _stream

    client = docker.DockerClient(base_url=docker_engine.host, timeout=300)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nRUN echo other > /other\n")
    other = _stream(client.api.build(path=str(tmp_path / "other"), rm=True, decode=True), print, "other")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE} AS stage\nRUN echo stage > /stage\nFROM {BASE_IMAGE} AS final\n"
        "COPY --from=stage /stage /stage\nRUN echo final > /final\n"
    )
    trace = BuildTrace()
    said: list[str] = []
    final = _stream(client.api.build(path=str(ctx), tag="veo-test/stages:1", rm=True, decode=True),
                    said.append, "stages", trace)  # fmt: skip
    dangling = {i.id for i in client.images.list(filters={"dangling": True})}
    assert other in dangling and len(dangling) >= 2  # the stage's image and the other build's
    drop_stage_images(client, trace, said.append)
    after = {i.id for i in client.images.list(filters={"dangling": True})}
    assert other in after and not (after - dangling), after
    assert len(dangling - after) == 1 and "image: removed 1 dangling stage image(s) of this build" in said[-1]
    assert client.images.get(final).tags == ["veo-test/stages:1"]
    client.images.remove("veo-test/stages:1")
    client.images.remove(other)
    client.close()


def test_a_base_image_the_engine_lacks_and_cannot_pull_is_named_with_the_way_out(cpu_image) -> None:
    """The test engine reaches no registry: a context on a base it does not hold fails in `docker build`'s
    pull, and the error says the base is missing and points to --base-image."""
    import dataclasses

    from veo_edge.errors import ImageBuildError
    from veo_edge.packaging.image import build_image

    absent = "veo-test/absent-base:1"
    ctx = dataclasses.replace(cpu_image.ctx, build_args={**cpu_image.ctx.build_args, "BASE_IMAGE": absent})
    with pytest.raises(ImageBuildError) as info:
        build_image(ctx, tag="veo-edge/vit-nano:test-absent-base", client=cpu_image.client)
    message = str(info.value)
    # asked before any build step (the engine is asked to pull it first), naming the base given
    assert (
        message.startswith(f"the base image {absent} is not in the engine at ")
        and "could not be pulled" in message
    )
    assert "--base-image" in message and "python:3.11-slim-bookworm" not in message
