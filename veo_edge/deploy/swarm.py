"""A fleet on Docker Swarm: one service per model and device class, placed by a node label.

The service's tasks run only on nodes labelled ``veo.target=<target>`` (``docker node update
--label-add veo.target=orin NODE``). Updates replace one task at a time, stop-first (host networking:
the new task binds the port the old one held), wait for the image's HEALTHCHECK, and the swarm itself
rolls the service back when an updated task fails (``failure_action=rollback``). The deploy watches the
tasks and the update status and reports what the swarm did; tasks that no node can take are reported as
pending with the scheduler's reason, never as success.

Rollback uses a private hook of the Docker SDK. The Engine API rolls a service back with
``POST /services/{id}/update?version=N&rollback=previous`` (what ``docker service rollback`` sends), and the
SDK (docker 7.2.0, the version tested) has no public call for it: ``APIClient.update_service`` always sends
``params={'version': version}`` only, ``rollback_config`` is the RollbackConfig *policy* (how a rollback
proceeds), not a request to roll back, and ``Service.update`` goes through ``update_service``. Updating
the service to its ``PreviousSpec`` with the public ``update_service`` is not the same operation: the
swarm runs it as an update (UpdateConfig, states ``updating``/``completed``, not RollbackConfig and
``rollback_*``), and it makes the failed spec the new PreviousSpec. docker-py's PR #2314 (a rollback
method) was closed unmerged. So :func:`rollback_service` calls ``APIClient._url``, ``_post_json`` and
``_raise_for_status``, the SDK's own request helpers, as ``update_service`` does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from veo_edge.deploy.device import check_name
from veo_edge.deploy.profiles import NODE_LABEL, ImageFacts, gpu_run, memory_bytes
from veo_edge.errors import DeployError, DeployPendingError, UnhealthyReleaseError, UsageError

#: the scheduler needs a moment to say "no suitable node"; pending longer than this is reported
PENDING_GRACE_S = 5.0

#: progress callback: (one-line summary of the tasks, seconds waited)
SwarmProgress = Callable[[str, float], None]


@dataclass(frozen=True)
class ServiceOptions:
    replicas: int | None = 1  # None: global mode, one task per matching node
    port: int = 8000
    network: str = "host"
    env: dict[str, str] = field(default_factory=dict)
    monitor_s: float = 15.0
    memory: str | None = None
    cpus: float | None = None

    def check(self) -> None:
        if self.replicas is not None and self.replicas < 1:
            raise UsageError(f"--replicas {self.replicas} must be at least 1 (or use --global)")
        if not 0 < self.port < 65536:
            raise UsageError(f"--port {self.port} is not a TCP port (1..65535)")


@dataclass
class ServiceResult:
    name: str
    image: str
    action: str  # "created" | "updated"
    tasks: list[dict[str, Any]]
    waited_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "service": self.name,
            "image": self.image,
            "action": self.action,
            "tasks": self.tasks,
            "healthy_after_s": round(self.waited_s, 2),
        }


def _manager(client: Any) -> None:
    info = client.info()
    swarm = info.get("Swarm") or {}
    if swarm.get("LocalNodeState") != "active" or not swarm.get("ControlAvailable"):
        raise DeployError(
            "that engine is not a swarm manager (docker swarm init, or point --to at a manager node)"
        )


def constraint(target: str) -> str:
    return f"node.labels.{NODE_LABEL}=={target}"


def _spec(facts: ImageFacts, name: str, opts: ServiceOptions) -> dict[str, Any]:
    import docker.types as t

    gpu = gpu_run(facts.target)
    resources = None
    if opts.memory or opts.cpus or gpu.device_requests:
        resources = t.Resources(
            mem_limit=memory_bytes(opts.memory) if opts.memory else None,
            cpu_limit=int(opts.cpus * 1e9) if opts.cpus else None,
            generic_resources={"NVIDIA-GPU": 1} if gpu.device_requests else None,
        )
    mode = t.ServiceMode("global") if opts.replicas is None else t.ServiceMode("replicated", opts.replicas)
    return {
        "image": facts.ref,
        "env": [f"{k}={v}" for k, v in {facts.port_env: str(opts.port), **opts.env}.items()],
        "constraints": [constraint(facts.target)],
        "mode": mode,
        "networks": [opts.network] if opts.network else None,
        "update_config": t.UpdateConfig(
            parallelism=1, order="stop-first", failure_action="rollback", monitor=int(opts.monitor_s * 1e9)
        ),
        "rollback_config": t.RollbackConfig(
            parallelism=1, order="stop-first", monitor=int(opts.monitor_s * 1e9)
        ),
        "restart_policy": t.RestartPolicy(condition="any", delay=int(1e9)),
        "read_only": True,
        "mounts": [
            t.Mount(target="/tmp", source=None, type="tmpfs"),
            t.Mount(target=facts.cache_dir, source=f"veo-edge-cache-{name}", type="volume"),
        ],
        "resources": resources,
        "labels": {"io.veo-edge.deploy.image": facts.ref, "io.veo-edge.target": facts.target},
    }


def _tasks(service: Any) -> list[dict[str, Any]]:
    out = []
    for task in service.tasks():
        status = task.get("Status") or {}
        spec = (task.get("Spec") or {}).get("ContainerSpec") or {}
        out.append(
            {
                "id": task["ID"][:12],
                "slot": task.get("Slot"),
                "image": (spec.get("Image") or "").split("@")[0],
                "desired": task.get("DesiredState"),
                "state": status.get("State"),
                "error": status.get("Err"),
                "message": status.get("Message"),
                "health": _task_health(service.client, status),
            }
        )
    return out


def _task_health(client: Any, status: dict[str, Any]) -> str | None:
    cid = ((status.get("ContainerStatus") or {}).get("ContainerID")) or None
    if not cid:
        return None
    from docker.errors import NotFound

    try:
        c = client.containers.get(cid)
    except NotFound:
        return None
    return ((c.attrs.get("State") or {}).get("Health") or {}).get("Status")


def _summary(tasks: list[dict[str, Any]]) -> str:
    live = [t for t in tasks if t["desired"] == "running"]
    parts = [f"{t['state']}{'/' + t['health'] if t['health'] else ''}" for t in live]
    return ", ".join(parts) or "no tasks yet"


def deploy_service(
    client: Any,
    facts: ImageFacts,
    name: str,
    opts: ServiceOptions,
    timeout: float,
    progress: SwarmProgress | None = None,
) -> ServiceResult:
    """Create or update the service ``name`` and wait until every wanted task is running and healthy."""
    from docker.errors import APIError, NotFound

    check_name(name)
    opts.check()
    _manager(client)
    if not facts.has_healthcheck:
        raise UsageError(
            f"image {facts.ref} has no HEALTHCHECK, so the swarm cannot gate its rollout on health"
        )
    spec = _spec(facts, name, opts)
    try:
        service = client.services.get(name)
    except NotFound:
        service = None
    try:
        if service is None:
            service = client.services.create(name=name, **spec)
            action = "created"
        else:
            service.update(name=name, **spec)
            action = "updated"
    except APIError as e:
        raise DeployError(f"the swarm refused service {name}: {e.explanation or e}") from e
    return _wait(client, service, facts, opts, action, timeout, progress)


def _wanted(client: Any, opts: ServiceOptions, target: str) -> int:
    if opts.replicas is not None:
        return opts.replicas
    nodes = client.nodes.list(filters={"node.label": f"{NODE_LABEL}={target}"})
    return len([n for n in nodes if (n.attrs.get("Status") or {}).get("State") == "ready"])


def _wait(
    client: Any,
    service: Any,
    facts: ImageFacts,
    opts: ServiceOptions,
    action: str,
    timeout: float,
    progress: SwarmProgress | None,
) -> ServiceResult:
    start = time.monotonic()
    wanted = _wanted(client, opts, facts.target)
    if wanted == 0:
        raise DeployPendingError(
            f"service {service.name} is pending: no ready node is labelled {NODE_LABEL}={facts.target} "
            f"(docker node update --label-add {NODE_LABEL}={facts.target} NODE)"
        )
    while True:
        service.reload()
        tasks = _tasks(service)
        waited = time.monotonic() - start
        if progress is not None:
            progress(_summary(tasks), waited)
        update = service.attrs.get("UpdateStatus") or {}
        ustate = update.get("State")
        if ustate in ("rollback_completed", "rollback_paused", "rollback_started"):
            if ustate != "rollback_started" or waited >= timeout:
                raise UnhealthyReleaseError(
                    f"the swarm rolled service {service.name} back from {facts.ref}: {update.get('Message')}; "
                    f"tasks: {_failures(tasks)}"
                )
        elif ustate == "paused":
            raise UnhealthyReleaseError(
                f"the update of {service.name} to {facts.ref} paused: {update.get('Message')}; tasks: {_failures(tasks)}"
            )
        current = [t for t in tasks if t["desired"] == "running"]
        pending = [t for t in current if t["state"] == "pending"]
        if pending and waited >= PENDING_GRACE_S:
            reason = pending[0]["error"] or pending[0]["message"] or "the scheduler gave no reason"
            raise DeployPendingError(
                f"service {service.name} is pending: {reason} (constraint {constraint(facts.target)}; "
                f"label a node: docker node update --label-add {NODE_LABEL}={facts.target} NODE)"
            )
        good = [
            t
            for t in current
            if t["state"] == "running" and t["health"] == "healthy" and t["image"] == facts.ref
        ]
        updating = ustate == "updating"
        if len(good) >= wanted and not updating:
            return ServiceResult(service.name, facts.ref, action, tasks, waited)
        if waited >= timeout:
            raise UnhealthyReleaseError(
                f"service {service.name} was not healthy within {timeout:g} s ({len(good)}/{wanted} tasks "
                f"healthy on {facts.ref}); tasks: {_failures(tasks) or _summary(tasks)}"
            )
        time.sleep(0.5)


def _failures(tasks: list[dict[str, Any]]) -> str:
    bad = [t for t in tasks if t["state"] in ("failed", "rejected") or t["error"]]
    return "; ".join(f"{t['id']} {t['state']}: {t['error'] or t['message']}" for t in bad[:4])


def service_status(client: Any, name: str) -> dict[str, Any]:
    from docker.errors import NotFound

    _manager(client)
    try:
        service = client.services.get(name)
    except NotFound as e:
        raise DeployError(f"no swarm service named {name} on that engine") from e
    spec = service.attrs.get("Spec") or {}
    return {
        "service": name,
        "image": (((spec.get("TaskTemplate") or {}).get("ContainerSpec") or {}).get("Image") or "").split(
            "@"
        )[0],
        "update_status": service.attrs.get("UpdateStatus"),
        "tasks": _tasks(service),
    }


def rollback_service(client: Any, name: str, timeout: float, progress: SwarmProgress | None = None) -> dict:
    """Ask the swarm to roll the service back to its previous spec and wait for it to settle."""
    from docker.errors import APIError, NotFound

    _manager(client)
    try:
        service = client.services.get(name)
    except NotFound as e:
        raise DeployError(f"no swarm service named {name} on that engine") from e
    if not service.attrs.get("PreviousSpec"):
        raise DeployError(f"service {name} has no previous spec to roll back to (it was never updated)")
    api = client.api
    try:
        # the Engine API's own rollback (what `docker service rollback` calls): update with rollback=previous;
        # the SDK has no public call for it (module docstring)
        url = api._url("/services/{0}/update", service.id)
        params = {"version": service.version, "rollback": "previous"}
        api._raise_for_status(api._post_json(url, data=service.attrs["Spec"], params=params))
    except APIError as e:
        raise DeployError(f"the swarm refused to roll back {name}: {e.explanation or e}") from e
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        service.reload()
        state = (service.attrs.get("UpdateStatus") or {}).get("State")
        if progress is not None:
            progress(f"{state}: {_summary(_tasks(service))}", time.monotonic() - start)
        if state in ("rollback_completed", "rollback_paused"):
            break
        time.sleep(0.5)
    return service_status(client, name)
