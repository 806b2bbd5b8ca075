"""The Swarm service of a release: placement, update and rollback policy, least privilege, and one port
per replica when several share a node's network.

Least privilege as on one device (:mod:`.runopts`): every capability dropped (``--cap-add`` relaxes),
the explicit non-root user (``--user``), a pids limit (``--pids-limit``), read-only root with a tmpfs,
one GPU (``--gpus N``) on x86 GPU targets. ``no-new-privileges`` is sent in the service's
``Privileges`` (Engine API 1.46+, Docker 27+); older engines ignore that field and the service runs
without it (``--allow-privilege-escalation`` leaves it out).

Replicated services on the host network get ``VEO_EDGE_REPLICA_SLOT={{.Task.Slot}}``: the ports are
interleaved, slot s listens for HTTP on ``--port`` + 2(s - 1) and for gRPC on the gRPC port (default
``--port`` + 1) + 2(s - 1), and the healthcheck probes the same HTTP port. A slot's ports do not depend
on the replica count, so scaling a service (2 -> 3 replicas) moves no task onto another slot's port;
slot 1 keeps 8000/8001 like one device. HTTP ports have ``--port``'s parity and gRPC ports the other, so
a gRPC port an odd distance from ``--port`` never meets an HTTP port (an even one is refused). Swarm
templates cannot add numbers, so the entrypoint and the healthcheck do it.

A deploy that updates a service keeps what the command did not give (``ServiceOptions.keep``: replicas or
mode, port, gRPC port, update pace, limits, the least-privilege options and the model-control token's
secret) from the running spec (:func:`inherit`); the defaults apply only when it creates the service.
Read-only root, ``cap_drop=ALL`` and the ``/tmp`` tmpfs are no options: every release has them.

The environment is not kept: a re-deploy's ``-e`` set is the service's whole environment (besides what the
deploy sets itself, :data:`MANAGED_ENV`), as on one device, so a drill's ``VEO_EDGE_FAULTS``, a
``VEO_EDGE_CACHE_ROOT`` or an ``LD_PRELOAD`` set by an earlier deploy or by hand never outlives the deploy
that meant it. What goes is named (:func:`removed_env`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from veo_edge.deploy.profiles import (
    GRPC_PORT_ENV,
    IMAGE_GRPC_PORT,
    METRICS_PORT_ENV,
    NODE_LABEL,
    ImageFacts,
    gpu_run,
    memory_bytes,
)
from veo_edge.deploy.runopts import (
    DEFAULT_PIDS_LIMIT,
    DEFAULT_USER,
    check_low_ports,
    gpu_request,
    metrics_port,
)
from veo_edge.deploy.ship import CONTROL_FILE
from veo_edge.errors import UsageError

SLOT_ENV = "VEO_EDGE_REPLICA_SLOT"
#: the ports each slot takes on a node (HTTP, gRPC): slot s starts at --port + PORT_STRIDE * (s - 1)
PORT_STRIDE = 2
#: the /tmp tmpfs, as on one device (:mod:`.runopts`)
TMPFS_BYTES = 64 * 1024 * 1024
#: what Docker 20.10 fills in on every service update (10 s, no DNS options), given on create too: a task
#: spec that differs only by them made an update with the same task spec (a scale, a re-deploy) replace
#: every running task
STOP_GRACE_NS = 10 * 10**9
#: the options ``ServiceOptions.keep`` may name, as the command line calls them
KEEPABLE = {
    "replicas": "--replicas/--global",
    "port": "--port",
    "grpc_port": "--grpc-port",
    "monitor_s": "--update-monitor",
    "update_delay_s": "--update-delay",
    "memory": "--memory",
    "cpus": "--cpus",
    "user": "--user",
    "cap_add": "--cap-add",
    "privilege_escalation": "--allow-privilege-escalation",
    "pids_limit": "--pids-limit",
    "gpus": "--gpus",
    "selinux_type": "--selinux-type",
    "control_token": "--control-token-file",
}
#: the service label that says a release runs without no-new-privileges (an engine older than API 1.46
#: drops the Privileges field, so its absence in the spec cannot say it)
LABEL_ESCALATION = "io.veo-edge.deploy.privilege-escalation"
#: the model-control environment a ``--control-token-file`` sets (:func:`veo_edge.deploy.ship.control_token_secret`)
CONTROL_ENV = ("VEO_EDGE_MODEL_CONTROL_MODE", "VEO_EDGE_CONTROL_TOKEN_FILE")
#: environment a deploy sets itself (ports, the slot, the signer pin, model control): never kept as -e
MANAGED_ENV = (
    SLOT_ENV,
    GRPC_PORT_ENV,
    "VEO_EDGE_TRUSTED_KEY",
    "VEO_EDGE_ALLOW_UNSIGNED",
    "VEO_EDGE_MODEL_CONTROL_MODE",
    "VEO_EDGE_CONTROL_TOKEN_FILE",
)


@dataclass(frozen=True)
class ServiceOptions:
    replicas: int | None = 1  # None: global mode, one task per matching node
    port: int = 8000
    network: str = "host"
    env: dict[str, str] = field(default_factory=dict)
    #: how long a new task must stay up (and healthy) before the updater counts it updated, in updates and
    #: rollbacks alike: a task that fails within it makes the update fail (and roll back)
    monitor_s: float = 15.0
    #: the pause after each replica an update replaces, before it takes down the next one. Swarm's updater
    #: moves on as soon as a new task is running *or has failed*, and only then sees the failure, so with
    #: no pause a release that fails at once can take a second replica down before the rollback starts.
    update_delay_s: float = 5.0
    memory: str | None = None
    cpus: float | None = None
    user: str = DEFAULT_USER
    cap_add: tuple[str, ...] = ()
    privilege_escalation: bool = False
    pids_limit: int = DEFAULT_PIDS_LIMIT
    gpus: str = "1"
    secrets: tuple[Any, ...] = ()  # docker.types.SecretReference
    selinux_type: str | None = None
    #: options (KEEPABLE's names) the command did not give: an update takes them from the running service
    #: (:func:`inherit`) instead of the defaults above; a create uses the defaults
    keep: frozenset[str] = frozenset()

    def check(self) -> None:
        if self.replicas is not None and self.replicas < 1:
            raise UsageError(f"--replicas {self.replicas} must be at least 1 (or use --global)")
        if not 0 < self.port < 65536:
            raise UsageError(f"--port {self.port} is not a TCP port (1..65535)")
        if not 0 < self.monitor_s < math.inf:
            raise UsageError(
                f"--update-monitor {self.monitor_s:g} must be a number of seconds above 0: a new task's "
                "failure must be seen before the update moves on"
            )
        if not 0 <= self.update_delay_s < math.inf:
            raise UsageError(f"--update-delay {self.update_delay_s:g} must be a number of seconds, 0 or more")
        if self.pids_limit < 0:
            raise UsageError(f"--pids-limit {self.pids_limit} must be 0 (no limit) or positive")
        if self.gpus != "all" and "count" not in gpu_request(self.gpus):
            raise UsageError(f"--gpus {self.gpus!r}: a swarm service asks for a count of GPUs, not indices")
        top = self.port + (self.replicas or 1) * (PORT_STRIDE if self.slotted else 1) - 1
        if top > 65535:
            raise UsageError(f"--port {self.port} with {self.replicas} replicas runs past port 65535")
        grpc = self.env.get(GRPC_PORT_ENV)
        if self.slotted and grpc and grpc.isdigit() and (int(grpc) - self.port) % 2 == 0:
            raise UsageError(
                f"--grpc-port {grpc} is an even distance from --port {self.port}: replicas on one node "
                f"listen on interleaved ports (slot s: HTTP {self.port} + 2(s-1), gRPC + 2(s-1)), so "
                f"another slot would take it for HTTP; give an odd distance (e.g. {self.port + 1}) or -1"
            )

        self._check_metrics_port()
        check_low_ports(self.user, self.cap_add, self.port, self.env)

    def _check_metrics_port(self) -> None:
        """A ``-e VEO_EDGE_METRICS_PORT`` moves by 2 a slot as the others do: refused where one slot's
        metrics port is another's (or its own) HTTP or gRPC port, on the layout this deploy makes."""
        first = metrics_port(self.env)  # slot 1's, a TCP port; None: off
        if first is None:
            return
        value = self.env[METRICS_PORT_ENV]
        slots = range(self.replicas or 1) if self.slotted else range(1)
        grpc = self.env.get(GRPC_PORT_ENV, str(self.port + 1 if self.slotted else IMAGE_GRPC_PORT))
        taken = {self.port + PORT_STRIDE * k: "HTTP" for k in slots}
        if grpc.strip().isdigit():
            taken.update({int(grpc) + PORT_STRIDE * k: "gRPC" for k in slots})
        for k in slots:
            metrics = first + PORT_STRIDE * k
            if metrics in taken or metrics > 65535:
                clash = f"the {taken[metrics]} port of a replica" if metrics in taken else "past port 65535"
                layout = (
                    f"slot s: HTTP {self.port} + 2(s-1), gRPC {grpc} + 2(s-1), metrics {value} + 2(s-1), "
                    f"{len(slots)} slot(s)"
                    if self.slotted
                    else f"HTTP {self.port}, gRPC {grpc}"
                )
                raise UsageError(
                    f"-e {METRICS_PORT_ENV}={value}: slot {k + 1} would serve metrics on {metrics}, {clash} "
                    f"({layout}); give a port clear of them, e.g. {max(taken) + 1 if max(taken) + 1 <= 65535 else 1024}"
                    ", or -1"
                )

    @property
    def slotted(self) -> bool:
        """Replicas share the node's network: one port per slot."""
        return self.replicas is not None and self.network == "host"


def inherit(opts: ServiceOptions, spec: dict[str, Any], port_env: str) -> tuple[ServiceOptions, list[str]]:
    """``opts`` with the options it ``keep``s taken from the running service's ``spec``, and what was kept,
    in words (for the report)."""
    container = (spec.get("TaskTemplate") or {}).get("ContainerSpec") or {}
    old = dict(e.split("=", 1) for e in container.get("Env") or [] if "=" in e)
    change: dict[str, Any] = {}
    kept: list[str] = []
    if "replicas" in opts.keep:
        mode = spec.get("Mode") or {}
        if "Global" in mode:
            change["replicas"], said = None, "--global"
        else:
            change["replicas"] = (mode.get("Replicated") or {}).get("Replicas", opts.replicas)
            if not change["replicas"]:  # scaled to 0: no task could prove the release healthy
                raise UsageError(
                    "the running service is scaled to 0 replicas, which a re-deploy keeps when --replicas "
                    "is not given, and no task would prove the release healthy; give --replicas N (or --global)"
                )
            said = f"--replicas {change['replicas']}"
        kept.append(said)
    if "port" in opts.keep and (old.get(port_env) or "").isdigit():
        change["port"] = int(old[port_env])
        kept.append(f"--port {change['port']}")
    env = dict(opts.env)
    grpc = old.get(GRPC_PORT_ENV)
    port = change.get("port", opts.port)
    fits = grpc is not None and (grpc == "-1" or (grpc.isdigit() and (int(grpc) - port) % 2 == 1))
    if "grpc_port" in opts.keep and GRPC_PORT_ENV not in env and fits:
        env[GRPC_PORT_ENV] = grpc  # kept where it fits the interleaved layout, else the default port + 1
        kept.append(f"--grpc-port {grpc}")
    change["env"] = env
    update = spec.get("UpdateConfig") or {}
    for key, field_ in (("monitor_s", "Monitor"), ("update_delay_s", "Delay")):
        if key in opts.keep and field_ in update:
            change[key] = update[field_] / 1e9
            kept.append(f"{KEEPABLE[key]} {change[key]:g}")
    limits = (spec.get("TaskTemplate") or {}).get("Resources", {}).get("Limits") or {}
    if "memory" in opts.keep and limits.get("MemoryBytes"):
        change["memory"] = str(limits["MemoryBytes"])
        kept.append(f"--memory {change['memory']}")
    if "cpus" in opts.keep and limits.get("NanoCPUs"):
        change["cpus"] = limits["NanoCPUs"] / 1e9
        kept.append(f"--cpus {change['cpus']:g}")
    _inherit_privilege(opts, spec, change, kept)
    return dataclasses.replace(opts, **change), kept


def removed_env(spec: dict[str, Any], env: dict[str, str], port_env: str) -> list[str]:
    """The variables the running service's ``spec`` sets that an update to ``env`` removes (not given with
    ``-e``; what the deploy sets itself, :data:`MANAGED_ENV` and the port, is not counted), sorted."""
    container = (spec.get("TaskTemplate") or {}).get("ContainerSpec") or {}
    old = {e.split("=", 1)[0] for e in container.get("Env") or []}
    return sorted(k for k in old if k not in env and k not in MANAGED_ENV and k != port_env)


def _inherit_privilege(opts: ServiceOptions, spec: dict[str, Any], change: dict, kept: list[str]) -> None:
    """The least-privilege options and the control token's secret ``opts`` keeps, into ``change``/``kept``."""
    task = spec.get("TaskTemplate") or {}
    container = task.get("ContainerSpec") or {}
    if "user" in opts.keep and container.get("User") and container["User"] != opts.user:
        change["user"] = container["User"]
        kept.append(f"--user {change['user']}")
    if "cap_add" in opts.keep and container.get("CapabilityAdd"):
        change["cap_add"] = tuple(container["CapabilityAdd"])
        kept.append(f"--cap-add {','.join(change['cap_add'])}")
    labels = spec.get("Labels") or {}
    if "privilege_escalation" in opts.keep and labels.get(LABEL_ESCALATION) == "allowed":
        change["privilege_escalation"] = True
        kept.append("--allow-privilege-escalation")
    limits = (task.get("Resources") or {}).get("Limits") or {}
    pids = int(limits.get("Pids") or 0)  # none in the spec: the service runs without one (--pids-limit 0)
    if "pids_limit" in opts.keep and pids != opts.pids_limit:
        change["pids_limit"] = pids
        kept.append(f"--pids-limit {pids}")
    wanted = ((task.get("Resources") or {}).get("Reservations") or {}).get("GenericResources") or []
    gpus = [g["DiscreteResourceSpec"]["Value"] for g in wanted if "DiscreteResourceSpec" in g]
    if "gpus" in opts.keep and gpus and str(gpus[0]) != opts.gpus:
        change["gpus"] = str(gpus[0])
        kept.append(f"--gpus {change['gpus']}")
    selinux = ((container.get("Privileges") or {}).get("SELinuxContext") or {}).get("Type")
    if "selinux_type" in opts.keep and selinux:
        change["selinux_type"] = selinux
        kept.append(f"--selinux-type {selinux}")
    secrets = [s for s in container.get("Secrets") or [] if (s.get("File") or {}).get("Name") == CONTROL_FILE]
    old = dict(e.split("=", 1) for e in container.get("Env") or [] if "=" in e)
    if "control_token" in opts.keep and secrets and all(k in old for k in CONTROL_ENV):
        # the same secret (by ID: secrets are immutable) and the environment that points the server at it
        change["secrets"] = (*opts.secrets, *secrets)
        change["env"] = {**change.get("env", opts.env), **{k: old[k] for k in CONTROL_ENV}}
        kept.append(f"--control-token-file (secret {secrets[0]['SecretName']})")


def constraint(target: str) -> str:
    return f"node.labels.{NODE_LABEL}=={target}"


def _env(facts: ImageFacts, opts: ServiceOptions) -> list[str]:
    env = {facts.port_env: str(opts.port)}
    if opts.slotted:  # the interleaved layout (module docstring), the same for any replica count
        env[SLOT_ENV] = "{{.Task.Slot}}"
        env[GRPC_PORT_ENV] = str(opts.port + 1)
    env.update(opts.env)
    return [f"{k}={v}" for k, v in env.items()]


def service_spec(facts: ImageFacts, name: str, opts: ServiceOptions, image: str) -> dict[str, Any]:
    """The ``client.services.create`` / ``Service.update`` arguments of a release on ``image``."""
    import docker.types as t

    gpu = gpu_run(facts.target)
    gpus = gpu_request(opts.gpus).get("count", 1) if gpu.device_requests else 0
    resources = t.Resources(
        mem_limit=memory_bytes(opts.memory) if opts.memory else None,
        cpu_limit=int(opts.cpus * 1e9) if opts.cpus else None,
        generic_resources={"NVIDIA-GPU": gpus} if gpus > 0 else None,
    )
    if opts.pids_limit:
        resources.setdefault("Limits", {})["Pids"] = opts.pids_limit
    privileges = t.Privileges(selinux_type=opts.selinux_type)
    if not opts.privilege_escalation:
        privileges["NoNewPrivileges"] = True
    mode = t.ServiceMode("global") if opts.replicas is None else t.ServiceMode("replicated", opts.replicas)
    return {
        "image": image,
        "env": _env(facts, opts),
        "constraints": [constraint(facts.target)],
        "mode": mode,
        "networks": [opts.network] if opts.network else None,
        "update_config": t.UpdateConfig(
            parallelism=1,
            order="stop-first",
            failure_action="rollback",
            monitor=int(opts.monitor_s * 1e9),
            delay=int(opts.update_delay_s * 1e9),
        ),
        "rollback_config": t.RollbackConfig(
            parallelism=1, order="stop-first", monitor=int(opts.monitor_s * 1e9)
        ),
        "restart_policy": t.RestartPolicy(condition="any", delay=int(1e9)),
        "stop_grace_period": STOP_GRACE_NS,
        "dns_config": t.DNSConfig(),
        "read_only": True,
        "user": opts.user,
        "cap_drop": ["ALL"],
        # [] and not None: an engine keeps the running service's CapabilityAdd when an update leaves it out
        "cap_add": list(opts.cap_add),
        "privileges": privileges or None,
        "secrets": list(opts.secrets) or None,
        "mounts": [
            t.Mount(target="/tmp", source=None, type="tmpfs", tmpfs_size=TMPFS_BYTES),
            t.Mount(target=facts.cache_dir, source=f"veo-edge-cache-{name}", type="volume"),
        ],
        "resources": resources,
        "labels": {
            "io.veo-edge.deploy.image": facts.ref,
            "io.veo-edge.target": facts.target,
            **({LABEL_ESCALATION: "allowed"} if opts.privilege_escalation else {}),
        },
    }
