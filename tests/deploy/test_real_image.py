"""The real veo-edge cpu image (vit-nano, signed) deployed onto the "device" engine: its signature is
verified first, it is transferred, becomes healthy and answers a tritonclient inference that matches the
build's canary; a release that never becomes healthy is rolled back and the first release still answers."""

from __future__ import annotations

import json

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
