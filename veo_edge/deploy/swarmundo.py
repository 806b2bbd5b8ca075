"""Undo a swarm deploy that was not healthy in time or was interrupted, and say where the service stands.

Without this the swarm carries on with the update after the deploy gave up (its own rollback acts only
on a task that fails within the monitor window), so a deploy that exits "rolled back" (46) or
"interrupted" (130) would leave the new release rolling forward. An updated service is rolled back with
the swarm's own rollback (:func:`.swarm.request_rollback`, what ``deploy rollback --swarm`` sends), unless
the swarm is rolling it back already; a service this deploy created has no previous release, so it is
removed (its engine-cache volume stays, as with ``deploy remove``). Then the deploy waits, at most
``wait_s``, for the rollback to complete with the previous release healthy on every wanted task; the
text it returns says what happened, including a rollback still under way when the wait ran out.
"""

from __future__ import annotations

import time
from typing import Any

from veo_edge.errors import DeployError


def undo(client: Any, name: str, version: Any, wait_s: float, progress: Any = None) -> tuple[str, bool]:
    """Roll the service ``name`` back (or remove it, when ``version`` is None: this deploy created it)
    and wait up to ``wait_s`` for it to settle; ``version``: the service's version before the update.
    (where the service stands, in words; whether an interrupt landed while the swarm was being asked:
    the words then come from one look at the service)."""
    try:
        return _undo(client, name, version, wait_s, progress), False
    except KeyboardInterrupt:
        return _where(client, name), True


def _where(client: Any, name: str) -> str:
    """Where service ``name`` stands after an interrupt that landed while the swarm was asked to undo the
    deploy: whether the swarm took the request is unknown, so one look at the service says."""
    from veo_edge.deploy.swarm import _summary, _tasks

    said = f"interrupted while asking the swarm to undo the deploy of service {name}"
    todo = (
        f"`veo-edge deploy status {name} --swarm` shows how it goes on, `veo-edge deploy rollback {name} "
        "--swarm` asks for the rollback again"
    )
    try:
        service = client.services.get(name)
        spec = service.attrs.get("Spec") or {}
        state = (service.attrs.get("UpdateStatus") or {}).get("State") or "no update status"
        release = (spec.get("Labels") or {}).get("io.veo-edge.deploy.image") or "?"
        return f"{said}; it stands at {state}, on {release} ({_summary(_tasks(service))}); {todo}"
    except KeyboardInterrupt:
        return f"{said}, and again while looking where it stands; {todo}"
    except Exception as e:  # any failure of the one look (gone, engine down): said, not raised past the line
        return f"{said}; where it stands could not be read ({type(e).__name__}: {e}); {todo}"


def _undo(client: Any, name: str, version: Any, wait_s: float, progress: Any) -> str:
    from docker.errors import APIError, NotFound

    from veo_edge.deploy.swarm import request_rollback

    try:
        service = client.services.get(name)
    except NotFound:
        return f"service {name} does not exist (the swarm never created it)"
    if version is None:
        try:
            service.remove()
        except APIError as e:
            return (
                f"service {name}, which this deploy created, is left as it is: the swarm refused to remove "
                f"it ({e.explanation or e}); `veo-edge deploy remove {name} --swarm` takes it off"
            )
        return (
            f"removed service {name}, which this deploy created (there is no previous release to go back "
            f"to; its engine-cache volume veo-edge-cache-{name} is kept)"
        )
    if service.version == version:
        return f"service {name} was not changed"
    state = (service.attrs.get("UpdateStatus") or {}).get("State") or ""
    if state.startswith("rollback"):
        asked = "the swarm is rolling it back already"
    else:
        try:
            request_rollback(client, service)
        except DeployError as e:
            return f"{e}: service {name} stays on the new release ({state or 'no update status'})"
        asked = "asked the swarm to roll it back to the previous release"
    return f"{asked}; {_settle(service, wait_s, progress)}"


def _settle(service: Any, wait_s: float, progress: Any) -> str:
    """Wait (at most ``wait_s``) for the rollback to complete with every wanted task healthy; how it ended."""
    from veo_edge.deploy.swarm import _healthy, _summary, _tasks

    start = time.monotonic()
    later = f"`veo-edge deploy status {service.name} --swarm` shows how it goes on"
    try:
        while True:
            service.reload()
            spec = service.attrs.get("Spec") or {}
            update = service.attrs.get("UpdateStatus") or {}
            state = update.get("State") or "no update status"
            image = spec["TaskTemplate"]["ContainerSpec"]["Image"]
            release = (spec.get("Labels") or {}).get("io.veo-edge.deploy.image") or image
            tasks = _tasks(service)
            replicated = (spec.get("Mode") or {}).get("Replicated")
            wanted = (
                replicated.get("Replicas", 1)
                if replicated
                else len([t for t in tasks if t["desired"] == "running"])
            )
            good = len(_healthy(tasks, image))
            waited = time.monotonic() - start
            if progress is not None:
                progress(f"rolling back: {state}: {_summary(tasks)}", waited)
            if state == "rollback_completed" and good >= wanted:
                return f"rolled back: the previous release {release} is healthy on {good}/{wanted} tasks"
            if state == "rollback_paused":
                return (
                    f"the swarm's rollback paused ({update.get('Message')}); {good}/{wanted} tasks of the "
                    f"previous release {release} are healthy; {later}"
                )
            if waited >= wait_s:
                return (
                    f"the rollback is still under way after {wait_s:g} s ({state}; {good}/{wanted} tasks of "
                    f"the previous release {release} healthy so far); the swarm carries on, {later}"
                )
            time.sleep(0.5)
    except KeyboardInterrupt:
        return f"interrupted again while waiting for the rollback, which the swarm carries on; {later}"
