"""Docker's own health verdict on one container, waited for: healthy, unhealthy, exited, restarted by its
policy, or not healthy in time; with the last healthcheck output and log lines for the report."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: health callback: (container name, health status or state, seconds waited)
HealthProgress = Callable[[str, str, float], None]


@dataclass
class HealthOutcome:
    healthy: bool
    reason: str
    last_check: str = ""
    log_tail: str = ""
    waited_s: float = 0.0


def health(container: Any) -> tuple[str, str, int, int | None, str]:
    """(status, last healthcheck output, restart count, exit code, health status) of a container."""
    container.reload()
    state = container.attrs.get("State") or {}
    h = state.get("Health") or {}
    log = h.get("Log") or []
    last = (log[-1].get("Output") or "").strip() if log else ""
    return (
        state.get("Status", "unknown"),
        last,
        int(container.attrs.get("RestartCount") or 0),
        state.get("ExitCode"),
        h.get("Status", ""),
    )


def log_tail(container: Any, lines: int = 15) -> str:
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
        status, last, restarts, code, hstatus = health(container)
        waited = time.monotonic() - start
        if progress is not None:
            progress(container.name, hstatus or status, waited)
        if hstatus == "healthy" and status == "running":
            return HealthOutcome(True, "healthy", last, "", waited)
        reason = None
        if status in ("exited", "dead", "created"):
            reason = f"the container exited with code {code}" if status != "created" else "it never started"
        elif restarts > 0:
            reason = f"the container exited and was restarted {restarts}x by its restart policy"
        elif hstatus == "unhealthy":
            reason = "Docker reports it unhealthy"
        elif not hstatus:
            reason = "the image has no HEALTHCHECK, so its health cannot be proven"
        elif waited >= timeout:
            reason = f"it was not healthy within {timeout:g} s (health: {hstatus})"
        if reason is not None:
            return HealthOutcome(False, reason, last, log_tail(container), waited)
        time.sleep(poll)
