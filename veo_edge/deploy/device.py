"""One device: run a release as a container, prove it healthy, and always leave a good release running.

The release runs as the container ``NAME``. A deploy first renames the running release ``NAME-outgoing``
and stops it (kept, not removed), then starts the new release as ``NAME`` and waits for Docker's health
status (the image's HEALTHCHECK). Healthy: the outgoing release becomes ``NAME-previous`` (one generation
is kept, for ``veo-edge deploy rollback NAME``). Anything else — unhealthy, exited, not healthy in time,
an engine error, Ctrl-C, SIGTERM or a dropped session while waiting — removes the new release and
restores the outgoing one under ``NAME``, waiting until it is healthy again. A restore whose restart
fails leaves the previous container in place, under ``NAME``, and says so.

The names are the journal: renames are atomic on the engine, so a deploy killed outright (SIGKILL, a
lost connection) leaves ``NAME-outgoing`` (or, for a rollback, ``NAME-rollback``) behind, and the next
``deploy``, ``deploy status`` or ``deploy rollback`` of ``NAME`` finishes it (:func:`recover`): it keeps
the new release if it is healthy, else puts the outgoing one back. The new release's container records
which container it replaces (label ``io.veo-edge.deploy.replaces``).

Releases on one device use host networking by default (the stop-first order is what lets the new
release bind the same port).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from veo_edge.deploy.health import HealthOutcome, HealthProgress, health, wait_healthy
from veo_edge.deploy.profiles import ImageFacts
from veo_edge.deploy.runopts import LABEL_IMAGE, RunOptions, container_kwargs
from veo_edge.errors import (
    DeployError,
    DeployInterruptedError,
    RollbackFailedError,
    UnhealthyReleaseError,
    UsageError,
)

PREVIOUS_SUFFIX = "-previous"
OUTGOING_SUFFIX = "-outgoing"  # the running release while its successor proves itself
PARKED_SUFFIX = "-rollback"  # the current release while a rollback proves the previous one
#: step callback: a deploy or rollback calls it after each journal step (its name), for progress and tests
StepHook = Callable[[str], None]

__all__ = ["RunOptions", "deploy_container", "recover", "rollback", "status", "wait_healthy"]


@dataclass
class DeployResult:
    name: str
    image: str
    image_id: str
    container_id: str
    previous_image: str | None
    waited_s: float
    transfer: dict[str, Any] | None = None
    recovered: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "image": self.image,
            "image_id": self.image_id,
            "container_id": self.container_id,
            "previous_image": self.previous_image,
            "healthy_after_s": round(self.waited_s, 2),
            "transfer": self.transfer,
            "recovered": self.recovered,
        }


def check_name(name: str) -> str:
    import re

    if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,100}", name):
        raise UsageError(
            f"--name {name!r} is not a container name: letters, digits, '_', '.', '-', starting with a "
            "letter or digit"
        )
    return name


def signal_name(e: BaseException) -> str:
    """The signal a KeyboardInterrupt stands for: the CLI raises SIGTERM's and SIGHUP's with their name,
    Python's own (Ctrl-C) has none."""
    return str(e) or "SIGINT, Ctrl-C"


def _get(client: Any, name: str) -> Any | None:
    from docker.errors import NotFound

    try:
        return client.containers.get(name)
    except NotFound:
        return None


def _image_of(container: Any) -> str:
    labels = (container.attrs.get("Config") or {}).get("Labels") or {}
    return labels.get(LABEL_IMAGE) or (container.attrs.get("Config") or {}).get("Image", "?")


def _step(hook: StepHook | None, name: str) -> None:
    if hook is not None:
        hook(name)


def deploy_container(
    client: Any,
    facts: ImageFacts,
    name: str,
    opts: RunOptions,
    timeout: float,
    progress: HealthProgress | None = None,
    on_step: StepHook | None = None,
) -> DeployResult:
    """Replace the release ``name`` on ``client`` with ``facts``' image (by ID), health-gated; whatever
    happens, a healthy release (the new or the previous one) runs afterwards, or the error says why not."""
    from docker.errors import APIError

    check_name(name)
    opts.check()
    if not facts.has_healthcheck:  # the image is not deployable: exit 44, as docs/deploy.md's table says
        raise DeployError(
            f"image {facts.ref} has no HEALTHCHECK, so a deploy cannot prove it healthy; build it with "
            "veo-edge build --target ..., which adds one"
        )
    recovered = recover(client, name, timeout, progress)
    current = _get(client, name)
    new = None
    try:
        if current is not None:
            current.rename(name + OUTGOING_SUFFIX)  # the journal entry: a deploy is under way
            _step(on_step, "renamed")
            current.stop(timeout=opts.stop_timeout)
            _step(on_step, "stopped")
        new = client.containers.run(
            facts.image_id, **container_kwargs(facts, name, opts, current.id if current else "")
        )
        _step(on_step, "started")
        outcome = wait_healthy(new, timeout, progress)
    except BaseException as e:  # an engine error, Ctrl-C, SIGTERM (the CLI raises it), a lost engine
        _, restored = _restore(client, current, name, new, timeout, progress)
        if isinstance(e, KeyboardInterrupt):
            raise DeployInterruptedError(
                f"interrupted ({signal_name(e)}) while deploying {facts.ref} as {name}; {restored}"
            ) from e
        if isinstance(e, APIError):
            raise DeployError(
                f"the engine refused to start {facts.ref} as {name}: {e.explanation or e}; {restored}"
            ) from e
        if isinstance(e, Exception) and not isinstance(e, DeployError):
            raise DeployError(
                f"lost the engine while deploying {facts.ref} as {name} ({e}); {restored}"
            ) from e
        raise
    if outcome.healthy:
        _finish(client, name, current, facts.image_id)
        _step(on_step, "finished")
        return DeployResult(
            name,
            facts.ref,
            facts.image_id,
            new.id,
            _kept_image(client, name),
            outcome.waited_s,
            recovered=recovered,
        )
    why = f"{facts.ref} did not become healthy as {name}: {outcome.reason}"
    details = f"; last healthcheck: {outcome.last_check or '(none)'}; last log lines: {outcome.log_tail or '(none)'}"
    ok, restored = _restore(client, current, name, new, timeout, progress)
    if current is None:
        raise UnhealthyReleaseError(f"{why}; it was removed (there was no previous release){details}")
    raise (UnhealthyReleaseError if ok else RollbackFailedError)(f"{why}; {restored}{details}")


def _kept_image(client: Any, name: str) -> str | None:
    kept = _get(client, name + PREVIOUS_SUFFIX)
    return _image_of(kept) if kept is not None else None


def _finish(client: Any, name: str, outgoing: Any | None, new_image_id: str | None = None) -> None:
    """The new release is healthy: the outgoing one becomes the kept previous release, unless it ran the
    same image (a deploy run again, e.g. a retried CI job, or new options): then it goes and the kept
    previous release stays, the only way back to a different image."""
    if outgoing is None:
        return
    if new_image_id is not None and outgoing.image is not None and outgoing.image.id == new_image_id:
        outgoing.remove(force=True, v=True)
        return
    stale = _get(client, name + PREVIOUS_SUFFIX)
    if stale is not None and stale.id != outgoing.id:
        stale.remove(force=True)
    outgoing.rename(name + PREVIOUS_SUFFIX)


def _restore(
    client: Any,
    current: Any | None,
    name: str,
    new: Any | None,
    timeout: float,
    progress: HealthProgress | None,
    what: str = "rolled back to the previous release",
) -> tuple[bool, str]:
    """Remove the new release and put ``current`` back under ``name``, started and proven healthy;
    returns whether it is healthy and one phrase saying what was done (a failed restart is said, not
    raised: the container stays in place)."""
    if new is None:
        new = _get(client, name)
        if new is not None and current is not None and new.id == current.id:
            new = None
    if new is not None:
        with contextlib.suppress(Exception):
            new.remove(force=True)
    if current is None:
        return True, "there was no previous release"
    image = _image_of(current)
    kept = None  # its name, as the engine last told it (the SDK's rename does not update the object)
    try:
        current.reload()
        kept = current.name.lstrip("/")
        if kept != name:
            current.rename(name)
            kept = name
        current.start()
    except Exception as e:
        why = getattr(e, "explanation", None) or e
        # under NAME the journal is closed and `deploy status` has nothing left to finish
        then = (
            f"start it by hand (docker start {name}) once that is fixed, and check it with "
            f"`veo-edge deploy status {name}`"
            if kept == name
            else f"start it by hand or run `veo-edge deploy status {name}` to finish"
        )
        return False, (
            f"the previous release {image} is kept{f' as container {kept}' if kept else ''} but did not "
            f"start again ({why}): {then}"
        )
    back: HealthOutcome = wait_healthy(current, timeout, progress)
    if back.healthy:
        return True, f"{what} {image}, healthy again"
    return False, f"the release {image} was restarted under {name} but is not healthy either ({back.reason})"


def recover(client: Any, name: str, timeout: float, progress: HealthProgress | None = None) -> str | None:
    """Finish what an interrupted deploy or rollback of ``name`` left (the journal: ``NAME-outgoing`` or
    ``NAME-rollback``); returns what was done, None when there was nothing to do."""
    for suffix, what in ((OUTGOING_SUFFIX, "deploy"), (PARKED_SUFFIX, "rollback")):
        left = _get(client, name + suffix)
        if left is None:
            continue
        new = _get(client, name)
        if new is not None:
            st, *_ = health(new)
            outcome = wait_healthy(new, timeout, progress) if st == "running" else None
            if outcome is not None and outcome.healthy:
                if suffix == OUTGOING_SUFFIX:
                    _finish(client, name, left)
                else:
                    stale = _get(client, name + PREVIOUS_SUFFIX)
                    if stale is not None:
                        stale.remove(force=True)
                    left.rename(name + PREVIOUS_SUFFIX)
                return f"finished an interrupted {what}: {_image_of(new)} is healthy as {name}"
            if suffix == PARKED_SUFFIX:  # the previous release was being tried: put it back, stopped
                with contextlib.suppress(Exception):
                    new.stop(timeout=10)
                if _get(client, name + PREVIOUS_SUFFIX) is None:
                    new.rename(name + PREVIOUS_SUFFIX)
                else:
                    new.remove(force=True)
                new = None
        _, restored = _restore(client, left, name, new, timeout, progress)
        return f"undid an interrupted {what}: {restored}"
    return None


def rollback(
    client: Any,
    name: str,
    timeout: float,
    progress: HealthProgress | None = None,
    stop_timeout: int = 30,
    on_step: StepHook | None = None,
    check: Callable[[Any], Any] | None = None,
) -> DeployResult:
    """Swap the running release ``name`` with the kept ``name-previous`` and prove that one healthy;
    when it is not, the current release comes back (and is proven healthy again). ``check`` is called
    with the kept container before anything is touched and refuses it by raising (the CLI passes
    :func:`veo_edge.deploy.release_check.previous_release_check`: its image and its run options)."""
    check_name(name)
    recovered = recover(client, name, timeout, progress)
    previous = _get(client, name + PREVIOUS_SUFFIX)
    if previous is None:
        raise DeployError(
            f"no previous release of {name} is kept on that engine (no container {name + PREVIOUS_SUFFIX})"
            f"{service_hint(client, name)}"
        )
    if check is not None:
        check(previous)
    current = _get(client, name)
    try:
        if current is not None:
            current.rename(name + PARKED_SUFFIX)
            _step(on_step, "renamed")
            current.stop(timeout=stop_timeout)
            _step(on_step, "stopped")
        previous.rename(name)
        previous.start()
        _step(on_step, "started")
        outcome = wait_healthy(previous, timeout, progress)
    except BaseException as e:
        _, state = _undo_rollback(client, name, previous, current, timeout, progress)
        if isinstance(e, KeyboardInterrupt):
            raise DeployInterruptedError(
                f"interrupted ({signal_name(e)}) rolling back {name}; {state}"
            ) from e
        raise
    if outcome.healthy:
        if current is not None:
            current.rename(name + PREVIOUS_SUFFIX)  # rolling back again returns to it
        _step(on_step, "finished")
        previous.reload()
        return DeployResult(
            name,
            _image_of(previous),
            previous.image.id,
            previous.id,
            _image_of(current) if current else None,
            outcome.waited_s,
            recovered=recovered,
        )
    ok, state = _undo_rollback(client, name, previous, current, timeout, progress)
    raise (UnhealthyReleaseError if ok else RollbackFailedError)(
        f"the previous release of {name} did not become healthy ({outcome.reason}; last healthcheck: "
        f"{outcome.last_check or '(none)'}); kept the current release: {state}"
    )


def _undo_rollback(
    client: Any, name: str, previous: Any, current: Any | None, timeout: float, progress
) -> tuple[bool, str]:
    with contextlib.suppress(Exception):
        previous.stop(timeout=10)
    with contextlib.suppress(Exception):
        previous.reload()
        if previous.name.lstrip("/") == name:
            previous.rename(name + PREVIOUS_SUFFIX)
    if current is None:
        return False, "there is no current release to go back to"
    return _restore(client, current, name, None, timeout, progress, "back to")


def status(client: Any, name: str, timeout: float = 300.0, progress=None) -> dict[str, Any]:
    """The release ``name`` and the kept previous one, as Docker reports them (after finishing what an
    interrupted deploy or rollback left)."""
    check_name(name)
    out: dict[str, Any] = {"name": name, "recovered": recover(client, name, timeout, progress)}
    for key, cname in (("current", name), ("previous", name + PREVIOUS_SUFFIX)):
        c = _get(client, cname)
        if c is None:
            out[key] = None
            continue
        st, last, restarts, code, hstatus = health(c)
        out[key] = {
            "container": c.name,
            "id": c.id[:12],
            "image": _image_of(c),
            "image_id": c.image.id if c.image else None,
            "state": st,
            # a stopped container keeps the health it had when it stopped ("unhealthy" once its checks
            # failed against a stopping server): only a running one's is a verdict
            "health": (hstatus or None) if st == "running" else None,
            "last_healthcheck": last or None,
            "restarts": restarts,
            "exit_code": code if st != "running" else None,
            "error": (c.attrs.get("State") or {}).get("Error") or None,  # why the engine could not start it
            "started_at": (c.attrs.get("State") or {}).get("StartedAt"),
        }
    if out["current"] is None and out["previous"] is None:
        raise DeployError(
            f"no release named {name} on that engine (no container {name}){service_hint(client, name)}"
        )
    return out


def service_hint(client: Any, name: str) -> str:
    """ "; ... add --swarm" when ``name`` is a swarm service on ``client`` (a manager), else ""."""
    try:
        if (client.info().get("Swarm") or {}).get("ControlAvailable"):
            client.services.get(name)
            return f"; a swarm service {name} runs there: add --swarm"
    except Exception:  # no swarm, no such service, an engine that does not say: no hint
        pass
    return ""
