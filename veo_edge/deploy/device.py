"""One device: run a release as a container, prove it healthy, and roll back when it is not.

The release runs as the container ``NAME``. A deploy stops the running release and keeps it, renamed
``NAME-outgoing``, until the new one is healthy (Docker's own health status, from the image's
HEALTHCHECK). A new release that reports unhealthy, exits, or never becomes healthy within the timeout is
removed, the previous one is restarted under ``NAME`` and proven healthy again, and the deploy fails
with the last healthcheck output and log lines. After a good deploy the release that ran until then stays
(stopped) as ``NAME-previous`` so that ``veo-edge deploy rollback NAME`` can go back to it; one
generation is kept, and a failed deploy leaves it as it was.

Releases on one device use host networking by default (the stop-first order above is what lets the new
release bind the same port).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from veo_edge.deploy.profiles import ImageFacts, gpu_run
from veo_edge.errors import DeployError, RollbackFailedError, UnhealthyReleaseError, UsageError

PREVIOUS_SUFFIX = "-previous"
OUTGOING_SUFFIX = "-outgoing"  # the running release while its successor proves itself
LABEL_DEPLOY = "io.veo-edge.deploy.name"
LABEL_IMAGE = "io.veo-edge.deploy.image"

#: health callback: (container name, health status or state, seconds waited)
HealthProgress = Callable[[str, str, float], None]


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

    def check(self) -> None:
        if not 0 < self.port < 65536:
            raise UsageError(f"--port {self.port} is not a TCP port (1..65535)")
        if self.cpus is not None and self.cpus <= 0:
            raise UsageError(f"--cpus {self.cpus} must be positive")


@dataclass
class HealthOutcome:
    healthy: bool
    reason: str
    last_check: str = ""
    log_tail: str = ""
    waited_s: float = 0.0


@dataclass
class DeployResult:
    name: str
    image: str
    image_id: str
    container_id: str
    previous_image: str | None
    waited_s: float
    transfer: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "image": self.image,
            "image_id": self.image_id,
            "container_id": self.container_id,
            "previous_image": self.previous_image,
            "healthy_after_s": round(self.waited_s, 2),
            "transfer": self.transfer,
        }


def check_name(name: str) -> str:
    import re

    if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,100}", name):
        raise UsageError(
            f"--name {name!r} is not a container name: letters, digits, '_', '.', '-', starting with a "
            "letter or digit"
        )
    return name


def _get(client: Any, name: str) -> Any | None:
    from docker.errors import NotFound

    try:
        return client.containers.get(name)
    except NotFound:
        return None


def _health(container: Any) -> tuple[str, str, int, int | None, str]:
    """(status, last healthcheck output, restart count, exit code, health status) of a container."""
    container.reload()
    state = container.attrs.get("State") or {}
    health = state.get("Health") or {}
    log = health.get("Log") or []
    last = (log[-1].get("Output") or "").strip() if log else ""
    return (
        state.get("Status", "unknown"),
        last,
        int(container.attrs.get("RestartCount") or 0),
        state.get("ExitCode"),
        health.get("Status", ""),
    )


def _log_tail(container: Any, lines: int = 15) -> str:
    try:
        text = container.logs(tail=lines).decode(errors="replace")
    except Exception as e:  # a removed or dead container: say so instead of failing the report
        return f"(no logs: {e})"
    return " | ".join(line for line in text.splitlines() if line.strip())


def wait_healthy(container: Any, timeout: float, progress: HealthProgress | None = None) -> HealthOutcome:
    """Poll Docker's health status until healthy, unhealthy, exited, restarted or ``timeout``."""
    start = time.monotonic()
    poll = 0.5
    while True:
        status, last, restarts, code, health = _health(container)
        waited = time.monotonic() - start
        if progress is not None:
            progress(container.name, health or status, waited)
        if health == "healthy" and status == "running":
            return HealthOutcome(True, "healthy", last, "", waited)
        reason = None
        if status in ("exited", "dead"):
            reason = f"the container exited with code {code}"
        elif restarts > 0:
            reason = f"the container exited and was restarted {restarts}x by its restart policy"
        elif health == "unhealthy":
            reason = "Docker reports it unhealthy"
        elif not health:
            reason = "the image has no HEALTHCHECK, so its health cannot be proven"
        elif waited >= timeout:
            reason = f"it was not healthy within {timeout:g} s (health: {health})"
        if reason is not None:
            return HealthOutcome(False, reason, last, _log_tail(container), waited)
        time.sleep(poll)


def _run(client: Any, facts: ImageFacts, name: str, opts: RunOptions) -> Any:
    from docker.types import DeviceRequest

    gpu = gpu_run(facts.target)
    kw: dict[str, Any] = {
        "name": name,
        "detach": True,
        "read_only": True,
        "tmpfs": {"/tmp": "rw,nosuid,nodev,size=64m"},
        "restart_policy": {"Name": "unless-stopped"},
        "network_mode": opts.network,
        "environment": {facts.port_env: str(opts.port), **opts.env},
        "labels": {LABEL_DEPLOY: name, LABEL_IMAGE: facts.ref},
        "volumes": {opts.cache_volume or f"veo-edge-cache-{name}": {"bind": facts.cache_dir, "mode": "rw"}},
    }
    if gpu.runtime:
        kw["runtime"] = gpu.runtime
    if gpu.device_requests:
        kw["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    if opts.selinux_type:
        kw["security_opt"] = [f"label=type:{opts.selinux_type}"]
    if opts.memory:
        kw["mem_limit"] = opts.memory
    if opts.cpus:
        kw["nano_cpus"] = int(opts.cpus * 1e9)
    return client.containers.run(facts.image_id, **kw)


def _image_of(container: Any) -> str:
    labels = (container.attrs.get("Config") or {}).get("Labels") or {}
    return labels.get(LABEL_IMAGE) or (container.attrs.get("Config") or {}).get("Image", "?")


def deploy_container(
    client: Any,
    facts: ImageFacts,
    name: str,
    opts: RunOptions,
    timeout: float,
    progress: HealthProgress | None = None,
) -> DeployResult:
    """Replace the release ``name`` on ``client`` with ``facts``' image, health-gated, with rollback."""
    from docker.errors import APIError

    check_name(name)
    opts.check()
    if not facts.has_healthcheck:
        raise UsageError(
            f"image {facts.ref} has no HEALTHCHECK, so a deploy cannot prove it healthy; build it with "
            "veo-edge build --target ..., which adds one"
        )
    previous_name = name + PREVIOUS_SUFFIX
    outgoing_name = name + OUTGOING_SUFFIX
    current = _get(client, name)
    stale = _get(client, previous_name)
    try:
        leftover = _get(client, outgoing_name)
        if leftover is not None:  # an interrupted deploy's: the release under NAME is the one that ran last
            leftover.remove(force=True)
        if current is not None:
            current.stop(timeout=opts.stop_timeout)
            current.rename(outgoing_name)
        new = _run(client, facts, name, opts)
    except APIError as e:
        _restore(client, current, name, timeout, progress)
        raise DeployError(f"the engine refused to start {facts.ref} as {name}: {e.explanation or e}") from e
    except BaseException:
        _restore(client, current, name, timeout, progress)
        raise
    outcome = wait_healthy(new, timeout, progress)
    if outcome.healthy:
        # the release that ran until now becomes the one kept for `deploy rollback` (one generation)
        if current is not None:
            if stale is not None:
                stale.remove(force=True)
            current.rename(previous_name)
        kept = current if current is not None else stale
        return DeployResult(
            name, facts.ref, facts.image_id, new.id, _image_of(kept) if kept else None, outcome.waited_s
        )
    with contextlib.suppress(Exception):
        new.remove(force=True)
    why = f"{facts.ref} did not become healthy as {name}: {outcome.reason}"
    details = f"; last healthcheck: {outcome.last_check or '(none)'}; last log lines: {outcome.log_tail or '(none)'}"
    if current is None:
        raise UnhealthyReleaseError(f"{why}; it was removed (there was no previous release){details}")
    restored = _restore(client, current, name, timeout, progress)
    if not restored.healthy:
        raise RollbackFailedError(
            f"{why}; the previous release {_image_of(current)} was restarted but is not healthy either "
            f"({restored.reason}){details}"
        )
    raise UnhealthyReleaseError(
        f"{why}; rolled back to the previous release {_image_of(current)}, healthy again{details}"
    )


def _restore(
    client: Any, current: Any | None, name: str, timeout: float, progress: HealthProgress | None
) -> HealthOutcome:
    """Put the release that ran before back under ``name`` and start it (after a failed deploy)."""
    if current is None:
        return HealthOutcome(True, "nothing to restore")
    half = _get(client, name)
    if half is not None and half.id != current.id:
        with contextlib.suppress(Exception):
            half.remove(force=True)
    current.reload()
    if current.name != name:
        current.rename(name)
    current.start()
    return wait_healthy(current, timeout, progress)


def rollback(
    client: Any, name: str, timeout: float, progress: HealthProgress | None = None, stop_timeout: int = 30
) -> DeployResult:
    """Swap the running release ``name`` with the kept ``name-previous`` and prove that one healthy."""
    check_name(name)
    previous_name = name + PREVIOUS_SUFFIX
    previous = _get(client, previous_name)
    if previous is None:
        raise DeployError(
            f"no previous release of {name} is kept on that engine (no container {previous_name})"
        )
    current = _get(client, name)
    parked = name + "-rollback"
    if current is not None:
        current.stop(timeout=stop_timeout)
        current.rename(parked)
    previous.rename(name)
    previous.start()
    outcome = wait_healthy(previous, timeout, progress)
    if outcome.healthy:
        if current is not None:
            current.rename(previous_name)  # rolling back again returns to it
        previous.reload()
        return DeployResult(
            name,
            _image_of(previous),
            previous.image.id,
            previous.id,
            _image_of(current) if current else None,
            outcome.waited_s,
        )
    previous.stop(timeout=stop_timeout)
    previous.rename(previous_name)
    if current is None:
        raise RollbackFailedError(f"the previous release of {name} is not healthy: {outcome.reason}")
    current.rename(name)
    current.start()
    back = wait_healthy(current, timeout, progress)
    state = "healthy again" if back.healthy else f"not healthy either ({back.reason})"
    raise (UnhealthyReleaseError if back.healthy else RollbackFailedError)(
        f"the previous release of {name} did not become healthy ({outcome.reason}; last healthcheck: "
        f"{outcome.last_check or '(none)'}); kept the current release, {state}"
    )


def status(client: Any, name: str) -> dict[str, Any]:
    """The release ``name`` and the kept previous one, as Docker reports them."""
    check_name(name)
    out: dict[str, Any] = {"name": name}
    for key, cname in (("current", name), ("previous", name + PREVIOUS_SUFFIX)):
        c = _get(client, cname)
        if c is None:
            out[key] = None
            continue
        st, last, restarts, code, health = _health(c)
        out[key] = {
            "container": c.name,
            "id": c.id[:12],
            "image": _image_of(c),
            "image_id": c.image.id if c.image else None,
            "state": st,
            "health": health or None,
            "last_healthcheck": last or None,
            "restarts": restarts,
            "exit_code": code if st != "running" else None,
            "started_at": (c.attrs.get("State") or {}).get("StartedAt"),
        }
    if out["current"] is None and out["previous"] is None:
        raise DeployError(f"no release named {name} on that engine (no container {name})")
    return out
