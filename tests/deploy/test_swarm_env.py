"""A swarm re-deploy's environment is what that deploy gives with ``-e``, on a real single-node swarm: what
the running service set and the new deploy does not give is removed, and named."""

from __future__ import annotations

import json

from tests.cli.test_cli import veo
from tests.deploy.test_swarm import swarm_deploy

#: a drill's fault injection, a moved cache, a preloaded library and a plain setting
LEFT_BEHIND = {
    "VEO_EDGE_FAULTS": '{"openvino": {"every_nth": 7}}',
    "VEO_EDGE_CACHE_ROOT": "/cache/elsewhere",
    "LD_PRELOAD": "/tmp/other.so",
    "FLEET_MODE": "blue",
}


def env_of(swarm, service: str) -> dict[str, str]:
    spec = json.loads(swarm.docker("service", "inspect", service).stdout)[0]["Spec"]
    return dict(e.split("=", 1) for e in spec["TaskTemplate"]["ContainerSpec"]["Env"])


def running_envs(swarm, service: str) -> list[dict[str, str]]:
    """The environment of each running task's container (what the server process gets)."""
    ids = swarm.docker(
        "ps", "-q", "--filter", f"label=com.docker.swarm.service.name={service}"
    ).stdout.split()
    attrs = json.loads(swarm.docker("inspect", *ids).stdout) if ids else []
    return [dict(e.split("=", 1) for e in a["Config"]["Env"]) for a in attrs]


def test_a_redeploy_removes_the_environment_it_does_not_give_and_says_which(
    docker_engine, swarm_engine, test_images
) -> None:
    """Before: a re-deploy without -e kept the service's whole environment, fault injection included."""
    name = "envfleet"
    pace = ("--update-monitor", "1", "--update-delay", "0", "--port", "18250", "--allow-unsigned")
    given = [a for k, v in LEFT_BEHIND.items() if k != "LD_PRELOAD" for a in ("-e", f"{k}={v}")]
    r = swarm_deploy(docker_engine, swarm_engine, test_images["v1"], "--name", name, *pace, *given)
    try:
        assert r.returncode == 0, r.stderr
        # and one set by hand (docker service update), as an operator chasing a bug might
        swarm_engine.docker("service", "update", "--detach", "--env-add", "LD_PRELOAD=/tmp/other.so", name)
        assert LEFT_BEHIND.items() <= env_of(swarm_engine, name).items()

        r = veo("deploy", test_images["v2"], "--swarm", "--to", swarm_engine.host, "--name", name,
                "--allow-unsigned", env={"DOCKER_HOST": docker_engine.host}, timeout=300)  # fmt: skip
        assert r.returncode == 0, r.stderr
        env = env_of(swarm_engine, name)
        assert not set(LEFT_BEHIND) & set(env), env
        assert env["VEO_EDGE_PORT"] == "18250" and env["VEO_EDGE_ALLOW_UNSIGNED"] == "1"
        tasks = running_envs(swarm_engine, name)
        assert tasks and all(not set(LEFT_BEHIND) & set(t) for t in tasks), tasks
        assert (
            "removed from the service's environment (not given with -e): "
            "FLEET_MODE, LD_PRELOAD, VEO_EDGE_CACHE_ROOT, VEO_EDGE_FAULTS\n" in r.stdout
        ), r.stdout
        kept = r.stdout.split("kept from the running service (not given): ", 1)[1].splitlines()[0]
        assert kept.startswith("--replicas 1, --port 18250, ") and " -e " not in kept, r.stdout
        # a variable given again with -e stays: test_swarm.py's scaling step
    finally:
        veo("deploy", "remove", name, "--swarm", "--to", swarm_engine.host, "--volumes", timeout=120)


def test_a_redeploy_of_a_service_scaled_to_0_is_refused_before_it_changes(
    docker_engine, swarm_engine, test_images
) -> None:
    """The 0 replicas a re-deploy keeps when --replicas is not given: no task would prove the release
    healthy, so it is refused by name (exit 2) and the service stays as it was."""
    name = "zero"
    image = json.loads(docker_engine.docker("image", "inspect", test_images["v1"]).stdout)[0]["Id"]
    swarm_engine.docker("service", "create", "--detach", "--no-resolve-image", "--replicas", "0", "--name", name,
                        "--env", "FLEET=blue", image)  # fmt: skip
    try:
        before = json.loads(swarm_engine.docker("service", "inspect", name).stdout)[0]
        r = veo("deploy", test_images["v1"], "--swarm", "--to", swarm_engine.host, "--name", name,
                "--allow-unsigned", env={"DOCKER_HOST": docker_engine.host}, timeout=300)  # fmt: skip
        assert r.returncode == 2, r.stderr
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "the running service is scaled to 0 replicas" in errors[0], r.stderr
        assert "give --replicas N" in r.stderr and "Traceback" not in r.stderr
        after = json.loads(swarm_engine.docker("service", "inspect", name).stdout)[0]
        assert after["Version"] == before["Version"] and after["Spec"] == before["Spec"]
    finally:
        swarm_engine.docker("service", "rm", name, check=False)
