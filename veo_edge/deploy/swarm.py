"""A fleet on Docker Swarm: one service per model and device class, placed by a node label.

The service's tasks run only on nodes labelled ``veo.target=<target>`` (``docker node update
--label-add veo.target=orin NODE``). Updates replace one task at a time, stop-first (host networking:
the new task binds the port the old one held), wait for the image's HEALTHCHECK, and the swarm itself
rolls the service back when an updated task fails (``failure_action=rollback``). The deploy watches the
tasks and the update status and reports what the swarm did; tasks that no node can take are reported as
pending with the scheduler's reason, never as success.

Several replicas on one node share its network (host networking): slot s listens on the base port +
2(s - 1) and gRPC one above (``VEO_EDGE_REPLICA_SLOT={{.Task.Slot}}``, read by the entrypoint and the
healthcheck), so replicas never fight over a port, whatever their count (:mod:`.swarmspec`). The service
names the image by its verified ID, or ``repo@sha256:...`` when it went through a registry: no node
re-resolves a tag.

A deploy that is not healthy within its timeout, or is interrupted (Ctrl-C, SIGTERM, SIGHUP), does not
leave the swarm rolling the new release forward: it asks the swarm to roll an updated service back (the
same request as ``deploy rollback --swarm``), or removes a service it created, waits a bounded time, and
says where the service stands (:mod:`.swarmundo`).

Rollback is the Engine API's own (what ``docker service rollback`` sends): ``POST
/services/{id}/update?version=N&rollback=previous``. The SDK (docker 7.2.0) has no method for it
(``update_service`` sends ``version`` only; docker-py's PR #2314 was closed unmerged), and updating to the
``PreviousSpec`` is not the same operation (it runs as an update under UpdateConfig, not RollbackConfig).
So :func:`rollback_service` sends it through the SDK's public surface: ``APIClient`` is a
``requests.Session`` bound to the engine (``base_url``, ``api_version``), its ``post`` is public, and
``docker.errors.create_api_error_from_http_exception`` turns a refusal into the SDK's ``APIError``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from veo_edge.deploy.device import check_name
from veo_edge.deploy.profiles import NODE_LABEL, ImageFacts
from veo_edge.deploy.swarmspec import ServiceOptions, constraint, inherit, removed_env, service_spec
from veo_edge.errors import (
    DeployError,
    DeployInterruptedError,
    DeployPendingError,
    UnhealthyReleaseError,
    UsageError,
)

#: the scheduler needs a moment to say "no suitable node"; pending longer than this is reported
PENDING_GRACE_S = 5.0

#: the longest a deploy waits for the rollback it asked for (after a timeout: at least this, else --timeout)
UNDO_WAIT_S = 60.0

#: progress callback: (one-line summary of the tasks, seconds waited)
SwarmProgress = Callable[[str, float], None]


@dataclass
class ServiceResult:
    name: str
    image: str
    action: str  # "created" | "updated"
    tasks: list[dict[str, Any]]
    waited_s: float
    bound: str = ""  # what the service runs: the image ID or repo@sha256:...
    kept: list[str] = field(default_factory=list)  # options taken from the running service, in words
    removed_env: list[str] = field(default_factory=list)  # variables the update took out of the service

    def to_dict(self) -> dict[str, Any]:
        return {
            "service": self.name,
            "image": self.image,
            "action": self.action,
            "tasks": self.tasks,
            "healthy_after_s": round(self.waited_s, 2),
            "bound_to": self.bound,
            "kept": self.kept,
            "removed_env": self.removed_env,
        }


class TimedOut(Exception):
    """The service was not healthy within the deploy's timeout (what :func:`deploy_service` undoes)."""


def check_manager(client: Any) -> None:
    """Refuse an engine that is not an active swarm manager (before anything is moved onto it)."""
    info = client.info()
    swarm = info.get("Swarm") or {}
    if swarm.get("LocalNodeState") != "active" or not swarm.get("ControlAvailable"):
        raise DeployError(
            "that engine is not a swarm manager (docker swarm init, or point --to at a manager node)"
        )


def _tasks(service: Any) -> list[dict[str, Any]]:
    out = []
    for task in service.tasks():
        status = task.get("Status") or {}
        spec = (task.get("Spec") or {}).get("ContainerSpec") or {}
        out.append(
            {
                "id": task["ID"][:12],
                "slot": task.get("Slot"),
                "image": spec.get("Image") or "",
                "desired": task.get("DesiredState"),
                "state": status.get("State"),
                "error": status.get("Err"),
                "message": status.get("Message"),
                **_task_health(service.client, status),
            }
        )
    return out


def _task_health(client: Any, status: dict[str, Any]) -> dict[str, str | None]:
    """The health of the task's container (kept after it stopped) and its last healthcheck output."""
    from docker.errors import NotFound

    cid = ((status.get("ContainerStatus") or {}).get("ContainerID")) or None
    try:
        c = client.containers.get(cid) if cid else None
    except NotFound:
        c = None
    health = ((c.attrs.get("State") or {}).get("Health") or {}) if c is not None else {}
    last = (health.get("Log") or [{}])[-1].get("Output") or ""
    return {
        "health": health.get("Status"),
        "health_output": last.strip().splitlines()[-1] if last.strip() else None,
    }


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
    image: str | None = None,
) -> ServiceResult:
    """Create or update the service ``name`` on ``image`` (default: the image's ID; a ``repo@sha256:``
    reference when it went through a registry) and wait until every wanted task is running and healthy."""
    from docker.errors import APIError, NotFound

    from veo_edge.deploy.swarmundo import undo

    check_name(name)
    opts.check()
    if not timeout > 0:
        raise UsageError(f"--timeout {timeout:g} must be a number of seconds above 0")
    check_manager(client)
    if not facts.has_healthcheck:  # exit 44 (deploy failed), as on one device
        raise DeployError(
            f"image {facts.ref} has no HEALTHCHECK, so the swarm cannot gate its rollout on health"
        )
    bound = image or facts.image_id
    try:
        service = client.services.get(name)
    except NotFound:
        service = None
    kept: list[str] = []
    removed: list[str] = []
    if service is not None:
        if opts.keep:
            opts, kept = inherit(opts, service.attrs.get("Spec") or {}, facts.port_env)
            opts.check()
        removed = removed_env(service.attrs.get("Spec") or {}, opts.env, facts.port_env)
    spec = service_spec(facts, name, opts, bound)
    action = "created" if service is None else "updated"
    version = service.version if service is not None else None
    try:
        try:
            if service is None:
                service = client.services.create(name=name, **spec)
            else:
                service.update(name=name, **spec)
        except APIError as e:
            raise DeployError(f"the swarm refused service {name}: {e.explanation or e}") from e
        result = _wait(client, service, facts, bound, opts, action, timeout, progress)
    except (TimedOut, KeyboardInterrupt) as e:
        interrupted = isinstance(e, KeyboardInterrupt)
        # a bounded wait: the rollback takes a monitor window per task, which a short --timeout may not
        # cover; an interrupted deploy (a service manager's stop timeout) waits at most the minute
        wait_s = UNDO_WAIT_S if interrupted else max(timeout, UNDO_WAIT_S)
        state, again = undo(client, name, version, wait_s, progress)
        if interrupted or again:  # an interrupt during the undo of a timed-out deploy is one too (130)
            why = (str(e) or "SIGINT, Ctrl-C") if interrupted else "Ctrl-C"
            raise DeployInterruptedError(
                f"interrupted ({why}) while deploying {facts.ref} as service {name}"
                + ("" if interrupted else f" ({e})")
                + f"; {state}"
            ) from e
        raise UnhealthyReleaseError(f"{e}; {state}") from e
    result.kept, result.removed_env = kept, removed
    return result


def _wanted(client: Any, opts: ServiceOptions, target: str) -> int:
    if opts.replicas is not None:
        return opts.replicas
    nodes = client.nodes.list(filters={"node.label": f"{NODE_LABEL}={target}"})
    return len([n for n in nodes if (n.attrs.get("Status") or {}).get("State") == "ready"])


def _wait(
    client: Any,
    service: Any,
    facts: ImageFacts,
    bound: str,
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
                back = _healthy_after_rollback(service, wanted, start + timeout)
                raise UnhealthyReleaseError(
                    f"the swarm rolled service {service.name} back from {facts.ref}: {update.get('Message')}; "
                    f"{back}; tasks: {_failures(_tasks(service), bound) or 'none of its tasks failed'}"
                )
        elif ustate == "paused":
            raise UnhealthyReleaseError(
                f"the update of {service.name} to {facts.ref} paused: {update.get('Message')}; tasks: "
                f"{_failures(tasks, bound)}"
            )
        current = [t for t in tasks if t["desired"] == "running"]
        pending = [t for t in current if t["state"] == "pending"]
        if pending and waited >= PENDING_GRACE_S:
            reason = pending[0]["error"] or pending[0]["message"] or "the scheduler gave no reason"
            raise DeployPendingError(
                f"service {service.name} is pending: {reason} (constraint {constraint(facts.target)}; "
                f"label a node: docker node update --label-add {NODE_LABEL}={facts.target} NODE)"
            )
        good = _healthy(tasks, bound)
        updating = ustate == "updating"
        if len(good) >= wanted and not updating:
            return ServiceResult(service.name, facts.ref, action, tasks, waited, bound)
        if waited >= timeout:
            raise TimedOut(
                f"service {service.name} was not healthy within {timeout:g} s ({len(good)}/{wanted} tasks "
                f"healthy on {facts.ref}); tasks: {_failures(tasks, bound) or _summary(tasks)}"
            )
        time.sleep(0.5)


def _healthy_after_rollback(service: Any, wanted: int, deadline: float) -> str:
    """Wait (until ``deadline``) for the rolled-back release to be healthy on every wanted task, so that a
    deploy that says "rolled back" returns with the previous release serving; says how it ended."""
    while True:
        service.reload()
        image = service.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]["Image"]
        good = _healthy(_tasks(service), image)
        if len(good) >= wanted:
            return f"the previous release is healthy on {len(good)}/{wanted} tasks"
        if time.monotonic() >= deadline:
            return f"only {len(good)}/{wanted} tasks of the previous release are healthy so far"
        time.sleep(0.5)


def _healthy(tasks: list[dict[str, Any]], image: str) -> list[dict[str, Any]]:
    """The tasks of ``image`` meant to run that are running and healthy."""
    return [
        t
        for t in tasks
        if t["desired"] == "running"
        and t["state"] == "running"
        and t["health"] == "healthy"
        and t["image"] == image
    ]


def _failures(tasks: list[dict[str, Any]], image: str | None = None) -> str:
    """The tasks that failed or were refused, and those of ``image`` shut down unhealthy (what a health
    rollback leaves: their state is shutdown or complete, their container's health unhealthy), each with
    the swarm's error or the last healthcheck output."""
    bad = [
        t
        for t in tasks
        if t["state"] in ("failed", "rejected")
        or t["error"]
        or (image is not None and t["image"] == image and t["health"] == "unhealthy")
    ]
    return "; ".join(
        f"{t['id']} {t['state']}{'/' + t['health'] if t['health'] else ''}: "
        f"{t['error'] or t['health_output'] or t['message']}"
        for t in bad[:4]
    )


def service_status(client: Any, name: str) -> dict[str, Any]:
    from docker.errors import NotFound

    check_manager(client)
    try:
        service = client.services.get(name)
    except NotFound as e:
        raise DeployError(f"no swarm service named {name} on that engine") from e
    spec = service.attrs.get("Spec") or {}
    return {
        "service": name,
        "image": (spec.get("Labels") or {}).get("io.veo-edge.deploy.image"),
        "bound_to": ((spec.get("TaskTemplate") or {}).get("ContainerSpec") or {}).get("Image"),
        "update_status": service.attrs.get("UpdateStatus"),
        "tasks": _tasks(service),
    }


def request_rollback(client: Any, service: Any) -> None:
    """Ask the swarm to roll ``service`` back to its previous spec (the Engine API's ``rollback=previous``,
    module docstring); returns once the swarm accepted it."""
    import requests
    from docker.errors import APIError, create_api_error_from_http_exception

    api = client.api
    try:
        # the Engine API's rollback (module docstring), through the SDK's public requests.Session
        response = api.post(
            f"{api.base_url}/v{api.api_version}/services/{service.id}/update",
            params={"version": service.version, "rollback": "previous"},
            json=service.attrs["Spec"],
        )
        try:
            response.raise_for_status()
        except requests.exceptions.HTTPError as e:
            create_api_error_from_http_exception(e)  # raises the SDK's APIError
    except APIError as e:
        raise DeployError(f"the swarm refused to roll back {service.name}: {e.explanation or e}") from e


def rollback_service(client: Any, name: str, timeout: float, progress: SwarmProgress | None = None) -> dict:
    """Ask the swarm to roll the service back to its previous spec and wait for it to settle."""
    from docker.errors import NotFound

    check_manager(client)
    try:
        service = client.services.get(name)
    except NotFound as e:
        raise DeployError(f"no swarm service named {name} on that engine") from e
    if not service.attrs.get("PreviousSpec"):
        raise DeployError(f"service {name} has no previous spec to roll back to (it was never updated)")
    request_rollback(client, service)
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
