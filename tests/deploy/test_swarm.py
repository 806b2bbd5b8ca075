"""``veo-edge deploy --swarm`` on a real single-node swarm (its node labelled ``veo.target=cpu``)."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_cli import veo


def swarm_deploy(build_host, swarm, *args, timeout=300):
    return veo("deploy", *args, "--swarm", "--to", swarm.host, "--json",
               env={"DOCKER_HOST": build_host.host}, timeout=timeout)  # fmt: skip


def image_id(engine, ref: str) -> str:
    return engine.docker("image", "inspect", "-f", "{{.Id}}", ref).stdout.strip()


def pids_limit(swarm, service: str) -> int | None:
    spec = json.loads(swarm.docker("service", "inspect", service).stdout)[0]["Spec"]
    return (spec["TaskTemplate"]["Resources"].get("Limits") or {}).get("Pids")


def tasks(swarm, service: str) -> list[dict]:
    out = swarm.docker("service", "ps", service, "--format", "{{json .}}", "--no-trunc").stdout
    return [json.loads(line) for line in out.splitlines()]


def test_a_service_becomes_healthy_and_the_swarm_rolls_a_bad_update_back(
    docker_engine, swarm_engine, test_images
) -> None:
    # updates and rollbacks paced faster than the defaults (a 3 s monitor, a 1 s pause; the defaults are
    # asserted on the three-replica service below): the swarm rolls back with the rolled-back spec's pace
    pace = ("--update-monitor", "3", "--update-delay", "1")
    r = swarm_deploy(docker_engine, swarm_engine, test_images["v1"], "--name", "fleet", "--replicas", "2",
                     "--port", "18210", "-e", "FLEET_MODE=blue", "--allow-unsigned", *pace)  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["action"] == "created"
    running = [t for t in report["tasks"] if t["desired"] == "running"]
    assert len(running) == 2 and all(t["state"] == "running" and t["health"] == "healthy" for t in running)
    first = {t["slot"]: t["id"] for t in running}
    spec = json.loads(swarm_engine.docker("service", "inspect", "fleet").stdout)[0]["Spec"]
    assert spec["TaskTemplate"]["Placement"]["Constraints"] == ["node.labels.veo.target==cpu"]
    assert spec["UpdateConfig"]["FailureAction"] == "rollback" and spec["UpdateConfig"]["Parallelism"] == 1
    assert (spec["UpdateConfig"]["Monitor"], spec["UpdateConfig"]["Delay"]) == (3 * 10**9, 10**9)
    assert spec["RollbackConfig"]["Monitor"] == 3 * 10**9
    assert spec["Mode"]["Replicated"]["Replicas"] == 2
    # bound to the image ID (no node re-resolves a tag), least privilege, one port per replica
    c = spec["TaskTemplate"]["ContainerSpec"]
    assert c["Image"] == image_id(docker_engine, test_images["v1"]) and report["bound_to"] == c["Image"]
    assert c["CapabilityDrop"] == ["ALL"] and c["User"] == "10001:10001" and c["ReadOnly"]
    assert spec["TaskTemplate"]["Resources"]["Limits"]["Pids"] == 1024
    # interleaved ports: slot s on 18210 + 2(s-1), gRPC one above, whatever the replica count
    assert "VEO_EDGE_REPLICA_SLOT={{.Task.Slot}}" in c["Env"] and "VEO_EDGE_PORT=18210" in c["Env"]
    assert "VEO_EDGE_GRPC_PORT=18211" in c["Env"]
    tmp = next(m for m in c["Mounts"] if m["Target"] == "/tmp")
    assert tmp["Type"] == "tmpfs" and tmp["TmpfsOptions"]["SizeBytes"] == 64 * 1024 * 1024

    # scaling 2 -> 3 (with the same -e: a re-deploy's -e set is the whole environment) changes no task's
    # ports or spec: the tasks of slots 1 and 2 keep running
    r = swarm_deploy(docker_engine, swarm_engine, test_images["v1"], "--name", "fleet", "--replicas", "3",
                     "-e", "FLEET_MODE=blue", "--allow-unsigned")  # fmt: skip
    assert r.returncode == 0, r.stderr
    scaled = json.loads(swarm_engine.docker("service", "inspect", "fleet").stdout)[0]["Spec"]
    assert scaled["Mode"]["Replicated"]["Replicas"] == 3
    assert scaled["TaskTemplate"]["ContainerSpec"]["Env"] == c["Env"]
    running = [t for t in json.loads(r.stdout)["tasks"] if t["desired"] == "running"]
    assert sorted(t["slot"] for t in running) == [1, 2, 3] and all(t["health"] == "healthy" for t in running)
    assert {t["slot"]: t["id"] for t in running if t["slot"] in first} == first

    # a good update that gives none of the service's options keeps them (replicas, port, pace) but not
    # the -e it leaves out, and says both; the success line counts the tasks meant to run, not the history
    r = veo("deploy", test_images["v2"], "--swarm", "--to", swarm_engine.host, "--name", "fleet",
            "--allow-unsigned", env={"DOCKER_HOST": docker_engine.host}, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "service fleet updated" in r.stdout and ", 3 task(s), " in r.stdout, r.stdout
    kept = r.stdout.split("kept from the running service (not given): ", 1)[1].splitlines()[0]
    assert kept.startswith("--replicas 3, --port 18210, --grpc-port 18211") and " -e " not in kept, r.stdout
    assert "removed from the service's environment (not given with -e): FLEET_MODE\n" in r.stdout
    kept = json.loads(swarm_engine.docker("service", "inspect", "fleet").stdout)[0]["Spec"]
    assert kept["Mode"]["Replicated"]["Replicas"] == 3
    assert (kept["UpdateConfig"]["Monitor"], kept["UpdateConfig"]["Delay"]) == (3 * 10**9, 10**9)
    env = kept["TaskTemplate"]["ContainerSpec"]["Env"]
    assert {"VEO_EDGE_PORT=18210", "VEO_EDGE_GRPC_PORT=18211"} <= set(env)
    assert not [e for e in env if e.startswith("FLEET_MODE=")]

    # then the swarm's own rollback (the Engine API's rollback=previous) back to v1
    r = veo("deploy", "rollback", "fleet", "--swarm", "--to", swarm_engine.host, "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    back = json.loads(r.stdout)
    assert back["update_status"]["State"] == "rollback_completed"
    assert back["bound_to"] == image_id(docker_engine, test_images["v1"])
    env = json.loads(swarm_engine.docker("service", "inspect", "fleet").stdout)[0]["Spec"]["TaskTemplate"]
    assert "FLEET_MODE=blue" in env["ContainerSpec"]["Env"]  # the previous spec, its environment included

    r = swarm_deploy(
        docker_engine, swarm_engine, test_images["unhealthy"], "--name", "fleet", "--allow-unsigned",
    )  # fmt: skip
    assert r.returncode == 46, r.stderr
    assert "the swarm rolled service fleet back from veo-test/app:unhealthy" in r.stderr
    # the task that went unhealthy (shut down by the rollback) is named, with its healthcheck's last word
    said = r.stderr.replace("\n", " ")
    assert "/unhealthy: model canary mismatch: max abs 3.2 > 1e-3" in said, r.stderr
    inspect = json.loads(swarm_engine.docker("service", "inspect", "fleet").stdout)[0]
    assert inspect["UpdateStatus"]["State"].startswith("rollback")
    assert inspect["Spec"]["TaskTemplate"]["ContainerSpec"]["Image"] == image_id(
        docker_engine, test_images["v1"]
    )

    r = veo("deploy", "status", "fleet", "--swarm", "--to", swarm_engine.host, "--json")
    assert r.returncode == 0, r.stderr

    # asked without --swarm, the one-device actions say that a service of that name runs there
    r = veo("deploy", "status", "fleet", "--to", swarm_engine.host)
    assert r.returncode == 44 and "a swarm service fleet runs there: add --swarm" in r.stderr, r.stderr

    # deploy remove --swarm: the service and its tasks' containers go, the cache volume stays until asked
    r = veo("deploy", "remove", "fleet", "--swarm", "--to", swarm_engine.host, "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["removed"] == ["service fleet"] and report["kept_volumes"] == ["veo-edge-cache-fleet"]
    assert swarm_engine.docker("service", "inspect", "fleet", check=False).returncode != 0
    left = swarm_engine.docker("ps", "-aq", "--filter", "label=com.docker.swarm.service.name=fleet")
    assert left.stdout.strip() == ""
    r = veo("deploy", "remove", "fleet", "--swarm", "--to", swarm_engine.host, "--volumes", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["removed_volumes"] == ["veo-edge-cache-fleet"]
    r = veo("deploy", "remove", "fleet", "--swarm", "--to", swarm_engine.host)
    assert r.returncode == 44 and "no service named fleet" in r.stderr, r.stderr


def test_a_deploy_that_times_out_or_is_interrupted_does_not_leave_the_new_release_rolling_forward(
    docker_engine, swarm_engine, test_images
) -> None:
    """Exit 46 on a timeout and 130 on SIGTERM are true on a swarm: an updated service is rolled back to
    the previous release (the swarm would otherwise finish the update), a created one is removed."""
    import signal
    import subprocess
    import sys
    import time

    assert (
        veo("deploy", test_images["v1"], "--swarm", "--to", swarm_engine.host, "--timeout", "0").returncode
        == 2
    )
    r = swarm_deploy(docker_engine, swarm_engine, test_images["v1"], "--name", "undo", "--timeout", "0.5",
                     "--allow-unsigned")  # fmt: skip
    assert r.returncode == 46, r.stderr
    assert "removed service undo, which this deploy created" in r.stderr.replace("\n", " "), r.stderr
    assert swarm_engine.docker("service", "inspect", "undo", check=False).returncode != 0

    pace = ("--update-monitor", "3", "--update-delay", "1")
    r = swarm_deploy(docker_engine, swarm_engine, test_images["v1"], "--name", "undo", "--replicas", "2",
                     "--allow-unsigned", *pace)  # fmt: skip
    assert r.returncode == 0, r.stderr
    v1 = image_id(docker_engine, test_images["v1"])

    def spec_and_state() -> tuple[str, str]:
        inspect = json.loads(swarm_engine.docker("service", "inspect", "undo").stdout)[0]
        image = inspect["Spec"]["TaskTemplate"]["ContainerSpec"]["Image"]
        return image, (inspect.get("UpdateStatus") or {}).get("State", "")

    # not healthy within --timeout (the update of two tasks takes longer): rolled back, and said so
    r = swarm_deploy(docker_engine, swarm_engine, test_images["v2"], "--name", "undo", "--timeout", "2",
                     "--allow-unsigned")  # fmt: skip
    said = r.stderr.replace("\n", " ")
    assert r.returncode == 46, r.stderr
    assert "was not healthy within 2 s" in said and "asked the swarm to roll it back" in said, r.stderr
    assert "rolled back: the previous release veo-test/app:v1 is healthy on 2/2 tasks" in said, r.stderr
    assert spec_and_state() == (v1, "rollback_completed")

    # SIGTERM while the swarm updates: exit 130 with the previous release back
    code = f"from veo_edge.cli.main import main; main({['deploy', test_images['v2'], '--swarm', '--to', swarm_engine.host, '--name', 'undo', '--allow-unsigned']!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**__import__("os").environ, "DOCKER_HOST": docker_engine.host})  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while spec_and_state()[1] != "updating":
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = err.replace("\n", " ")
    assert proc.returncode == 130, err
    assert "interrupted (SIGTERM) while deploying veo-test/app:v2 as service undo" in said, err
    assert "rolled back: the previous release veo-test/app:v1 is healthy on 2/2 tasks" in said, err
    assert spec_and_state() == (v1, "rollback_completed")
    swarm_engine.docker("service", "rm", "undo", check=False)


def test_a_redeploy_keeps_the_least_privilege_options_and_the_control_token(
    docker_engine, swarm_engine, test_images, tmp_path
) -> None:
    token = tmp_path / "token"
    token.write_text("a-control-token-of-some-length\n")
    pace = ("--update-monitor", "2", "--update-delay", "0")
    given = ("--user", "10002:10002", "--cap-add", "NET_RAW", "--allow-privilege-escalation",
             "--pids-limit", "512", "--control-token-file", str(token), "--port", "18230")  # fmt: skip
    r = swarm_deploy(docker_engine, swarm_engine, test_images["v1"], "--name", "lp", "--allow-unsigned",
                     *pace, *given)  # fmt: skip
    assert r.returncode == 0, r.stderr
    before = json.loads(swarm_engine.docker("service", "inspect", "lp").stdout)[0]["Spec"]
    r = veo("deploy", test_images["v2"], "--swarm", "--to", swarm_engine.host, "--name", "lp",
            "--allow-unsigned", env={"DOCKER_HOST": docker_engine.host}, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    kept = r.stdout.split("kept from the running service (not given): ", 1)[1]
    for said in ("--user 10002:10002", "--cap-add NET_RAW", "--allow-privilege-escalation",
                 "--pids-limit 512", "--control-token-file (secret veo-edge-control-lp-"):  # fmt: skip
        assert said in kept, r.stdout
    after = json.loads(swarm_engine.docker("service", "inspect", "lp").stdout)[0]["Spec"]
    c, was = after["TaskTemplate"]["ContainerSpec"], before["TaskTemplate"]["ContainerSpec"]
    assert c["Image"] == image_id(docker_engine, test_images["v2"])
    assert (c["User"], c["CapabilityAdd"], c["Secrets"]) == ("10002:10002", ["NET_RAW"], was["Secrets"])
    # (no-new-privileges lives in the spec from Engine API 1.46; the label says it on older engines too)
    assert after["Labels"]["io.veo-edge.deploy.privilege-escalation"] == "allowed"
    assert after["TaskTemplate"]["Resources"]["Limits"]["Pids"] == 512
    assert {e for e in c["Env"] if e.startswith("VEO_EDGE_")} == {
        e for e in was["Env"] if e.startswith("VEO_EDGE_")
    }
    assert "VEO_EDGE_MODEL_CONTROL_MODE=explicit" in c["Env"]
    # given again, the defaults come back: --cap-add none drops the kept capability
    r = swarm_deploy(docker_engine, swarm_engine, test_images["v1"], "--name", "lp", "--allow-unsigned",
                     "--user", "10001:10001", "--cap-add", "none", "--no-allow-privilege-escalation",
                     "--pids-limit", "1024")  # fmt: skip
    assert r.returncode == 0, r.stderr
    kept = json.loads(r.stdout)["kept"]
    assert (
        "--port 18230" in kept and f"--control-token-file (secret {was['Secrets'][0]['SecretName']})" in kept
    )
    assert not [k for k in kept if k.split()[0] in ("--user", "--cap-add", "--allow-privilege-escalation")]
    spec = json.loads(swarm_engine.docker("service", "inspect", "lp").stdout)[0]["Spec"]
    c = spec["TaskTemplate"]["ContainerSpec"]
    assert "io.veo-edge.deploy.privilege-escalation" not in spec["Labels"]
    assert (c["User"], c.get("CapabilityAdd")) == ("10001:10001", None)
    r = veo("deploy", "remove", "lp", "--swarm", "--to", swarm_engine.host, "--volumes", timeout=120)
    assert r.returncode == 0, r.stderr


def test_a_redeploy_keeps_no_pids_limit_as_no_limit(docker_engine, swarm_engine, test_images) -> None:
    """--pids-limit 0 leaves Pids out of the spec: a re-deploy that does not give it keeps no limit (it
    read the absent field as deploy's default, 1024)."""
    pace = ("--update-monitor", "2", "--update-delay", "0", "--port", "18240", "--allow-unsigned")
    r = swarm_deploy(docker_engine, swarm_engine, test_images["v1"], "--name", "nopids", "--pids-limit", "0",
                     *pace)  # fmt: skip
    try:
        assert r.returncode == 0, r.stderr
        assert not pids_limit(swarm_engine, "nopids")
        r = swarm_deploy(docker_engine, swarm_engine, test_images["v2"], "--name", "nopids", *pace)
        assert r.returncode == 0, r.stderr
        assert "--pids-limit 0" in json.loads(r.stdout)["kept"]
        assert not pids_limit(swarm_engine, "nopids")
    finally:
        veo("deploy", "remove", "nopids", "--swarm", "--to", swarm_engine.host, "--volumes", timeout=120)


def test_a_constraint_no_node_satisfies_is_pending_not_success(
    docker_engine, swarm_engine, test_images
) -> None:
    r = swarm_deploy(
        docker_engine, swarm_engine, test_images["v1"], "--name", "orin-fleet", "--target", "orin",
        "--selinux-type", "veo_edge_t", "--allow-unsigned",
    )  # fmt: skip
    assert r.returncode == 47, r.stderr
    assert "service orin-fleet is pending" in r.stderr and "veo.target=orin" in r.stderr
    assert all(t["CurrentState"].startswith("Pending") for t in tasks(swarm_engine, "orin-fleet"))
    # --selinux-type reaches the service (as label=type: does on one device)
    spec = json.loads(swarm_engine.docker("service", "inspect", "orin-fleet").stdout)[0]["Spec"]
    privileges = spec["TaskTemplate"]["ContainerSpec"]["Privileges"]
    assert privileges["SELinuxContext"]["Type"] == "veo_edge_t"


def test_swarm_commands_on_an_engine_that_is_no_manager(docker_engine, device_engine) -> None:
    from tests.deploy.conftest import build_tiny_image

    r = veo("deploy", "status", "fleet", "--swarm", "--to", device_engine.host)
    assert r.returncode == 44 and "not a swarm manager" in r.stderr
    # a deploy says so before it moves the image (one the device has never had) onto that engine
    image = build_tiny_image(docker_engine, "veo-test/tiny:not-a-manager", "not-a-manager")
    r = veo("deploy", image, "--swarm", "--to", device_engine.host, "--allow-unsigned",
            env={"DOCKER_HOST": docker_engine.host})  # fmt: skip
    assert r.returncode == 44 and "not a swarm manager" in r.stderr, r.stderr
    moved = device_engine.docker("image", "inspect", image_id(docker_engine, image), check=False)
    assert moved.returncode != 0, "the image was transferred to an engine that cannot run the service"


def _free_run(n: int) -> int:
    """A base port with the n ports from it free on loopback."""
    import random
    import socket

    for base in random.sample(range(20000, 40000, 16), 200):
        try:
            socks = []
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no run of free ports")


def _ready(port: int, timeout: float = 2.0) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.slow
def test_three_replicas_of_the_real_image_on_one_node_and_a_bad_update_rolls_back_one_at_a_time(
    cpu_image, swarm_engine
) -> None:
    """Host networking, one node: each replica on its own ports (interleaved: HTTP base + 2(slot - 1),
    gRPC one above), so they do not fight over one, and scaling 2 -> 3 moves none (the walkthrough's scale
    failed on 'Address already in use' and the swarm's rollback left --port unserved); an update to a
    signed release that cannot start is rolled back by the swarm with at most one replica down at any
    moment; the rollback leaves the verified ID on all three."""
    import threading

    from tests.support.tamper import derive
    from veo_edge.packaging import attest, signing

    key = signing.load_private_key(cpu_image.key)
    pin = signing.fingerprint(key.public_key())
    base, name = _free_run(6), "vit-fleet"
    env = {"DOCKER_HOST": cpu_image.engine.host}
    common = ("--swarm", "--to", swarm_engine.host, "--name", name, "--port", str(base),
              "-e", "VEO_EDGE_HOST=127.0.0.1", "--verify-key", pin, "--json")  # fmt: skip
    r = veo(
        "deploy", cpu_image.built.tag, *common, "--replicas", "2", "--timeout", "400", env=env, timeout=600
    )
    assert r.returncode == 0, r.stderr
    assert _ready(base) and _ready(base + 2)
    before = {t["slot"]: t["id"] for t in json.loads(r.stdout)["tasks"] if t["desired"] == "running"}
    r = veo(
        "deploy", cpu_image.built.tag, *common, "--replicas", "3", "--timeout", "400", env=env, timeout=600
    )
    assert r.returncode == 0, r.stderr
    ports = [base, base + 2, base + 4]
    assert all(_ready(p) for p in ports)
    after = {t["slot"]: t["id"] for t in json.loads(r.stdout)["tasks"] if t["desired"] == "running"}
    assert {s: after[s] for s in before} == before and set(after) == {1, 2, 3}  # slots 1, 2 kept running
    spec = json.loads(swarm_engine.docker("service", "inspect", name).stdout)[0]["Spec"]
    assert spec["TaskTemplate"]["ContainerSpec"]["Image"] == cpu_image.built.id
    assert f"VEO_EDGE_GRPC_PORT={base + 1}" in spec["TaskTemplate"]["ContainerSpec"]["Env"]
    # the default pace: a failure is seen (15 s monitor) and a 5 s pause passes before the next replica goes
    assert (spec["UpdateConfig"]["Monitor"], spec["UpdateConfig"]["Delay"]) == (15 * 10**9, 5 * 10**9)
    assert spec["RollbackConfig"]["Monitor"] == 15 * 10**9

    # a release signed by the same key that cannot serve (an unknown backend): the swarm rolls it back
    bad = derive(
        cpu_image.engine,
        cpu_image.built.tag,
        "veo-edge/vit-nano:bad-release",
        "ENV VEO_EDGE_BACKEND=nonesuch",
    )
    bad_id = cpu_image.client.images.get(bad).id
    envelope = attest.sign_image(
        bad_id, "veo-edge/vit-nano", (cpu_image.ctx.path / "image-manifest.json").read_bytes(), {}, key
    )
    attest.store_signature_image(cpu_image.client, "veo-edge/vit-nano", bad_id, envelope)
    up: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            # a replica is down when it refuses or answers not ready, not when a loaded machine keeps its
            # answer past 2 s
            up.append(sum(_ready(p, timeout=15) for p in ports))
            done.wait(0.3)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        r = veo("deploy", bad, *common, "--replicas", "3", "--timeout", "400", env=env, timeout=600)
    finally:
        done.set()
        watcher.join()
    assert r.returncode == 46, r.stderr
    assert "the swarm rolled service vit-fleet back from veo-edge/vit-nano:bad-release" in r.stderr
    assert "the previous release is healthy on 3/3 tasks" in r.stderr.replace("\n", " ")
    assert len(up) > 20 and min(up) >= 2, up  # never more than one replica down
    assert all(_ready(p) for p in ports)
    inspect = json.loads(swarm_engine.docker("service", "inspect", name).stdout)[0]
    assert inspect["Spec"]["TaskTemplate"]["ContainerSpec"]["Image"] == cpu_image.built.id
    swarm_engine.docker("service", "rm", name, check=False)
