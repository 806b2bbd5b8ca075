"""``veo-edge deploy`` onto one device: a second real dockerd stands in for it.

The images are built on the build host's engine (DOCKER_HOST of the CLI) and must reach the device by
the deploy's own transfer; health is Docker's, from each image's HEALTHCHECK.
"""

from __future__ import annotations

import json

import pytest

from tests.cli.test_cli import veo


def deploy(build_host, device, *args, timeout=240):
    """The small test images are not veo-edge builds and carry no signature: deployed with
    --allow-unsigned (the signed path is tests/deploy/test_real_image.py and tests/packaging/)."""
    return veo("deploy", *args, "--to", device.host, "--allow-unsigned", env={"DOCKER_HOST": build_host.host},
               timeout=timeout)  # fmt: skip


LEAST = (
    ("HostConfig", "CapDrop"),
    ("HostConfig", "SecurityOpt"),
    ("Config", "User"),
    ("HostConfig", "PidsLimit"),
)


def state(device, name: str) -> dict | None:
    r = device.docker("inspect", name, check=False)
    if r.returncode != 0:
        return None
    c = json.loads(r.stdout)[0]
    return {
        "image": c["Config"]["Labels"].get("io.veo-edge.deploy.image"),
        "status": c["State"]["Status"],
        "health": (c["State"].get("Health") or {}).get("Status"),
        "read_only": c["HostConfig"]["ReadonlyRootfs"],
        "restart": c["HostConfig"]["RestartPolicy"]["Name"],
        "network": c["HostConfig"]["NetworkMode"],
        "env": c["Config"]["Env"],
        "mounts": [m["Destination"] for m in c["Mounts"]],
        "image_id": c["Image"],
        "least": tuple(c[k1][k2] for k1, k2 in LEAST),
    }


@pytest.fixture
def release_name(request, device_engine):
    name = f"app-{request.node.name[-20:].strip('_').replace('[', '-').replace(']', '')}"
    yield name
    for n in (name, f"{name}-previous", f"{name}-rollback", f"{name}-outgoing"):
        device_engine.docker("rm", "-f", n, check=False)


def test_deploy_transfers_runs_healthy_then_rolls_back_a_bad_release(
    docker_engine, device_engine, test_images, release_name
) -> None:
    name = release_name
    assert device_engine.docker("image", "inspect", test_images["v1"], check=False).returncode != 0

    r = deploy(docker_engine, device_engine, test_images["v1"], "--name", name, "--port", "18123", "--json",
               "--pids-limit", "1024", "--grpc-port", "18124")  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["transfer"]["method"] == "stream" and report["transfer"]["bytes"] > 10 << 20
    assert report["previous_image"] is None
    s = state(device_engine, name)
    assert s["image"] == test_images["v1"] and s["status"] == "running" and s["health"] == "healthy"
    assert s["read_only"] and s["restart"] == "unless-stopped" and s["network"] == "host"
    assert "VEO_EDGE_PORT=18123" in s["env"] and "/cache" in s["mounts"]
    assert "VEO_EDGE_GRPC_PORT=18124" in s["env"]  # a second release on the device gets its own gRPC port
    assert s["least"] == (["ALL"], ["no-new-privileges:true"], "10001:10001", 1024)
    assert (
        s["image_id"]
        == docker_engine.docker("image", "inspect", "-f", "{{.Id}}", test_images["v1"]).stdout.strip()
    )
    assert "VEO_EDGE_ALLOW_UNSIGNED=1" in s["env"]  # said loudly on the way, and to the container
    assert "WARNING: deploying an UNVERIFIED image (--allow-unsigned)" in r.stderr

    # the same image again: the device has that image id, so nothing is transferred
    r = deploy(docker_engine, device_engine, test_images["v1"], "--name", name, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["transfer"]["method"] == "present"

    r = deploy(docker_engine, device_engine, test_images["v2"], "--name", name, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["previous_image"] == test_images["v1"]
    assert state(device_engine, f"{name}-previous")["status"] == "exited"  # kept, stopped
    # the same image again (a retried job): the kept previous release stays the way back to v1
    r = deploy(docker_engine, device_engine, test_images["v2"], "--name", name, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["previous_image"] == test_images["v1"]
    assert state(device_engine, f"{name}-previous")["image"] == test_images["v1"]

    # a release that never becomes healthy: removed, v2 restarted and proven healthy, exit 33 with why
    r = deploy(docker_engine, device_engine, test_images["unhealthy"], "--name", name, "--timeout", "30")
    assert r.returncode == 46, r.stderr
    err = r.stderr.replace("\n", " ")
    assert "did not become healthy" in err and "rolled back to the previous release veo-test/app:v2" in err
    assert "canary mismatch" in err  # the last healthcheck output
    assert "serving a broken model" in err  # the last log lines
    s = state(device_engine, name)
    assert s["image"] == test_images["v2"] and s["status"] == "running" and s["health"] == "healthy"
    assert device_engine.docker("ps", "-a", "--filter", "ancestor=veo-test/app:unhealthy", "-q").stdout == ""
    assert state(device_engine, f"{name}-previous")["image"] == test_images["v1"]  # a failed deploy keeps it

    # a release whose process exits: same rollback
    r = deploy(docker_engine, device_engine, test_images["crashing"], "--name", name, "--timeout", "30")
    assert r.returncode == 46, r.stderr
    assert "the container exited" in r.stderr and "cannot open model.bin" in r.stderr
    assert state(device_engine, name)["image"] == test_images["v2"]

    # status, then a manual rollback to the kept v1, and back again
    r = veo("deploy", "status", name, "--to", device_engine.host, "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["current"]["image"] == test_images["v2"] and st["current"]["health"] == "healthy"
    assert st["previous"]["image"] == test_images["v1"] and st["previous"]["state"] == "exited"
    assert st["previous"]["health"] is None  # stopped on purpose: no health verdict, not "unhealthy"
    r = veo("deploy", "status", name, "--to", device_engine.host)
    assert r.returncode == 0, r.stderr
    assert f"previous: {name}-previous {test_images['v1']} exited (stopped, kept for" in r.stdout, r.stdout
    # the kept v1 is unsigned: a rollback verifies it as a deploy would, so it needs --allow-unsigned too
    r = veo("deploy", "rollback", name, "--to", device_engine.host)
    assert r.returncode == 43 and "is unsigned" in r.stderr and "runs as before" in r.stderr, r.stderr
    assert state(device_engine, name)["image"] == test_images["v2"]
    r = veo("deploy", "rollback", name, "--to", device_engine.host, "--allow-unsigned", "--json")
    assert r.returncode == 0, r.stderr
    assert not json.loads(r.stdout)["verified"] and "rolling back to an UNVERIFIED release" in r.stderr
    assert state(device_engine, name)["image"] == test_images["v1"]
    assert state(device_engine, name)["health"] == "healthy"
    assert state(device_engine, f"{name}-previous")["image"] == test_images["v2"]


def test_first_deploy_of_a_bad_release_leaves_nothing_running(
    docker_engine, device_engine, test_images, release_name
) -> None:
    r = deploy(
        docker_engine, device_engine, test_images["unhealthy"], "--name", release_name, "--timeout", "30"
    )
    assert r.returncode == 46, r.stderr
    assert "there was no previous release" in r.stderr
    assert state(device_engine, release_name) is None


def test_an_image_without_a_healthcheck_is_refused_before_anything_runs(
    docker_engine, device_engine, test_images, release_name
) -> None:
    r = deploy(docker_engine, device_engine, test_images["nohealth"], "--name", release_name)
    assert r.returncode == 44, r.stderr  # deploy failed, as the exit-code table in docs/deploy.md says
    assert "has no HEALTHCHECK" in r.stderr
    assert state(device_engine, release_name) is None


@pytest.mark.parametrize(
    ("to", "code", "message"),
    [
        ("tcp://127.0.0.1:2375", 45, "refusing plain tcp://127.0.0.1:2375"),
        ("http://device:2375", 2, "is not a Docker engine address"),
        (
            "unix:///nonexistent/docker.sock",
            41,
            "no Docker engine answers at unix:///nonexistent/docker.sock",
        ),
        ("ssh://", 2, "names no host"),
    ],
)
def test_bad_engine_addresses_are_one_line_errors(to, code, message) -> None:
    r = veo("deploy", "some/image:1", "--to", to)
    assert r.returncode == code, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_bad_grpc_ports_and_registries_are_refused_before_any_engine() -> None:
    for args, said in (
        (
            ["--port", "18123", "--grpc-port", "18123"],
            "--grpc-port 18123 is not a free TCP port beside --port 18123",
        ),
        (["--grpc-port", "70000"], "--grpc-port 70000 is not a free TCP port"),
        (["--grpc-port", "9001", "--env", "VEO_EDGE_GRPC_PORT=9002"], "disagree; give one"),
        (["--registry", "http://127.0.0.1:5000"], "is not a registry address: HOST[:PORT]"),
        (["--registry", "bad registry"], "--registry 'bad registry' is not a registry address"),
        # a verified deploy's container keeps its own signature check: not switched off by -e
        (["-e", "VEO_EDGE_ALLOW_UNSIGNED=1"], "--env VEO_EDGE_ALLOW_UNSIGNED=1 would switch off the"),
    ):
        r = veo("deploy", "some/image:1", "--to", "unix:///nonexistent/docker.sock", *args)
        assert r.returncode == 2 and said in r.stderr, r.stderr
    for mode in ([], ["--swarm"], ["--k8s", "/nonexistent/out"]):
        r = veo("deploy", "some/image:1", "--to", "unix:///nonexistent/docker.sock", *mode,
                "-e", "VEO_EDGE_ALLOW_UNSIGNED=yes")  # fmt: skip
        assert r.returncode == 2 and "--allow-unsigned to deploy an unverified image" in r.stderr, r.stderr
    # with --allow-unsigned it is what the deploy sets anyway: refused only for the missing engine
    r = veo("deploy", "some/image:1", "--to", "unix:///nonexistent/docker.sock", "--allow-unsigned",
            "-e", "VEO_EDGE_ALLOW_UNSIGNED=1")  # fmt: skip
    assert r.returncode == 41, r.stderr


@pytest.mark.parametrize("mode", [[], ["--swarm"], ["--k8s", "/nonexistent/out"]])
def test_env_that_changes_the_code_in_the_signed_image_is_refused_before_any_engine(mode) -> None:
    """-e LD_PRELOAD (read by the entrypoint's shell before the image checks itself), PYTHONPATH and the
    like would run other code than the verified files: refused as -e VEO_EDGE_ALLOW_UNSIGNED is."""
    to = ("--to", "unix:///nonexistent/docker.sock", *mode)
    for pair in ("LD_PRELOAD=/cache/x.so", "LD_LIBRARY_PATH=/cache", "PYTHONPATH=/cache", "PYTHONSTARTUP=/cache/s.py",
                 "PYTHONHOME=/cache", "PYTHONUSERBASE=/cache", "VEO_EDGE_PLUGIN_LIB=/cache/p.so"):  # fmt: skip
        r = veo("deploy", "some/image:1", *to, "-e", "A=1", "-e", pair)
        assert r.returncode == 2, r.stderr
        assert f"--env {pair} would change which code runs inside the signed image" in r.stderr, r.stderr
        assert "or pass --allow-unsigned to deploy an unverified image knowingly" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    # an unverified deploy promises nothing about the code: refused only for the missing engine
    if not mode or mode == ["--swarm"]:
        r = veo("deploy", "some/image:1", *to, "--allow-unsigned", "-e", "LD_PRELOAD=/cache/x.so")
        assert r.returncode == 41, r.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["-e", "VEO_EDGE_METRICS_PORT=8000"],
            "=8000 is the release's HTTP port (--port 8000); give a port clear",
        ),
        (["-e", "VEO_EDGE_METRICS_PORT=8001"], "=8001 is the release's gRPC port (--grpc-port 8001)"),
        (["--port", "9000", "-e", "VEO_EDGE_METRICS_PORT=9000"], "HTTP port (--port 9000)"),
        (["--grpc-port", "9005", "-e", "VEO_EDGE_METRICS_PORT=9005"], "gRPC port (--grpc-port 9005)"),
        (["-e", "VEO_EDGE_METRICS_PORT=70000"], "VEO_EDGE_METRICS_PORT=70000 is not a TCP port"),
    ],
)
def test_a_device_metrics_port_on_the_http_or_grpc_port_is_refused_before_any_engine(args, said) -> None:
    r = veo("deploy", "some/image:1", "--to", "unix:///nonexistent/docker.sock", *args)
    assert r.returncode == 2 and said in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    # clear of them, or off: refused only for the missing engine
    for ok in ("8002", "-1"):
        r = veo("deploy", "some/image:1", "--to", "unix:///nonexistent/docker.sock",
                "-e", f"VEO_EDGE_METRICS_PORT={ok}")  # fmt: skip
        assert r.returncode == 41, r.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        # slot 3's metrics port (8000 + 4) is slot 3's HTTP port, on the default layout
        (
            ["--replicas", "3", "-e", "VEO_EDGE_METRICS_PORT=8000"],
            "slot 1 would serve metrics on 8000, the HTTP",
        ),
        (
            ["--replicas", "3", "-e", "VEO_EDGE_METRICS_PORT=8003"],
            "slot 1 would serve metrics on 8003, the gRPC",
        ),
        (
            ["--replicas", "2", "-e", "VEO_EDGE_METRICS_PORT=7998"],
            "slot 2 would serve metrics on 8000, the HTTP",
        ),
        (["--replicas", "2", "--grpc-port", "9001", "-e", "VEO_EDGE_METRICS_PORT=9003"], "on 9003, the gRPC"),
        (["-e", "VEO_EDGE_METRICS_PORT=metrics"], "VEO_EDGE_METRICS_PORT=metrics is not a TCP port"),
    ],
)
def test_a_swarm_metrics_port_that_meets_another_slots_port_is_refused_before_any_engine(args, said) -> None:
    r = veo("deploy", "some/image:1", "--swarm", "--to", "unix:///nonexistent/docker.sock", *args)
    assert r.returncode == 2 and said in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    if "slot" in said:
        assert "give a port clear of them, e.g." in r.stderr
    # clear of them (8000..8005 for three slots): refused only for the missing engine
    r = veo("deploy", "some/image:1", "--swarm", "--to", "unix:///nonexistent/docker.sock", "--replicas", "3",
            "-e", "VEO_EDGE_METRICS_PORT=8006")  # fmt: skip
    assert r.returncode == 41, r.stderr


@pytest.mark.parametrize("swarm", [[], ["--swarm"]])
def test_net_bind_service_for_a_non_root_user_below_1024_is_refused_before_any_engine(swarm) -> None:
    """On host networking a non-root server cannot bind below 1024 with --cap-add NET_BIND_SERVICE (no
    ambient capability, no file capability on python): refused with what to do, not rolled back later."""
    to = ("--to", "unix:///nonexistent/docker.sock", *swarm)
    r = veo("deploy", "some/image:1", *to, "--port", "80", "--cap-add", "NET_BIND_SERVICE")
    assert r.returncode == 2, r.stderr
    assert "--port 80 with --cap-add NET_BIND_SERVICE and --user 10001:10001: a non-root server" in r.stderr
    assert "sysctl -w net.ipv4.ip_unprivileged_port_start=80" in " ".join(r.stderr.split())
    r = veo("deploy", "some/image:1", *to, "--grpc-port", "443", "--cap-add", "net_bind_service")
    assert r.returncode == 2 and "--grpc-port 443 with --cap-add NET_BIND_SERVICE" in r.stderr, r.stderr
    # root may use it, and a port of 1024 or more needs nothing: refused only for the missing engine
    for ok in (["--port", "80", "--user", "0:0"], ["--port", "8080"]):
        r = veo("deploy", "some/image:1", *to, "--cap-add", "NET_BIND_SERVICE", *ok)
        assert r.returncode == 41, r.stderr


def test_rollback_refuses_a_previous_release_deploy_did_not_make_or_made_with_other_options(
    docker_engine, device_engine, test_images, release_name
) -> None:
    """Whatever is named NAME-previous is not started on trust: a container made by hand (another
    entrypoint, capabilities kept, a writable root) is refused, and so is one deploy made with a relaxed
    option the rollback was not given; nothing of the running release is touched."""
    name = release_name
    r = deploy(docker_engine, device_engine, test_images["v1"], "--name", name, "--cap-add", "NET_RAW")
    assert r.returncode == 0, r.stderr
    r = deploy(docker_engine, device_engine, test_images["v2"], "--name", name)
    assert r.returncode == 0, r.stderr
    running = device_engine.docker("inspect", "-f", "{{.Id}}", name).stdout
    rollback = ("deploy", "rollback", name, "--to", device_engine.host, "--allow-unsigned")
    r = veo(*rollback)
    assert r.returncode == 43, r.stderr
    assert "it adds capabilities NET_RAW (pass --cap-add for each to accept)" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert device_engine.docker("inspect", "-f", "{{.Id}}", name).stdout == running
    r = veo(*rollback, "--cap-add", "NET_RAW")  # given as the deploy was: accepted
    assert r.returncode == 0, r.stderr
    assert state(device_engine, name)["image"] == test_images["v1"]

    running = device_engine.docker("inspect", "-f", "{{.Id}}", name).stdout
    device_engine.docker("rm", f"{name}-previous")
    device_engine.docker("create", "--name", f"{name}-previous", "--network", "host", "--health-cmd", "true",
                         "--entrypoint", "/bin/sh", test_images["v1"], "-c", "echo EVIL; sleep 600")  # fmt: skip
    r = veo(*rollback)
    assert r.returncode == 43, r.stderr
    err = " ".join(r.stderr.split())
    for why in ("veo-edge deploy did not make it for", "its entrypoint ['/bin/sh'] is not the image's",
                "it keeps Linux capabilities", "its root filesystem is writable",
                "it lacks no-new-privileges", f"nothing was stopped, {name} runs as before"):  # fmt: skip
        assert why in err, err
    assert state(device_engine, f"{name}-previous")["status"] == "created"  # never started
    assert device_engine.docker("inspect", "-f", "{{.Id}}", name).stdout == running
    assert state(device_engine, name)["status"] == "running"


def test_status_of_an_unknown_release_and_a_missing_image(docker_engine, device_engine) -> None:
    r = veo("deploy", "status", "no-such-release", "--to", device_engine.host)
    assert r.returncode == 44 and "no release named no-such-release" in r.stderr
    r = deploy(docker_engine, device_engine, "veo-test/none:missing", "--name", "x")
    assert r.returncode == 49 and "is on neither the local engine nor the target" in r.stderr
    r = veo("deploy", "rollback", "no-such-release", "--to", device_engine.host)
    assert r.returncode == 44 and "no previous release of no-such-release" in r.stderr


def test_the_control_token_comes_from_its_own_volume_never_the_image(
    docker_engine, device_engine, test_images, release_name, tmp_path
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token-0123456789\n")
    r = deploy(docker_engine, device_engine, test_images["v1"], "--name", release_name,
               "--control-token-file", token)  # fmt: skip
    try:
        assert r.returncode == 0, r.stderr
        s = state(device_engine, release_name)
        assert "VEO_EDGE_MODEL_CONTROL_MODE=explicit" in s["env"]
        assert "VEO_EDGE_CONTROL_TOKEN_FILE=/run/secrets/veo-edge/control-token" in s["env"]
        read = device_engine.docker("exec", release_name, "sh", "-c",
                                    "stat -c '%u %a' /run/secrets/veo-edge/control-token; "
                                    "cat /run/secrets/veo-edge/control-token")  # fmt: skip
        assert read.stdout.splitlines() == ["10001 400", "s3cret-token-0123456789"]
        mount = json.loads(device_engine.docker("inspect", release_name).stdout)[0]["Mounts"]
        assert any(m["Name"] == f"veo-edge-control-{release_name}" and not m["RW"] for m in mount)

        # deploy remove: the release and its token's volume go, the engine-cache volume stays until asked
        control, cache = f"veo-edge-control-{release_name}", f"veo-edge-cache-{release_name}"
        r = veo("deploy", "remove", release_name, "--to", device_engine.host)
        assert r.returncode == 0, r.stderr
        assert f"removed from {device_engine.host}: {release_name}, {control}" in r.stdout, r.stdout
        assert f"kept the engine-cache volume {cache}" in r.stdout
        assert state(device_engine, release_name) is None
        names = device_engine.docker("volume", "ls", "-q").stdout.split()
        assert control not in names and cache in names
        r = veo("deploy", "remove", release_name, "--to", device_engine.host, "--volumes", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["removed_volumes"] == [cache]
        assert cache not in device_engine.docker("volume", "ls", "-q").stdout.split()
        r = veo("deploy", "remove", release_name, "--to", device_engine.host)
        assert r.returncode == 44 and f"no release named {release_name}" in r.stderr, r.stderr
    finally:
        device_engine.docker("rm", "-f", release_name, check=False)
        device_engine.docker("volume", "rm", "-f", f"veo-edge-control-{release_name}", check=False)


def test_a_failed_push_leaves_no_stray_tag_on_the_build_host(
    docker_engine, device_engine, test_images
) -> None:
    """--registry on a port where nothing listens: the push fails (exit 44) and the tag made for it goes."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    r = deploy(docker_engine, device_engine, test_images["v1"], "--name", "nopush",
               "--registry", f"127.0.0.1:{port}")  # fmt: skip
    assert r.returncode == 44 and f"to 127.0.0.1:{port} failed" in r.stderr, r.stderr
    tags = docker_engine.docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout
    assert f"127.0.0.1:{port}/" not in tags, tags
    assert state(device_engine, "nopush") is None


def test_rollback_to_a_kept_release_whose_image_was_removed_is_a_one_line_error(
    docker_engine, device_engine, test_images, release_name
) -> None:
    """Someone pruned the kept release's image on the device (``docker rmi -f``): the rollback says so
    and what to do, the running release untouched, instead of an internal error."""
    name = release_name
    for image in ("v1", "v2"):
        r = deploy(docker_engine, device_engine, test_images[image], "--name", name)
        assert r.returncode == 0, r.stderr
    kept_id = device_engine.docker("inspect", "-f", "{{.Image}}", f"{name}-previous").stdout.strip()
    device_engine.docker("rmi", "-f", kept_id)
    running = device_engine.docker("inspect", "-f", "{{.Id}}", name).stdout
    r = veo("deploy", "rollback", name, "--to", device_engine.host, "--allow-unsigned")
    assert r.returncode == 49, r.stderr
    err = " ".join(r.stderr.split())
    assert f"the image {kept_id[:19]} of the kept release {name}-previous is gone from" in err, err
    assert f"nothing was stopped, {name} runs as before" in err, err
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert device_engine.docker("inspect", "-f", "{{.Id}}", name).stdout == running
    assert state(device_engine, name)["status"] == "running"


def test_a_kept_release_with_code_changing_env_is_refused_as_a_rollback_target(
    docker_engine, test_images
) -> None:
    """What deploy refuses in -e, rollback refuses in the kept container's environment (a release made
    before the rule, or by hand), unless --allow-unsigned; read from a real container's inspect."""
    from veo_edge.deploy.release_check import pin_problems

    name = "pins-ld-preload"
    docker_engine.docker("create", "--name", name, "-e", "LD_PRELOAD=/cache/x.so", "-e",
                         "VEO_EDGE_TRUSTED_KEY=sha256:abc", test_images["v1"])  # fmt: skip
    try:
        attrs = json.loads(docker_engine.docker("inspect", name).stdout)[0]
    finally:
        docker_engine.docker("rm", "-f", name, check=False)
    report = {"verified": True, "signed_by": "sha256:abc"}
    assert pin_problems(attrs, report, allow_unsigned=False) == [
        "its environment sets LD_PRELOAD (other code than the signed image's would run; pass "
        "--allow-unsigned to accept)"
    ]
    assert pin_problems(attrs, report, allow_unsigned=True) == []
