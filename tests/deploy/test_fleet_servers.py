"""Deploying through real servers on loopback: an OpenSSH server (its sessions' ``docker`` reaches the
"device" engine) and the reference registry. Both hold /tmp/veo-swarm.lock while they run."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_cli import veo
from tests.conftest import FLEET_GROUP
from tests.deploy.conftest import build_tiny_image
from tests.support.net import free_port
from tests.support.servers import fleet_lock, start_registry, start_sshd, stop_registry, stop_sshd

pytestmark = pytest.mark.xdist_group(FLEET_GROUP)  # beside the swarm, which holds the same lock


def _inspect(engine, name: str) -> dict | None:
    r = engine.docker("inspect", name, check=False)
    return json.loads(r.stdout)[0] if r.returncode == 0 else None


def test_deploy_over_a_real_ssh_server_refuses_unknown_host_keys(
    docker_engine, device_engine, tmp_path
) -> None:
    image = build_tiny_image(docker_engine, "veo-test/tiny:ssh", release="ssh")  # a new ID: it must move
    name = "over-ssh"
    with fleet_lock():
        sshd = start_sshd(tmp_path / "sshd", free_port(), device_engine.host)
        try:
            r = veo("deploy", "status", name, "--to", sshd.url, env=sshd.client_env(known=False))
            assert r.returncode == 45, r.stderr
            assert "its ssh host key is not one your known_hosts trusts" in r.stderr
            assert "Host key verification failed" in r.stderr and len(r.stderr.strip().splitlines()) == 1

            env = {"DOCKER_HOST": docker_engine.host, **sshd.client_env()}
            r = veo("deploy", image, "--to", sshd.url, "--name", name, "--allow-unsigned", "--json", env=env)
            assert r.returncode == 0, r.stderr
            report = json.loads(r.stdout)
            assert report["transfer"]["method"] == "stream" and report["transfer"]["bytes"] > 1 << 20
            c = _inspect(device_engine, name)
            assert c["State"]["Health"]["Status"] == "healthy" and c["Image"] == report["image_id"]
            assert "Accepted publickey for root" in (sshd.root / "sshd.log").read_text()

            # a bad release through the same ssh session: rolled back, the first one healthy again
            bad = build_tiny_image(docker_engine, "veo-test/tiny:ssh-bad", release="ssh-bad", healthy=False)
            r = veo("deploy", bad, "--to", sshd.url, "--name", name, "--allow-unsigned", "--timeout", "30",
                    env=env)  # fmt: skip
            assert r.returncode == 46, r.stderr
            assert "rolled back to the previous release veo-test/tiny:ssh, healthy again" in r.stderr
            assert _inspect(device_engine, name)["State"]["Health"]["Status"] == "healthy"
        finally:
            stop_sshd(sshd)
            for n in (name, f"{name}-previous", f"{name}-outgoing"):
                device_engine.docker("rm", "-f", n, check=False)
            docker_engine.docker("rmi", image, "veo-test/tiny:ssh-bad", check=False)


def test_deploy_through_a_real_registry_pulls_by_digest_and_refuses_a_mismatch(
    docker_engine, device_engine, tmp_path
) -> None:
    image = build_tiny_image(docker_engine, "veo-test/tiny:registry", release="registry")
    name = "via-registry"
    with fleet_lock():
        reg = start_registry(tmp_path / "registry", free_port())
        try:
            env = {"DOCKER_HOST": docker_engine.host}
            args = ("deploy", image, "--to", device_engine.host, "--name", name, "--registry", reg.address,
                    "--allow-unsigned", "--json")  # fmt: skip
            r = veo(*args, env=env)
            assert r.returncode == 0, r.stderr
            moved = json.loads(r.stdout)["transfer"]
            digest_ref = moved["digest_ref"]
            assert moved["method"] == "registry" and digest_ref.startswith(
                f"{reg.address}/veo-test/tiny@sha256:"
            )
            c = _inspect(device_engine, name)
            assert c["Image"] == moved["image_id"] and c["State"]["Health"]["Status"] == "healthy"
            assert (
                digest_ref
                in json.loads(device_engine.docker("image", "inspect", moved["image_id"]).stdout)[0][
                    "RepoDigests"
                ]
            )

            # Kubernetes manifests from the same push name the image by that digest
            r = veo("deploy", image, "--k8s", tmp_path / "k8s", "--registry", reg.address, "--allow-unsigned",
                    "--json", env=env)  # fmt: skip
            assert r.returncode == 0, r.stderr
            assert json.loads(r.stdout)["images"] == [digest_ref]
            # without --registry: the digest that push recorded, and stderr says which and that its
            # registry is on loopback (the walkthrough got it with no word)
            r = veo("deploy", image, "--k8s", tmp_path / "k8s-local", "--allow-unsigned", "--json", env=env)
            assert r.returncode == 0, r.stderr
            assert json.loads(r.stdout)["images"] == [digest_ref]
            err = " ".join(r.stderr.split())
            assert f"is named by {digest_ref}" in err and "loopback" in err and "--registry REG" in err

            # a second release whose manifest the registry no longer serves as pushed: refused, and the
            # running release is untouched. A fresh image, because the device engine keeps the manifests
            # it has pulled (digest-checked) and may not ask the registry again for the first one.
            tampered = build_tiny_image(docker_engine, "veo-test/tiny:registry-tampered", release="tampered")
            r = veo("deploy", tampered, "--k8s", tmp_path / "k8s-tampered", "--registry", reg.address,
                    "--allow-unsigned", "--json", env=env)  # fmt: skip
            assert r.returncode == 0, r.stderr
            (tampered_ref,) = json.loads(r.stdout)["images"]
            blob = reg.blob(tampered_ref.split("@", 1)[1])
            blob.write_bytes(blob.read_bytes() + b"\n")
            r = veo("deploy", tampered, "--to", device_engine.host, "--name", name, "--registry", reg.address,
                    "--allow-unsigned", "--json", env=env)  # fmt: skip
            assert r.returncode == 44, r.stderr
            assert "a digest mismatch" in r.stderr and tampered_ref in r.stderr
            c = _inspect(device_engine, name)
            assert c["Image"] == moved["image_id"] and c["State"]["Running"]
        finally:
            stop_registry(reg)
            device_engine.docker("rm", "-f", name, check=False)
            docker_engine.docker("rmi", image, "veo-test/tiny:registry-tampered", check=False)
