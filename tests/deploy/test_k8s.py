"""``veo-edge deploy --k8s``: manifests valid against the official Kubernetes schemas, with the probes,
GPU wiring and security context a fleet needs."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.cli.test_cli import veo
from veo_edge.deploy.k8s import DEFAULT_GRPC_PORT, K8S_VERSION, Workload, memory_bytes, render

TARGETS = ["cpu", "orin", "a100"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("replicas", [2, None])
def test_rendered_manifests_validate_against_the_official_schemas(target, replicas) -> None:
    import kubernetes_validate

    docs = render(Workload("vit-tiny", f"registry.local/vit-tiny:{target}", target, replicas=replicas,
                           memory="2g", cpus=1.5, selinux_type="veo_edge_t", trusted_key="sha256:" + "0" * 64,
                           control_token_secret="vit-tiny-control"))  # fmt: skip
    assert len(docs) == 3
    for doc in docs.values():
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises on any schema violation


def _workload(docs: dict) -> dict:
    return next(d for d in docs.values() if d["kind"] in ("Deployment", "DaemonSet"))


@pytest.mark.parametrize("target", TARGETS)
def test_probes_security_and_gpu_wiring(target) -> None:
    docs = render(Workload("vit-tiny", "img:1", target, replicas=None, selinux_type="veo_edge_t"))
    w = _workload(docs)
    assert w["kind"] == "DaemonSet"
    pod = w["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["nodeSelector"] == {"veo.target": target}
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    startup = c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["seLinuxOptions"] == {"type": "veo_edge_t"}
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/cache", "/tmp"}
    if target == "cpu":
        assert "runtimeClassName" not in pod and "resources" not in c
        assert startup >= 60
    else:
        assert pod["runtimeClassName"] == "nvidia"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert startup >= 20 * 60  # a first TensorRT engine build
    pdb = next(d for d in docs.values() if d["kind"] == "PodDisruptionBudget")
    svc = next(d for d in docs.values() if d["kind"] == "Service")
    assert (
        pdb["spec"]["selector"]["matchLabels"]
        == w["spec"]["selector"]["matchLabels"]
        == svc["spec"]["selector"]
    )


def test_cli_renders_one_workload_per_device_class_with_a_kustomization(tmp_path) -> None:
    out = tmp_path / "k8s"
    r = veo("deploy", "reg/vit:orin", "--k8s", out, "--target", "orin", "--replicas", "3", "--json",
            "--allow-unsigned", env={"DOCKER_HOST": "unix:///nonexistent.sock"})  # fmt: skip
    assert r.returncode == 0, r.stderr
    files = json.loads(r.stdout)["files"]
    kust = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert kust["kind"] == "Kustomization" and sorted(kust["resources"]) == sorted(
        p.rsplit("/", 1)[-1] for p in files if not p.endswith("kustomization.yaml")
    )
    dep = yaml.safe_load((out / "vit-orin-deployment.yaml").read_text())
    assert (
        dep["spec"]["replicas"] == 3
        and dep["spec"]["template"]["spec"]["containers"][0]["image"] == "reg/vit:orin"
    )

    # without the image at hand and without --target there is nothing to read the device class from
    r = veo(
        "deploy", "reg/vit:orin", "--k8s", tmp_path / "k2", env={"DOCKER_HOST": "unix:///nonexistent.sock"}
    )
    assert r.returncode == 41 and "no local Docker engine answers" in r.stderr
    assert not (tmp_path / "k2").exists()
    # an image that cannot be verified is rendered only with --allow-unsigned (and says so in the pod)
    env = yaml.safe_load((out / "vit-orin-deployment.yaml").read_text())["spec"]["template"]["spec"]
    assert {"name": "VEO_EDGE_ALLOW_UNSIGNED", "value": "1"} in env["containers"][0]["env"]
    r = veo("deploy", "reg/vit:orin", "--k8s", tmp_path / "k4", "--target", "orin",
            env={"DOCKER_HOST": "unix:///nonexistent.sock"})  # fmt: skip
    assert r.returncode == 43 and "cannot be verified" in r.stderr and "--allow-unsigned" in r.stderr
    assert not (tmp_path / "k4").exists()
    r = veo("deploy", "reg/vit:x", "--k8s", tmp_path / "k3", "--target", "tpu", "--allow-unsigned")
    assert r.returncode == 2 and "unknown target 'tpu'" in r.stderr


def test_memory_sizes() -> None:
    assert (
        memory_bytes("512m") == 512 << 20 and memory_bytes("2G") == 2 << 30 and memory_bytes("1024") == 1024
    )
    with pytest.raises(Exception, match="is not a size"):
        memory_bytes("lots")


def test_the_pod_pins_the_signer_and_reads_the_control_token_from_a_secret() -> None:
    docs = render(Workload("vit", "reg/vit@sha256:" + "a" * 64, "cpu", trusted_key="sha256:" + "b" * 64,
                           control_token_secret="vit-control"))  # fmt: skip
    pod = _workload(docs)["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["VEO_EDGE_TRUSTED_KEY"] == "sha256:" + "b" * 64 and "VEO_EDGE_ALLOW_UNSIGNED" not in env
    assert env["VEO_EDGE_MODEL_CONTROL_MODE"] == "explicit"
    assert env["VEO_EDGE_CONTROL_TOKEN_FILE"] == "/run/secrets/veo-edge/control-token"
    assert {"name": "control-token", "secret": {"secretName": "vit-control", "defaultMode": 0o400}} in pod[
        "volumes"
    ]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "control-token")
    assert mount == {"name": "control-token", "mountPath": "/run/secrets/veo-edge", "readOnly": True}
    assert "s3cret" not in json.dumps(docs)  # nothing of the token itself, only the Secret's name


NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent.sock"}


def _render_cli(tmp_path, target: str, *flags: str):
    """``deploy --k8s`` through the CLI (no engine: --target and --allow-unsigned), its pod spec, its
    Service, and its stderr with rich's wrapping undone."""
    import kubernetes_validate

    out = tmp_path / "k8s"
    r = veo("deploy", f"reg/vit:{target}", "--k8s", out, "--target", target, "--allow-unsigned", *flags,
            env=NO_ENGINE)  # fmt: skip
    assert r.returncode == 0, r.stderr
    docs = {p.name: yaml.safe_load(p.read_text()) for p in out.iterdir() if p.name != "kustomization.yaml"}
    for doc in docs.values():
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    pod = _workload(docs)["spec"]["template"]["spec"]
    svc = next(d for d in docs.values() if d["kind"] == "Service")
    return pod, svc, " ".join(r.stderr.split())


def test_user_capabilities_escalation_and_gpus_reach_the_pod(tmp_path) -> None:
    relax = ["--cap-add", "NET_BIND_SERVICE", "--cap-add", "cap_sys_ptrace", "--allow-privilege-escalation"]
    pod, _, err = _render_cli(tmp_path, "a100", "--user", "2000:3000", *relax, "--gpus", "2")
    c = pod["containers"][0]
    assert pod["securityContext"]["runAsUser"] == c["securityContext"]["runAsUser"] == 2000
    assert pod["securityContext"]["runAsGroup"] == pod["securityContext"]["fsGroup"] == 3000
    assert c["securityContext"]["capabilities"] == {
        "drop": ["ALL"],
        "add": ["NET_BIND_SERVICE", "SYS_PTRACE"],
    }
    assert c["securityContext"]["allowPrivilegeEscalation"] is True
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
    # what leaves the restricted Pod Security Standard is said on stderr; NET_BIND_SERVICE does not
    assert (
        "--cap-add SYS_PTRACE: the restricted Pod Security Standard allows adding only NET_BIND_SERVICE"
        in err
    )
    assert (
        "--allow-privilege-escalation: allowPrivilegeEscalation: true; a namespace enforcing the restricted"
        in err
    )

    # Jetson has one integrated GPU: --gpus 2 is said to be ignored, not rendered unschedulable
    pod, _, err = _render_cli(tmp_path / "orin", "orin", "--gpus", "2", "--cap-add", "NET_BIND_SERVICE")
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "--gpus 2: target orin gets its one integrated GPU" in err and "Pod Security" not in err


def test_a_port_below_1024_comes_from_the_pods_sysctl_not_a_capability(tmp_path) -> None:
    pod, _, err = _render_cli(tmp_path, "cpu", "--port", "80", "--cap-add", "NET_BIND_SERVICE")
    assert pod["securityContext"]["sysctls"] == [
        {"name": "net.ipv4.ip_unprivileged_port_start", "value": "80"}
    ]
    assert pod["containers"][0]["ports"][0]["containerPort"] == 80
    assert "--cap-add NET_BIND_SERVICE: the pod's non-root server cannot use it" in err
    pod, _, _ = _render_cli(tmp_path / "high", "cpu")  # 8000/8001: no sysctl
    assert "sysctls" not in pod["securityContext"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--user", "veo:veo"], "--user 'veo:veo': Kubernetes runs a pod as numbers (runAsUser, runAsGroup)"),
        (["--user", "2000"], "--user 2000: Kubernetes needs the group too"),
        (["--user", "0:0"], "--user 0:0: UID 0 is root and the pod runs with runAsNonRoot"),
        (
            ["--pids-limit", "50"],
            "--pids-limit 50: a Kubernetes pod spec has no pids limit (it is the kubelet's",
        ),
        (["--gpus", "all"], "--gpus all: a Kubernetes pod asks for a number of nvidia.com/gpu"),
        (["--gpus", "0,2"], "--gpus 0,2: a Kubernetes pod asks for a number of nvidia.com/gpu"),
        (["--port", "8001"], "--port 8001 is the gRPC port too"),
        (["--cache-host-path", "var/cache"], "--cache-host-path 'var/cache' is not an absolute path"),
    ],
)
def test_what_a_pod_spec_cannot_say_is_refused_in_one_line(tmp_path, flags, message) -> None:
    out = tmp_path / "k8s"
    r = veo(
        "deploy", "reg/vit:a100", "--k8s", out, "--target", "a100", "--allow-unsigned", *flags, env=NO_ENGINE
    )
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not out.exists()


def test_grpc_is_a_named_container_and_service_port(tmp_path) -> None:
    for grpc, expected in ((DEFAULT_GRPC_PORT, 8001), (9001, 9001), (None, None)):
        docs = render(Workload("vit", "img:1", "cpu", grpc_port=grpc))
        c, svc = _workload(docs)["spec"]["template"]["spec"]["containers"][0], docs["vit-service.yaml"]
        env = {e["name"]: e["value"] for e in c["env"]}
        want = [("http", 8000)] + ([("grpc", expected)] if expected else [])
        assert [(p["name"], p["containerPort"]) for p in c["ports"]] == want
        assert [(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
            (n, p, n) for n, p in want
        ]
        # the server listens where the ports say: the image serves 8001 unless told otherwise
        assert env.get("VEO_EDGE_GRPC_PORT") == (None if grpc == 8001 else str(expected or -1))
    pod, svc, _ = _render_cli(tmp_path, "cpu", "--grpc-port", "9001")
    assert {"name": "grpc", "containerPort": 9001, "protocol": "TCP"} in pod["containers"][0]["ports"]
    assert {"name": "grpc", "port": 9001, "targetPort": "grpc", "protocol": "TCP"} in svc["spec"]["ports"]
    pod, svc, _ = _render_cli(tmp_path / "off", "cpu", "-e", "VEO_EDGE_GRPC_PORT=-1")
    assert [p["name"] for p in svc["spec"]["ports"]] == ["http"]


def test_the_cache_host_path_must_exist_owned_by_the_pods_user(tmp_path) -> None:
    pod, _, err = _render_cli(
        tmp_path, "orin", "--cache-host-path", "/var/lib/veo-edge", "--user", "2000:3000"
    )
    volume = next(v for v in pod["volumes"] if v["name"] == "engine-cache")
    # not DirectoryOrCreate: the kubelet would make it root-owned 0755, unwritable by uid 2000
    assert volume == {"name": "engine-cache", "hostPath": {"path": "/var/lib/veo-edge", "type": "Directory"}}
    assert "install -d -o 2000 -g 3000 /var/lib/veo-edge" in err
    assert "outside the baseline and restricted Pod Security Standards" in err


class _Engine:
    """The one thing ``_digest_ref`` reads of a local engine without --registry: an image's RepoDigests."""

    def __init__(self, digests: list[str]) -> None:
        self.images = self
        self.attrs = {"RepoDigests": digests}

    def get(self, image_id: str) -> _Engine:
        return self


def test_a_digest_already_known_is_named_with_why_and_never_picked_at_random() -> None:
    from veo_edge.cli._deploy_k8s import _digest_ref
    from veo_edge.errors import UsageError

    d1, d2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    ref, why = _digest_ref(_Engine([f"127.0.0.1:18250/vit@{d1}"]), "vit:orin", "sha256:id", None, None)
    assert ref == f"127.0.0.1:18250/vit@{d1}"
    assert "no --registry given" in why and "loopback" in why and "--registry REG" in why
    # several: refused, whichever order the engine lists them in
    for digests in (
        [f"reg.local:5000/vit@{d2}", f"reg.local:5000/vit@{d1}"],
        [f"a.example/vit@{d1}", f"b.example/vit@{d2}"],
    ):
        with pytest.raises(
            UsageError, match=r"has 2 registry digests on the local engine .*; pass --registry REG"
        ):
            _digest_ref(_Engine(digests), "reg.local:5000/vit:1", "sha256:id", None, None)
    # the image's own repository first; no other digest: nothing to name (the caller asks for --registry)
    ref, why = _digest_ref(_Engine([f"b.example/vit@{d1}", f"reg/vit@{d2}"]), "reg/vit:1", "i", None, None)
    assert ref == f"reg/vit@{d2}" and "loopback" not in why
    assert _digest_ref(_Engine([]), "vit:orin", "sha256:id", None, None) == (None, None)
