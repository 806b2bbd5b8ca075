"""Kubernetes / k3s manifests for a fleet: one workload per model and device class, ready for
``kubectl apply -k OUT_DIR``.

For each image: a Deployment (``--replicas N``) or a DaemonSet (``--global``: one pod per labelled node)
selecting nodes by ``veo.target=<target>``; on GPU targets ``runtimeClassName: nvidia`` and
``nvidia.com/gpu`` (``--gpus N`` on x86); the HTTP port and the KServe v2 gRPC port (named ``http`` and
``grpc``); liveness and readiness on the KServe v2 health routes, a startup probe long enough for a first
TensorRT engine build; an engine-cache volume; the restricted security context (non-root, read-only
root, no privilege escalation, no capabilities, RuntimeDefault seccomp, SELinux type when given), each
part relaxed by the same flags as on one device (:mod:`.k8s_options`). The image is named by digest
(``repo@sha256:...``) once verified, and the container's own check pins the signing key
(``VEO_EDGE_TRUSTED_KEY``); the model-control token comes from a Secret the user creates
(``--control-token-secret``), never from the image or the manifests. Then a Service, a
PodDisruptionBudget and a kustomization tying them together.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from veo_edge.deploy.profiles import (
    DEFAULT_CACHE_DIR,
    DEFAULT_PORT_ENV,
    GRPC_PORT_ENV,
    NODE_LABEL,
    gpu_run,
    memory_bytes,
)
from veo_edge.errors import UsageError

#: the Kubernetes version the rendered manifests are validated against (tests/deploy)
K8S_VERSION = "1.31.0"
#: a first TensorRT engine build on an Orin takes minutes: let the startup probe wait this long
GPU_STARTUP_S = 30 * 60
CPU_STARTUP_S = 5 * 60
DEFAULT_UID = 10001
#: the pod sysctl that lets a non-root server listen below 1024 (safe, kubelet 1.22+; baseline PSS)
UNPRIVILEGED_PORT_SYSCTL = "net.ipv4.ip_unprivileged_port_start"
#: the KServe v2 gRPC port a veo-edge image serves unless VEO_EDGE_GRPC_PORT says otherwise
DEFAULT_GRPC_PORT = 8001
TRUSTED_KEY_ENV = "VEO_EDGE_TRUSTED_KEY"
ALLOW_UNSIGNED_ENV = "VEO_EDGE_ALLOW_UNSIGNED"
#: the model-control API's token, from a Secret mounted read-only (serve reads the file it names)
CONTROL_MODE_ENV = "VEO_EDGE_MODEL_CONTROL_MODE"
CONTROL_TOKEN_ENV = "VEO_EDGE_CONTROL_TOKEN_FILE"
CONTROL_TOKEN_DIR = "/run/secrets/veo-edge"
CONTROL_TOKEN_KEY = "control-token"


@dataclass(frozen=True)
class Workload:
    """One model on one device class."""

    name: str
    image: str
    target: str
    replicas: int | None = 1  # None: DaemonSet
    port: int = 8000
    port_env: str = DEFAULT_PORT_ENV
    cache_dir: str = DEFAULT_CACHE_DIR
    cache_host_path: str | None = None
    uid: int = DEFAULT_UID
    gid: int = DEFAULT_UID
    #: capabilities given back (every one is dropped first), without the CAP_ prefix
    cap_add: tuple[str, ...] = ()
    privilege_escalation: bool = False
    #: nvidia.com/gpu on x86 GPU targets (Jetson: its one integrated GPU; cpu: none)
    gpus: int = 1
    #: the gRPC port the server listens on (None: off); ``env[VEO_EDGE_GRPC_PORT]`` wins when given
    grpc_port: int | None = DEFAULT_GRPC_PORT
    selinux_type: str | None = None
    memory: str | None = None
    cpus: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    namespace: str | None = None
    #: the signing key's fingerprint the container's own check requires (VEO_EDGE_TRUSTED_KEY)
    trusted_key: str | None = None
    allow_unsigned: bool = False
    #: a Secret (made by the user, never rendered here) whose key ``control-token`` holds the bearer
    #: token of the model-control API; with it, model load/unload is on (--model-control-mode explicit)
    control_token_secret: str | None = None


def _k8s_name(name: str) -> str:
    n = re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")[:63].strip("-")
    if not n:
        raise UsageError(f"--name {name!r} gives no valid Kubernetes name (lowercase letters, digits, '-')")
    return n


def _env(w: Workload) -> dict[str, str]:
    env = {w.port_env: str(w.port)}
    if w.grpc_port != DEFAULT_GRPC_PORT:
        env[GRPC_PORT_ENV] = str(-1 if w.grpc_port is None else w.grpc_port)
    if w.trusted_key:
        env[TRUSTED_KEY_ENV] = w.trusted_key
    if w.allow_unsigned:
        env[ALLOW_UNSIGNED_ENV] = "1"
    if w.control_token_secret:
        env[CONTROL_MODE_ENV] = "explicit"
        env[CONTROL_TOKEN_ENV] = f"{CONTROL_TOKEN_DIR}/{CONTROL_TOKEN_KEY}"
    return {**env, **dict(sorted(w.env.items()))}


def _grpc_port(w: Workload, env: dict[str, str]) -> int | None:
    """The gRPC port the container's server listens on (what its VEO_EDGE_GRPC_PORT says), or None."""
    raw = env.get(GRPC_PORT_ENV, str(DEFAULT_GRPC_PORT))
    if not re.fullmatch(r"-1|\d+", raw.strip()) or not -1 <= int(raw) < 65536 or int(raw) == 0:
        raise UsageError(f"{GRPC_PORT_ENV}={raw!r} is not a TCP port for a Service (1..65535, or -1: off)")
    port = int(raw)
    if port == w.port:
        raise UsageError(
            f"--port {w.port} is the gRPC port too; give --grpc-port another port (or -1: no gRPC)"
        )
    return None if port < 0 else port


def render(w: Workload) -> dict[str, dict[str, Any]]:
    """The manifests of one workload, by file name."""
    name = _k8s_name(w.name)
    gpu = gpu_run(w.target)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "veo-edge", NODE_LABEL: w.target}
    selector = {"app.kubernetes.io/name": name, NODE_LABEL: w.target}
    meta = {"name": name, "labels": labels, **({"namespace": w.namespace} if w.namespace else {})}
    startup_s = GPU_STARTUP_S if gpu.k8s_gpu_resource else CPU_STARTUP_S

    def probe(path: str, period: int, failures: int) -> dict[str, Any]:
        return {
            "httpGet": {"path": path, "port": "http"},
            "periodSeconds": period,
            "timeoutSeconds": 5,
            "failureThreshold": failures,
        }

    resources: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if w.memory:
        requests["memory"] = limits["memory"] = str(memory_bytes(w.memory))
    if w.cpus:
        requests["cpu"] = limits["cpu"] = f"{int(w.cpus * 1000)}m"
    if gpu.k8s_gpu_resource:
        limits[gpu.k8s_gpu_resource] = w.gpus if gpu.device_requests else 1
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits

    container_sc: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": w.uid,
        "allowPrivilegeEscalation": w.privilege_escalation,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], **({"add": list(w.cap_add)} if w.cap_add else {})},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    pod_sc: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": w.uid,
        "runAsGroup": w.gid,
        "fsGroup": w.gid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if w.selinux_type:
        pod_sc["seLinuxOptions"] = {"type": w.selinux_type}
    if w.cache_host_path and not w.cache_host_path.startswith("/"):
        raise UsageError(f"--cache-host-path {w.cache_host_path!r} is not an absolute path on the node")
    cache_volume: dict[str, Any] = (
        # Directory, not DirectoryOrCreate: the kubelet would create it root-owned 0755, which the pod's
        # user cannot write (fsGroup does not apply to hostPath); see k8s_options.notes()
        {"name": "engine-cache", "hostPath": {"path": w.cache_host_path, "type": "Directory"}}
        if w.cache_host_path
        else {"name": "engine-cache", "emptyDir": {"sizeLimit": "2Gi"}}
    )
    env = _env(w)
    grpc = _grpc_port(w, env)
    ports = [("http", w.port)] + ([("grpc", grpc)] if grpc else [])
    lowest = min(p for _, p in ports)
    if lowest < 1024:
        # a non-root server cannot use NET_BIND_SERVICE (it is not ambient and python has no file
        # capabilities); the pod's own network namespace may lower the floor instead, a safe sysctl
        pod_sc["sysctls"] = [{"name": UNPRIVILEGED_PORT_SYSCTL, "value": str(lowest)}]
    container = {
        "name": "server",
        "image": w.image,
        "imagePullPolicy": "IfNotPresent",
        "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "startupProbe": probe("/v2/health/live", 10, startup_s // 10),
        "livenessProbe": probe("/v2/health/live", 10, 3),
        "readinessProbe": probe("/v2/health/ready", 5, 2),
        "securityContext": container_sc,
        "volumeMounts": [
            {"name": "engine-cache", "mountPath": w.cache_dir},
            {"name": "tmp", "mountPath": "/tmp"},
        ]
        + (
            [{"name": "control-token", "mountPath": CONTROL_TOKEN_DIR, "readOnly": True}]
            if w.control_token_secret
            else []
        ),
        **({"resources": resources} if resources else {}),
    }
    pod_spec: dict[str, Any] = {
        "nodeSelector": {NODE_LABEL: w.target},
        "securityContext": pod_sc,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 40,  # the server drains for up to 30 s on SIGTERM
        "containers": [container],
        "volumes": [cache_volume, {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}}]
        + (
            [
                {
                    "name": "control-token",
                    "secret": {"secretName": w.control_token_secret, "defaultMode": 0o400},
                }
            ]
            if w.control_token_secret
            else []
        ),
    }
    if gpu.k8s_runtime_class:
        pod_spec["runtimeClassName"] = gpu.k8s_runtime_class
    template = {"metadata": {"labels": labels}, "spec": pod_spec}
    if w.replicas is None:
        workload = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": meta,
            "spec": {
                "selector": {"matchLabels": selector},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                "template": template,
            },
        }
    else:
        workload = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": w.replicas,
                "selector": {"matchLabels": selector},
                # one pod at a time, never more than asked for (GPU devices run one server each)
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
                "template": template,
            },
        }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "selector": selector,
            "ports": [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in ports],
        },
    }
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta,
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}},
    }
    kind = workload["kind"].lower()
    return {f"{name}-{kind}.yaml": workload, f"{name}-service.yaml": service, f"{name}-pdb.yaml": pdb}


def write_manifests(workloads: list[Workload], out_dir: Path) -> list[Path]:
    """Render every workload into ``out_dir`` with a kustomization.yaml; all or nothing."""
    import os
    import shutil
    import tempfile

    import yaml

    if not workloads:
        raise UsageError("nothing to render: give at least one image")
    docs: dict[str, dict[str, Any]] = {}
    for w in workloads:
        for fname, doc in render(w).items():
            if fname in docs:
                raise UsageError(f"two workloads render the same {fname}: give them different --name")
            docs[fname] = doc
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--k8s {out_dir} is a file; give a directory")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for fname, doc in docs.items():
            (stage / fname).write_text(yaml.safe_dump(doc, sort_keys=False))
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": sorted(docs),
        }
        (stage / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
        out_dir.mkdir(exist_ok=True)
        written = []
        for f in sorted(stage.iterdir()):
            os.replace(f, out_dir / f.name)
            written.append(out_dir / f.name)
        return written
    finally:
        shutil.rmtree(stage, ignore_errors=True)
