"""The signature covers what runs: the session's signed cpu image, changed as an attacker would (its
entrypoint, LD_PRELOAD, PYTHONPATH, user, an added layer, a swapped base layer, a copied or a new
signature), is refused by ``veo-edge verify`` and by the deploy's check, before anything is transferred
or started; files planted on the cache volume are refused from outside and by the container itself."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.images import TAG, ed25519_pem
from tests.support.tamper import CHANGED, CHANGES, derive, swap_base_layer
from veo_edge.errors import ImageTrustError
from veo_edge.packaging import attest, signing

REPO = "veo-edge/vit-nano"
CLI = "from veo_edge.cli.main import main; import sys; main(sys.argv[1:])"


@pytest.fixture(scope="module")
def pin(cpu_image):
    return signing.fingerprint(signing.load_private_key(cpu_image.key).public_key())


@pytest.fixture(scope="module")
def tampered(cpu_image):
    """Each change of CHANGES on top of the signed image, tagged in the same repository."""
    tags = {
        kind: derive(cpu_image.engine, TAG, f"{REPO}:tampered-{kind}", line) for kind, line in CHANGES.items()
    }
    yield tags
    cpu_image.engine.docker("rmi", "-f", *tags.values(), check=False)


def veo(engine, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLI, *map(str, args)], env={**engine.env, **(env or {})},
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_the_signed_image_verifies_by_its_id_and_its_signature_lies_beside_it(cpu_image, pin) -> None:
    from veo_edge.packaging.imagetrust import verify_image

    built = cpu_image.built
    assert built.signature_tag == f"{REPO}:sha256-{built.id.split(':')[1]}.sig"
    sig = cpu_image.client.images.get(built.signature_tag)
    assert sig.labels[attest.LABEL_SUBJECT] == built.id  # a separate image: it cannot change the signed ID
    report = verify_image(TAG, pin, client=cpu_image.client)
    assert report["verified"] and report["image_id"] == built.id and report["signed_by"] == pin
    assert report["signature"] == f"signature image {built.signature_tag}"
    statement = json.loads(
        signing.open_envelope(built.signature_file.read_bytes(), "f", attest.PAYLOAD_TYPE).payload
    )
    assert statement["subject"][0]["digest"]["sha256"] == built.id.split(":")[1]
    # the detached file says the same; a key that did not sign is refused, and no key at all too
    assert verify_image(TAG, pin, client=cpu_image.client, signature=built.signature_file)["verified"]
    other = signing.fingerprint(signing.load_private_key(ed25519_pem(cpu_image.work / "o.pem")).public_key())
    with pytest.raises(ImageTrustError, match=f"is signed by {pin}, not by the trusted key {other}"):
        verify_image(TAG, other, client=cpu_image.client)


@pytest.mark.parametrize("kind", list(CHANGES))
def test_a_changed_image_is_refused_by_verify_and_by_deploy(cpu_image, pin, tampered, kind) -> None:
    from veo_edge.deploy.ship import verify_for_deploy
    from veo_edge.packaging.imagetrust import verify_image

    tag, client = tampered[kind], cpu_image.client
    changed = r"is unsigned: no signature image .*has signatures for other image IDs only.*changed after it was signed"
    with pytest.raises(ImageTrustError, match=changed) as info:
        verify_image(tag, pin, client=client)
    # and what changed: the config fields that differ from the signed image's, that one only
    said = str(info.value).split(f"against the signed image {cpu_image.built.id[:19]}: ", 1)[1].split(";")[0]
    assert said == CHANGED[kind], str(info.value)
    with pytest.raises(ImageTrustError, match=changed):
        verify_for_deploy(client, client, tag, pin, None, False)
    # the original signature offered for it (copied beside it, or as the file): names another image ID
    with pytest.raises(
        ImageTrustError, match=rf"the signature is for image {cpu_image.built.id}, not for this"
    ):
        verify_image(tag, pin, client=client, signature=cpu_image.built.signature_file)


def test_a_copied_signature_and_a_re_signed_image_are_refused(cpu_image, pin, tampered, tmp_path) -> None:
    from veo_edge.packaging.imagetrust import verify_image

    client, tag = cpu_image.client, tampered["ld_preload"]
    tampered_id = client.images.get(tag).id
    # the original signature image copied to the name a signature of the changed image would have
    client.images.get(cpu_image.built.signature_tag).tag(REPO, f"sha256-{tampered_id.split(':')[1]}.sig")
    with pytest.raises(
        ImageTrustError,
        match=rf"signature is for image {cpu_image.built.id}, not for this image's ID {tampered_id}",
    ):
        verify_image(tag, pin, client=client)
    # re-signed by the attacker's own key, signature image and all: only the pin tells
    theirs = signing.load_private_key(ed25519_pem(tmp_path / "theirs.pem"))
    raw = (cpu_image.ctx.path / "image-manifest.json").read_bytes()
    envelope = attest.sign_image(tampered_id, REPO, raw, {}, theirs)
    attest.store_signature_image(client, REPO, tampered_id, envelope)
    with pytest.raises(
        ImageTrustError,
        match=f"is signed by {signing.fingerprint(theirs.public_key())}, not by the trusted key {pin}",
    ):
        verify_image(tag, pin, client=client)
    # from the command line: verify and deploy refuse it (exit 43) and start nothing
    pub = tmp_path / "pub.pem"
    pub.write_bytes(signing.public_pem(signing.load_private_key(cpu_image.key).public_key()))
    r = veo(cpu_image.engine, "verify", tag, "--key", pub)
    assert r.returncode == 43 and "not by the trusted key" in r.stderr, r.stderr
    r = veo(
        cpu_image.engine,
        "deploy",
        tag,
        "--to",
        cpu_image.engine.host,
        "--name",
        "resigned",
        "--verify-key",
        pub,
    )
    assert r.returncode == 43 and "not by the trusted key" in r.stderr, r.stderr
    assert cpu_image.engine.docker("inspect", "resigned", check=False).returncode != 0
    # --allow-unsigned opts out, loudly
    r = veo(cpu_image.engine, "verify", tag, "--key", pub, "--allow-unsigned")
    assert r.returncode == 0 and "WARNING (--allow-unsigned)" in r.stderr, r.stderr
    assert r.stdout.startswith("accepted UNVERIFIED") and "verified" not in r.stdout.replace("UNVERIFIED", "")
    assert "pass --allow-unsigned" not in r.stderr  # it was passed: the warning says only what is wrong
    # an image the engine does not have is its own exit code, the same from verify and deploy
    r = veo(cpu_image.engine, "verify", f"{REPO}:no-such-tag", "--key", pub)
    assert r.returncode == 49 and "is not in the engine" in r.stderr, r.stderr


@pytest.mark.slow
def test_a_swapped_base_layer_is_refused(cpu_image, pin) -> None:
    """Nothing under /opt/veo-edge changes, so the in-image manifest still matches: only the ID can tell."""
    from veo_edge.packaging.imagetrust import verify_image

    tag = swap_base_layer(cpu_image.client, TAG, f"{REPO}:tampered-base")
    try:
        layers = [cpu_image.client.images.get(t).attrs["RootFS"]["Layers"] for t in (TAG, tag)]
        assert layers[0][0] != layers[1][0] and layers[0][1:] == layers[1][1:]
        with pytest.raises(ImageTrustError, match="changed after it was signed"):
            verify_image(tag, pin, client=cpu_image.client)
    finally:
        cpu_image.engine.docker("rmi", "-f", tag, check=False)


def _planted_volume(engine, volume: str, manifest_sha: str) -> None:
    """A cache volume with what someone with write access to it would leave for the next start."""
    own = f"/cache/engines/{manifest_sha[:16]}"
    sidecar = json.dumps({"format": 1, "key": {"model_sha256": "f" * 64, "plugin_sha256": None}, "bytes": 6})
    script = (
        "set -e; mkdir -p /cache/.local/lib/python3.11/site-packages /cache/pylib " + own + "; "
        "echo 'import sys; print(\"PTH-RAN\", file=sys.stderr)' > /cache/.local/lib/python3.11/site-packages/evil.pth; "
        "echo 'import sys; print(\"SITE-RAN\", file=sys.stderr)' > /cache/pylib/sitecustomize.py; "
        f"printf engine > {own}/vit-nano-fp16.engine; echo '{sidecar}' > {own}/vit-nano-fp16.json; "
        "chown -R 10001:10001 /cache"
    )
    from tests.support.dockerd import BASE_IMAGE

    engine.docker("volume", "create", volume)
    engine.docker(
        "run", "--rm", "--network", "none", "-v", f"{volume}:/cache", BASE_IMAGE, "sh", "-c", script
    )


def test_planted_files_on_the_cache_volume_are_refused_outside_and_inside(cpu_image, pin, tmp_path) -> None:
    from veo_edge.packaging.image import LABEL_MANIFEST
    from veo_edge.packaging.imagetrust import verify_image

    engine = cpu_image.engine
    name, volume = "planted", "veo-edge-cache-planted"
    _planted_volume(engine, volume, cpu_image.client.images.get(TAG).labels[LABEL_MANIFEST])
    try:
        planted = (r"(?=.*evil\.pth is code)(?=.*sitecustomize\.py is code)"
                   r"(?=.*vit-nano-fp16\.engine was built from ONNX sha256 f{64}, not from this image's model)")  # fmt: skip
        with pytest.raises(ImageTrustError, match=planted):
            verify_image(TAG, pin, client=cpu_image.client, cache_volume=volume)
        # deploy checks the volume it would mount, before it starts anything
        r = veo(engine, "deploy", TAG, "--to", engine.host, "--name", name, "--verify-key", pin)
        assert r.returncode == 43 and "evil.pth is code" in r.stderr, r.stderr
        assert engine.docker("inspect", name, check=False).returncode != 0
        # the container itself, run by hand with a hostile environment: refuses, and nothing planted ran
        r = engine.docker("run", "--rm", "--read-only", "--network", "none", "-v", f"{volume}:/cache",
                          "-e", "PYTHONPATH=/cache/pylib", "-e", "HOME=/cache", "-e", f"VEO_EDGE_TRUSTED_KEY={pin}",
                          TAG, check=False, timeout=120)  # fmt: skip
        assert r.returncode == 65, r.stdout + r.stderr
        assert "evil.pth is code" in r.stderr and "REFUSING TO START" in r.stderr
        assert "PTH-RAN" not in r.stdout + r.stderr and "SITE-RAN" not in r.stdout + r.stderr
    finally:
        engine.docker("volume", "rm", "-f", volume, check=False)


def test_plain_tcp_docker_host_is_refused(cpu_image) -> None:
    r = veo(cpu_image.engine, "verify", TAG, env={"DOCKER_HOST": "tcp://127.0.0.1:2375"})
    assert r.returncode == 45 and "refusing DOCKER_HOST=tcp://127.0.0.1:2375 without TLS" in r.stderr
