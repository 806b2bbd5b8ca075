"""The real veo-edge cpu image (vit-nano, signed) deployed onto the "device" engine: its signature is
verified first, it is transferred, becomes healthy and answers a tritonclient inference that matches the
build's canary; a release that never becomes healthy is rolled back and the first release still answers.

What is on the device is verified there, not trusted: the same image with one of its baked files changed
in the device engine's own layer store (same image ID, same valid signature) is refused both by a deploy
that finds the image already there (no transfer) and by a rollback to the kept release made from it,
before the running release is touched; the same rollback, the file put back, verifies the signer and
runs the release again."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_cli import veo
from tests.support.images import infer_canary
from tests.support.net import free_port


def test_the_real_image_deploys_answers_and_survives_a_bad_release(
    cpu_image, device_engine, test_images
) -> None:
    from veo_edge.packaging import signing

    name, port = "vit-nano-e2e", free_port()
    host_env = {"DOCKER_HOST": cpu_image.engine.host}
    pub = cpu_image.work / "sign.pub.pem"
    pub.write_bytes(signing.public_pem(signing.load_private_key(cpu_image.key).public_key()))
    env = ["-e", "VEO_EDGE_HOST=127.0.0.1", "-e", f"VEO_EDGE_GRPC_PORT={free_port()}"]
    token = cpu_image.work / "control-token"
    token.write_text("c0ntrol-" + "t0ken" * 4 + "\n")
    try:
        r = veo("deploy", cpu_image.built.tag, "--to", device_engine.host, "--name", name, "--port", port,
                "--timeout", "300", "--verify-key", pub, *env, "--control-token-file", token, "--json",
                env=host_env, timeout=600)  # fmt: skip
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert report["transfer"]["method"] == "stream"
        inspect = json.loads(device_engine.docker("inspect", name).stdout)[0]
        assert inspect["State"]["Health"]["Status"] == "healthy"
        assert inspect["HostConfig"]["ReadonlyRootfs"] and inspect["Config"]["User"] == "10001:10001"
        assert inspect["HostConfig"]["CapDrop"] == ["ALL"] and inspect["HostConfig"]["PidsLimit"] == 1024
        assert inspect["HostConfig"]["SecurityOpt"] == ["no-new-privileges:true"]
        assert f"VEO_EDGE_TRUSTED_KEY={report['signed_by']}" in inspect["Config"]["Env"]
        # bound to the verified ID: the container runs it, and the signature image came along
        assert inspect["Image"] == report["image_id"] == cpu_image.built.id and report["verified"]
        assert report["transfer"]["signature"] == cpu_image.built.signature_tag
        assert (
            device_engine.docker("image", "inspect", cpu_image.built.signature_tag, check=False).returncode
            == 0
        )
        assert infer_canary(port, cpu_image.build).ok
        # model control is on, behind the token from its volume: no token, no unload
        import urllib.error
        import urllib.request

        unload = f"http://127.0.0.1:{port}/v2/repository/models/vit-nano/unload"
        try:
            urllib.request.urlopen(urllib.request.Request(unload, data=b"{}", method="POST"), timeout=10)
            raise AssertionError("unload without the control token was accepted")
        except urllib.error.HTTPError as e:
            assert e.code == 401
        assert infer_canary(port, cpu_image.build).ok

        # a release that never becomes healthy: rolled back, the first one answers again
        r = veo("deploy", test_images["unhealthy"], "--to", device_engine.host, "--name", name, "--port", port,
                "--timeout", "60", "--allow-unsigned", env={"DOCKER_HOST": cpu_image.engine.host},
                timeout=600)  # fmt: skip
        assert r.returncode == 46, r.stderr
        assert "rolled back to the previous release veo-edge/vit-nano:test-cpu" in r.stderr
        assert infer_canary(port, cpu_image.build).ok

        # a key that did not sign the image: refused before anything is transferred or stopped
        from tests.support.images import ed25519_pem

        other = ed25519_pem(cpu_image.work / "other.pem")
        other_pub = cpu_image.work / "other.pub.pem"
        other_pub.write_bytes(signing.public_pem(signing.load_private_key(other).public_key()))
        r = veo("deploy", cpu_image.built.tag, "--to", device_engine.host, "--name", name,
                "--verify-key", other_pub, env=host_env, timeout=300)  # fmt: skip
        assert r.returncode == 43 and "not by the trusted key" in r.stderr, r.stderr
        assert json.loads(device_engine.docker("inspect", name).stdout)[0]["State"]["Running"]
    finally:
        for n in (name, f"{name}-previous", f"{name}-outgoing"):
            device_engine.docker("rm", "-f", n, check=False)
        device_engine.docker("volume", "rm", "-f", f"veo-edge-control-{name}", check=False)


def _baked_file(device_engine, image_id: str) -> Path:
    """A file under /opt/veo-edge (not the trust files) in the device's overlay store of ``image_id``."""
    data = json.loads(device_engine.docker("image", "inspect", image_id).stdout)[0]["GraphDriver"]["Data"]
    for layer in [data["UpperDir"], *data.get("LowerDir", "").split(":")]:
        root = Path(layer) / "opt" / "veo-edge"
        if root.is_dir():
            for p in sorted(root.rglob("*.py")):
                if p.is_file() and not p.is_symlink() and "trust" not in p.relative_to(root).parts:
                    return p
    raise AssertionError(f"no baked file of {image_id} in the device's store ({data})")


def _inspect(device_engine, name: str) -> dict:
    return json.loads(device_engine.docker("inspect", name).stdout)[0]


def test_a_changed_copy_on_the_device_is_refused_by_deploy_and_rollback(
    cpu_image, device_engine, test_images
) -> None:
    from veo_edge.packaging import signing

    name, port, dev = "vit-nano-trust", free_port(), device_engine.host
    host_env = {"DOCKER_HOST": cpu_image.engine.host}
    pub = cpu_image.work / "sign.pub.pem"
    pub.write_bytes(signing.public_pem(signing.load_private_key(cpu_image.key).public_key()))
    env = ["-e", "VEO_EDGE_HOST=127.0.0.1", "-e", f"VEO_EDGE_GRPC_PORT={free_port()}"]
    baked, original = None, b""
    try:
        r = veo("deploy", cpu_image.built.tag, "--to", dev, "--name", name, "--port", port, "--verify-key",
                pub, *env, env=host_env, timeout=600)  # fmt: skip
        assert r.returncode == 0, r.stderr
        # an (unsigned) release over it: the signed one is kept, stopped, as NAME-previous
        r = veo("deploy", test_images["v1"], "--to", dev, "--name", name, "--allow-unsigned", env=host_env)
        assert r.returncode == 0, r.stderr
        running = _inspect(device_engine, name)["Id"]

        baked = _baked_file(device_engine, cpu_image.built.id)
        original = baked.read_bytes()
        baked.write_bytes(original + b"\nprint('changed on the device')\n")
        r = veo("deploy", "rollback", name, "--to", dev, "--verify-key", pub, timeout=300)
        assert r.returncode == 43, r.stderr
        err = " ".join(r.stderr.split())
        assert f"refusing to roll back to the kept release {name}-previous" in err
        assert "baked files do not match the image manifest" in err and baked.name in err, err

        # the device has the image ID: nothing is transferred, but its copy is verified there
        r = veo("deploy", cpu_image.built.tag, "--to", dev, "--name", name, "--port", port, "--verify-key",
                pub, *env, env=host_env, timeout=600)  # fmt: skip
        assert r.returncode == 43, r.stderr
        err = " ".join(r.stderr.split())
        assert "no transfer" in err and "the target engine's copy of veo-edge/vit-nano:test-cpu" in err
        assert "baked files do not match the image manifest" in err, err
        assert _inspect(device_engine, name)["Id"] == running  # untouched, still running
        assert _inspect(device_engine, name)["State"]["Running"]
        assert _inspect(device_engine, f"{name}-previous")["Image"] == cpu_image.built.id

        baked.write_bytes(original)
        baked = None
        r = veo("deploy", "rollback", name, "--to", dev, "--verify-key", pub, "--json", timeout=300)
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert report["verified"] and report["signed_by"] and report["image_id"] == cpu_image.built.id
        assert _inspect(device_engine, name)["State"]["Health"]["Status"] == "healthy"
    finally:
        if baked is not None:
            baked.write_bytes(original)
        for n in (name, f"{name}-previous", f"{name}-rollback", f"{name}-outgoing"):
            device_engine.docker("rm", "-f", n, check=False)
        device_engine.docker("volume", "rm", "-f", f"veo-edge-cache-{name}", check=False)
