"""``veo-edge deploy --swarm`` on a real single-node swarm (its node labelled ``veo.target=cpu``)."""

from __future__ import annotations

import json

from tests.cli.test_cli import veo


def swarm_deploy(build_host, swarm, *args, timeout=300):
    return veo("deploy", *args, "--swarm", "--to", swarm.host, "--json",
               env={"DOCKER_HOST": build_host.host}, timeout=timeout)  # fmt: skip


def tasks(swarm, service: str) -> list[dict]:
    out = swarm.docker("service", "ps", service, "--format", "{{json .}}", "--no-trunc").stdout
    return [json.loads(line) for line in out.splitlines()]


def test_a_service_becomes_healthy_and_the_swarm_rolls_a_bad_update_back(
    docker_engine, swarm_engine, test_images
) -> None:
    r = swarm_deploy(docker_engine, swarm_engine, test_images["v1"], "--name", "fleet", "--replicas", "2")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["action"] == "created"
    running = [t for t in report["tasks"] if t["desired"] == "running"]
    assert len(running) == 2 and all(t["state"] == "running" and t["health"] == "healthy" for t in running)
    spec = json.loads(swarm_engine.docker("service", "inspect", "fleet").stdout)[0]["Spec"]
    assert spec["TaskTemplate"]["Placement"]["Constraints"] == ["node.labels.veo.target==cpu"]
    assert spec["UpdateConfig"]["FailureAction"] == "rollback" and spec["UpdateConfig"]["Parallelism"] == 1
    assert spec["Mode"]["Replicated"]["Replicas"] == 2

    r = swarm_deploy(
        docker_engine, swarm_engine, test_images["unhealthy"], "--name", "fleet", "--replicas", "2"
    )
    assert r.returncode == 46, r.stderr
    assert "the swarm rolled service fleet back from veo-test/app:unhealthy" in r.stderr
    inspect = json.loads(swarm_engine.docker("service", "inspect", "fleet").stdout)[0]
    assert inspect["UpdateStatus"]["State"].startswith("rollback")
    assert inspect["Spec"]["TaskTemplate"]["ContainerSpec"]["Image"].startswith(test_images["v1"])

    r = veo("deploy", "status", "fleet", "--swarm", "--to", swarm_engine.host, "--json")
    assert r.returncode == 0, r.stderr


def test_a_constraint_no_node_satisfies_is_pending_not_success(
    docker_engine, swarm_engine, test_images
) -> None:
    r = swarm_deploy(
        docker_engine, swarm_engine, test_images["v1"], "--name", "orin-fleet", "--target", "orin"
    )
    assert r.returncode == 47, r.stderr
    assert "service orin-fleet is pending" in r.stderr and "veo.target=orin" in r.stderr
    assert all(t["CurrentState"].startswith("Pending") for t in tasks(swarm_engine, "orin-fleet"))


def test_swarm_commands_on_an_engine_that_is_no_manager(device_engine) -> None:
    r = veo("deploy", "status", "fleet", "--swarm", "--to", device_engine.host)
    assert r.returncode == 44 and "not a swarm manager" in r.stderr
