"""``veo-edge verify IMAGE`` on the session's signed cpu image, on what a user meets: a second signature
(another key) under another repository the image is tagged in, a check by image ID, the --key values
that are not a pin, the JSON report of a refusal, and an image that is not veo-edge's at all."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.dockerd import BASE_IMAGE
from tests.support.images import TAG, ed25519_pem
from veo_edge.errors import ImageTrustError, UsageError
from veo_edge.packaging import attest, signing

CLI = "from veo_edge.cli.main import main; import sys; main(sys.argv[1:])"


def veo(engine, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLI, *map(str, args)], env=engine.env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def _fp(key) -> str:
    return signing.fingerprint(key.public_key())


@pytest.fixture
def second_signature(cpu_image, tmp_path):
    """The image also tagged aaa/vt:1 and other/repo:x, with a signature by another key under aaa/vt."""
    client, built = cpu_image.client, cpu_image.built
    theirs = signing.load_private_key(ed25519_pem(tmp_path / "theirs.pem"))
    raw = (cpu_image.ctx.path / "image-manifest.json").read_bytes()
    sig = attest.store_signature_image(
        client, "aaa/vt", built.id, attest.sign_image(built.id, "aaa/vt", raw, {}, theirs)
    )
    client.images.get(built.id).tag("aaa/vt", "1")
    client.images.get(built.id).tag("other/repo", "x")
    yield theirs, sig
    for tag in ("aaa/vt:1", "other/repo:x", sig):
        client.images.remove(tag)


def test_every_signature_of_the_image_id_is_tried_whatever_name_it_is_verified_by(
    cpu_image, second_signature, tmp_path
) -> None:
    from veo_edge.deploy.ship import verify_for_deploy
    from veo_edge.packaging.imagetrust import verify_image

    client, built = cpu_image.client, cpu_image.built
    theirs, their_sig = second_signature
    pin = _fp(signing.load_private_key(cpu_image.key))
    mine = f"signature image {built.signature_tag}"
    for ref in (built.id, "aaa/vt:1", "other/repo:x", TAG):
        report = verify_image(ref, pin, client=client)
        assert report["verified"] and report["signed_by"] == pin and report["signature"] == mine, ref
        assert sorted(report["signatures"]) == sorted([mine, f"signature image {their_sig}"])
    # their signature of the ID verifies by their key, but the manifest baked in the image is by ours
    with pytest.raises(ImageTrustError, match=rf"its image ID is signed by the trusted key {_fp(theirs)} "
                       rf"\(signature image {their_sig}\), but the manifest baked in it is signed by {pin}"):  # fmt: skip
        verify_image("aaa/vt:1", _fp(theirs), client=client)
    # a key that signed neither: one refusal naming both signers
    nobody = _fp(signing.load_private_key(ed25519_pem(tmp_path / "nobody.pem")))
    with pytest.raises(
        ImageTrustError, match=f"none of its 2 signatures is by the trusted key {nobody}"
    ) as info:
        verify_image(built.id, nobody, client=client)
    assert f"{built.signature_tag} by {pin}" in str(info.value) and f"{their_sig} by {_fp(theirs)}" in str(
        info.value
    )
    # deploy by ID verifies with the trusted signature and carries that signature image
    trust = verify_for_deploy(client, client, built.id, pin, None, False)
    assert trust.verified and trust.signature_tag == built.signature_tag
    # the command line says which signature it took
    pub = tmp_path / "pub.pem"
    pub.write_bytes(signing.public_pem(signing.load_private_key(cpu_image.key).public_key()))
    r = veo(cpu_image.engine, "verify", "aaa/vt:1", "--key", pub)
    assert r.returncode == 0 and f"{built.signature_tag} of 2 found" in r.stdout, r.stdout + r.stderr


def test_a_key_that_is_not_a_pin_is_a_usage_error_before_the_engine(cpu_image, tmp_path) -> None:
    from veo_edge.packaging.imagetrust import check_key

    with pytest.raises(
        UsageError, match=r"--key 'sha256:1234' is not a key fingerprint: expected sha256: and 64"
    ):
        check_key("sha256:1234")
    with pytest.raises(
        UsageError, match=r"--key 'nope.pem' is neither a sha256:<64 hex> fingerprint nor an existing"
    ):
        check_key("nope.pem")
    private = ed25519_pem(tmp_path / "k.pem")  # a private key where the public one goes
    with pytest.raises(UsageError, match=r"is not a PEM public key"):
        check_key(str(private))
    for key in ("sha256:1234", tmp_path / "nope.pem"):
        r = veo(cpu_image.engine, "verify", TAG, "--key", key)
        assert r.returncode == UsageError.exit_code and "--key" in r.stderr, r.stderr


def test_json_on_failure_and_an_image_that_is_not_veo_edges(cpu_image, tmp_path) -> None:
    other = _fp(signing.load_private_key(ed25519_pem(tmp_path / "o.pem")))
    r = veo(cpu_image.engine, "verify", TAG, "--key", other, "--json")
    assert r.returncode == ImageTrustError.exit_code, r.stderr
    report = json.loads(r.stdout)
    assert report["ok"] is False and report["kind"] == "image" and report["exit_code"] == 43
    assert "not by the trusted key" in report["error"] and report["image_id"] == cpu_image.built.id
    assert report["signatures"] == [f"signature image {cpu_image.built.signature_tag}"]
    # the Debian base, retagged: nothing of veo-edge's in it, so not even --allow-unsigned passes it
    r = veo(cpu_image.engine, "verify", BASE_IMAGE, "--allow-unsigned", "--json")
    assert r.returncode == ImageTrustError.exit_code, r.stdout + r.stderr
    assert "has no /opt/veo-edge: it is not a veo-edge image" in r.stderr
    assert json.loads(r.stdout)["ok"] is False
