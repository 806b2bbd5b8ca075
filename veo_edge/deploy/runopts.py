"""How a release container runs on a device: least privilege by default, one flag to relax each part.

| default | relaxed by |
| --- | --- |
| every capability dropped (``cap_drop=ALL``) | ``--cap-add CAP`` (repeatable) |
| ``no-new-privileges`` (setuid binaries gain nothing) | ``--allow-privilege-escalation`` |
| the explicit non-root user ``10001:10001`` (the image's ``veo`` user) | ``--user UID:GID`` |
| at most 1024 processes and threads (``pids_limit``) | ``--pids-limit N`` (0: no limit) |
| one GPU on x86 GPU targets (a device request for 1) | ``--gpus N``, ``--gpus all``, ``--gpus 0,2`` |
| read-only root, a 64 MiB ``/tmp`` tmpfs, the cache volume the only other writable place | (none) |

Jetson's GPU comes through ``--runtime nvidia`` (all of its one integrated GPU); cpu targets get none.

A port below 1024 is not a ``--cap-add NET_BIND_SERVICE`` away for a non-root ``--user``: Docker puts an
added capability in the bounding and permitted sets but not the ambient one, so the server (python, no
file capabilities, under no-new-privileges) runs without it, and on host networking the floor is the
device's ``net.ipv4.ip_unprivileged_port_start``, which a container on the host's network cannot set.
:func:`check_low_ports` refuses that combination before anything is deployed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from veo_edge.deploy.profiles import (
    GRPC_PORT_ENV,
    IMAGE_GRPC_PORT,
    METRICS_PORT_ENV,
    ImageFacts,
    gpu_run,
)
from veo_edge.errors import UsageError

DEFAULT_USER = "10001:10001"
DEFAULT_PIDS_LIMIT = 1024
LABEL_DEPLOY = "io.veo-edge.deploy.name"
LABEL_IMAGE = "io.veo-edge.deploy.image"
#: the security option that keeps setuid binaries from gaining anything (unless --allow-privilege-escalation)
NO_NEW_PRIVILEGES = "no-new-privileges:true"
#: the journal: the container a new release replaces (its id), on the new release's container
LABEL_REPLACES = "io.veo-edge.deploy.replaces"
#: environment that changes which code runs inside the signed image: the dynamic loader's (read by every
#: process, the entrypoint's shell first, before the image checks itself), Python's (the image's own python
#: runs -I and ignores them, but a process started another way reads them) and the libraries veo-edge
#: loads by path. Refused like VEO_EDGE_ALLOW_UNSIGNED unless the deploy is --allow-unsigned.
CODE_ENV = frozenset(
    {
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "LD_AUDIT",
        "GCONV_PATH",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "PYTHONPLATLIBDIR",
        "PYTHONPYCACHEPREFIX",
        "PYTHONBREAKPOINT",
        "PYTHONEXECUTABLE",
        "VEO_EDGE_PLUGIN_LIB",
        "VEO_EDGE_MEMPOOL_LIB",
    }
)


@dataclass(frozen=True)
class RunOptions:
    """How a release container runs on the device (defaults: what an edge device wants)."""

    port: int = 8000
    network: str = "host"
    selinux_type: str | None = None
    memory: str | None = None  # e.g. "2g"
    cpus: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    cache_volume: str | None = None  # default: veo-edge-cache-NAME
    stop_timeout: int = 30
    user: str = DEFAULT_USER
    cap_add: tuple[str, ...] = ()
    privilege_escalation: bool = False
    pids_limit: int = DEFAULT_PIDS_LIMIT
    gpus: str = "1"
    #: a volume holding the model-control token, mounted read-only at /run/secrets/veo-edge
    secret_volume: str | None = None

    def check(self) -> None:
        if not 0 < self.port < 65536:
            raise UsageError(f"--port {self.port} is not a TCP port (1..65535)")
        if self.cpus is not None and self.cpus <= 0:
            raise UsageError(f"--cpus {self.cpus} must be positive")
        if self.pids_limit < 0:
            raise UsageError(f"--pids-limit {self.pids_limit} must be 0 (no limit) or positive")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?", self.user):
            raise UsageError(f"--user {self.user!r} is not UID[:GID] or NAME[:GROUP]")
        gpu_request(self.gpus)
        check_metrics_port(self.port, self.env)
        check_low_ports(self.user, self.cap_add, self.port, self.env)

    def volume(self, name: str) -> str:
        return self.cache_volume or f"veo-edge-cache-{name}"


def code_env(env: dict[str, str]) -> list[str]:
    """The variables of ``env`` that change which code runs inside the signed image (:data:`CODE_ENV`)."""
    return sorted(k for k in env if k in CODE_ENV)


def check_env(env: dict[str, str], allow_unsigned: bool) -> None:
    """Refuse ``-e`` that would undo what a verified deploy guarantees (exit 2, before any engine):
    ``VEO_EDGE_ALLOW_UNSIGNED`` (the container's own signature check off) and :data:`CODE_ENV` (other code
    than the signed image's), unless ``allow_unsigned``: an unverified deploy promises neither."""
    from veo_edge.packaging.manifest import ALLOW_UNSIGNED_ENV

    if allow_unsigned:
        return
    if ALLOW_UNSIGNED_ENV in env:
        raise UsageError(
            f"--env {ALLOW_UNSIGNED_ENV}={env[ALLOW_UNSIGNED_ENV]} would switch off the container's own "
            "check of the signature this deploy verifies; leave it out, or pass --allow-unsigned to deploy "
            "an unverified image knowingly (which sets it)"
        )
    code = code_env(env)
    if code:
        raise UsageError(
            f"--env {code[0]}={env[code[0]]} would change which code runs inside the signed image (the "
            f"verified files would not be the ones that run); leave {', '.join(code)} out, or pass "
            "--allow-unsigned to deploy an unverified image knowingly"
        )


def metrics_port(env: dict[str, str]) -> int | None:
    """The separate metrics port ``-e VEO_EDGE_METRICS_PORT`` asks for; None when off (unset or -1)."""
    value = env.get(METRICS_PORT_ENV)
    if value is None or value.strip() == "-1":
        return None
    if not value.strip().isdigit() or not 0 < int(value) < 65536:
        raise UsageError(f"-e {METRICS_PORT_ENV}={value} is not a TCP port (1..65535, or -1: off)")
    return int(value)


def check_metrics_port(port: int, env: dict[str, str]) -> None:
    """One device: refuse a metrics port that is the release's HTTP (``port``) or gRPC port (the server
    could not bind it, and the deploy would only find out by rolling back)."""
    metrics = metrics_port(env)
    grpc = env.get(GRPC_PORT_ENV, str(IMAGE_GRPC_PORT)).strip()
    taken = {port: "--port"}
    if grpc.isdigit():
        taken[int(grpc)] = "--grpc-port"
    if metrics in taken:
        raise UsageError(
            f"-e {METRICS_PORT_ENV}={metrics} is the release's {'HTTP' if taken[metrics] == '--port' else 'gRPC'} "
            f"port ({taken[metrics]} {metrics}); give a port clear of HTTP {port} and gRPC {grpc}, e.g. "
            f"{max(taken) + 1 if max(taken) < 65535 else 1024}, or -1 (off: /metrics is on the HTTP port too)"
        )


def check_low_ports(user: str, cap_add: tuple[str, ...], port: int, env: dict[str, str]) -> None:
    """Refuse ``--cap-add NET_BIND_SERVICE`` for a non-root ``user`` whose server would listen below 1024
    (HTTP ``port``, or the gRPC/metrics port ``env`` sets): it cannot work (module docstring)."""
    caps = {c.strip().upper().removeprefix("CAP_") for c in cap_add}
    if "NET_BIND_SERVICE" not in caps or user.split(":")[0] in ("0", "root"):
        return
    ports = {"--port": port}
    for flag, key in (("--grpc-port", GRPC_PORT_ENV), ("VEO_EDGE_METRICS_PORT", "VEO_EDGE_METRICS_PORT")):
        if env.get(key, "").strip().isdigit():
            ports[flag] = int(env[key])
    low = {flag: p for flag, p in ports.items() if 0 < p < 1024}
    if low:
        flag, p = next(iter(low.items()))
        raise UsageError(
            f"{flag} {p} with --cap-add NET_BIND_SERVICE and --user {user}: a non-root server cannot use "
            "that capability (Docker does not make it ambient, and python has no file capabilities), and "
            "on host networking a container cannot lower the device's net.ipv4.ip_unprivileged_port_start "
            f"(1024 by default); use {flag} 1024 or above (e.g. 8080 behind a proxy), or run `sysctl -w "
            f"net.ipv4.ip_unprivileged_port_start={p}` on the device and leave --cap-add NET_BIND_SERVICE out"
        )


def gpu_request(gpus: str) -> dict[str, Any]:
    """``--gpus``: ``all``, a count, or device indices ``0,2`` -> DeviceRequest arguments."""
    g = str(gpus).strip()
    if g == "all":
        return {"count": -1}
    if re.fullmatch(r"\d+", g) and int(g) > 0:
        return {"count": int(g)}
    if re.fullmatch(r"(device=)?\d+(,\d+)*", g):
        return {"device_ids": g.removeprefix("device=").split(",")}
    raise UsageError(f"--gpus {gpus!r}: give a count (1), 'all', or device indices (0,2)")


def hardening(opts: RunOptions) -> dict[str, Any]:
    """The least-privilege part of a release's ``containers.run`` arguments (module docstring's table):
    what :func:`container_kwargs` sets, and what ``deploy rollback`` requires of a kept release
    (:mod:`veo_edge.deploy.release_check`)."""
    security = [] if opts.privilege_escalation else [NO_NEW_PRIVILEGES]
    if opts.selinux_type:
        security.append(f"label=type:{opts.selinux_type}")
    kw: dict[str, Any] = {
        "read_only": True,
        "user": opts.user,
        "cap_drop": ["ALL"],
        "security_opt": security,
    }
    if opts.cap_add:
        kw["cap_add"] = list(opts.cap_add)
    if opts.pids_limit:
        kw["pids_limit"] = opts.pids_limit
    return kw


def container_kwargs(facts: ImageFacts, name: str, opts: RunOptions, replaces: str = "") -> dict[str, Any]:
    """The Docker SDK ``containers.run`` arguments of a release (by image ID: never a tag)."""
    from docker.types import DeviceRequest

    gpu = gpu_run(facts.target)
    kw: dict[str, Any] = {
        "name": name,
        "detach": True,
        **hardening(opts),
        "tmpfs": {"/tmp": "rw,nosuid,nodev,size=64m"},
        "restart_policy": {"Name": "unless-stopped"},
        "network_mode": opts.network,
        "environment": {facts.port_env: str(opts.port), **opts.env},
        "labels": {LABEL_DEPLOY: name, LABEL_IMAGE: facts.ref, LABEL_REPLACES: replaces},
        "volumes": {opts.volume(name): {"bind": facts.cache_dir, "mode": "rw"}},
        "stop_signal": "SIGTERM",
    }
    if opts.secret_volume:
        kw["volumes"][opts.secret_volume] = {"bind": "/run/secrets/veo-edge", "mode": "ro"}
    if gpu.runtime:
        kw["runtime"] = gpu.runtime
    if gpu.device_requests:
        kw["device_requests"] = [DeviceRequest(capabilities=[["gpu"]], **gpu_request(opts.gpus))]
    if opts.memory:
        kw["mem_limit"] = opts.memory
    if opts.cpus:
        kw["nano_cpus"] = int(opts.cpus * 1e9)
    return kw
