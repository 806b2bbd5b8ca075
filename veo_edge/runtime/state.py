"""What the runtime shows of its backends: each candidate's status, the state snapshot, how a fault is
classed, and the activated runner as the fallback holds it."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from veo_edge.errors import CudaOutOfMemoryError, DeviceLostError, NoBackendError
from veo_edge.runtime.backends.base import Runner
from veo_edge.runtime.batching import BatcherStats

log = logging.getLogger("veo_edge.runtime")

#: how many skips and switches the runtime's state keeps (the newest); counters are not capped
HISTORY = 256


class Throttled:
    """A recurring log line at most once every ``every_s`` seconds per key: the first at once, each later
    one with the count of those held back since (a backend failing every batch logged every batch:
    3,500 lines in 6 s). The counters on /metrics have every one."""

    def __init__(self, logger: logging.Logger, level: int, every_s: float = 10.0) -> None:
        self.logger, self.level, self.every_s = logger, level, every_s
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, int]] = {}  # key -> (when last logged, held back since)

    def __call__(self, key: str, msg: str, *args: Any) -> None:
        import time

        now = time.monotonic()
        with self._lock:
            last, held = self._last.get(key, (float("-inf"), 0))
            if now - last < self.every_s:
                self._last[key] = (last, held + 1)
                return
            self._last[key] = (now, 0)
        if held:
            msg += f" (and {held} more like it in the last {now - last:.0f} s)"
        self.logger.log(self.level, msg, *args)


def short(reason: str, limit: int = 120) -> str:
    """The first line of a reason, cut at ``limit`` characters (the full one goes to the details)."""
    line = reason.strip().splitlines()[0] if reason.strip() else reason
    return line if len(line) <= limit else line[: limit - 1] + "…"


#: the fault kind of a golden canary answered wrongly that cost the backend: its traffic (a switch), its
#: place as the standby (dropped) or its warm-up (skipped); the runtime cannot tell a wrong answer to a
#: request, so only the canary's are counted
WRONG_ANSWER = "wrong_answer"


def fault_kind(error: BaseException) -> str:
    """``device_lost``, ``oom`` or ``backend``: how a backend failure is counted and handled (a wrong
    answer raises nothing: the canary that finds it counts :data:`WRONG_ANSWER`)."""
    if isinstance(error, DeviceLostError):
        return "device_lost"
    if isinstance(error, CudaOutOfMemoryError):
        return "oom"
    return "backend"


@dataclass(frozen=True)
class CandidateStatus:
    name: str
    status: str  # untried | active | standby | skipped | failed | disabled
    reason: str | None = None


@dataclass(frozen=True)
class RuntimeState:
    """A snapshot of the runtime's backend selection, fallback history and fault counters."""

    active_backend: str | None
    candidates: list[CandidateStatus]
    skipped: list[dict[str, str]]
    switches: list[dict[str, Any]]
    fallback_count: int
    ready: bool
    closed: bool
    #: backend -> the warm-up canary result it passed when it last became a standby (or was recovered)
    verified: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SyncCounters(BatcherStats):
    """Counters of the synchronous ``infer`` path, in the batcher's form so the two can be added."""

    def count(self, n: int, us: float, ok: bool) -> None:
        """One batch of ``n`` samples that took ``us`` microseconds (the caller holds its lock)."""
        self.batches += 1
        self.batch_size_counts[n] = self.batch_size_counts.get(n, 0) + 1
        self.batch_compute_us[n] = self.batch_compute_us.get(n, 0.0) + us
        if ok:
            self.requests_success += n
        else:
            self.requests_failure += n
        self.request_us_total += us * n
        self.compute_us_total += us

    def add(self, other: BatcherStats) -> dict[str, Any]:
        sizes = dict(self.batch_size_counts)
        for k, v in other.batch_size_counts.items():
            sizes[k] = sizes.get(k, 0) + v
        compute = dict(self.batch_compute_us)
        for k, us in other.batch_compute_us.items():
            compute[k] = compute.get(k, 0.0) + us
        dicts = ("batch_size_counts", "close_reasons", "batch_compute_us")
        out = {k: getattr(self, k) + getattr(other, k) for k in vars(self) if k not in dicts}
        out["max_wait_us"] = max(self.max_wait_us, other.max_wait_us)
        # the synchronous path forms no batches: only the batcher's batches have close reasons
        return {
            **out,
            "batch_size_counts": dict(sorted(sizes.items())),
            "batch_compute_us": dict(sorted(compute.items())),
            "close_reasons": dict(other.close_reasons),
        }


def concurrency(runner: Runner | None) -> int:
    """How many batches ``runner`` runs in parallel (its ``concurrency``; 1 when it does not say)."""
    target = getattr(runner, "inner", runner)
    return max(1, int(getattr(target, "concurrency", 1) or 1))


class Held:
    """An activated runner (the active one or a standby): its slots and its consecutive failures."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.slots = threading.BoundedSemaphore(concurrency(runner))
        self.failures = 0


class Tally:
    """Faults by (backend, kind) and retries by (the backend they ran on, ok|failed); never capped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.faults: Counter[tuple[str, str]] = Counter()
        self.retries: Counter[tuple[str, str]] = Counter()

    def fault(self, backend: str, kind: str) -> None:
        with self._lock:
            self.faults[(backend, kind)] += 1

    def retry(self, backend: str, ok: bool) -> None:
        with self._lock:
            self.retries[(backend, "ok" if ok else "failed")] += 1

    def snapshot(self) -> dict[str, dict[str, dict[str, int]]]:
        """``{"faults": {backend: {kind: n}}, "retries": {backend: {outcome: n}}}``."""
        out: dict[str, dict[str, dict[str, int]]] = {"faults": {}, "retries": {}}
        with self._lock:
            for key, counts in (("faults", self.faults), ("retries", self.retries)):
                for (backend, label), n in sorted(counts.items()):
                    out[key].setdefault(backend, {})[label] = n
        return out


def no_backend_error(
    where: str, names: Sequence[str], skipped: list[dict[str, str]], failure: str | None, fallback: bool
) -> NoBackendError:
    """The error of a runtime none of whose candidates ``names`` can run, with each one's latest reason."""
    latest = {s["backend"]: s["reason"] for s in skipped if s["backend"] in names}
    tried = "; ".join(f"{n}: {short(latest[n])}" for n in names if n in latest)
    hint = "Fallback is off (--no-fallback): allow it, or fix the first backend; " if not fallback else ""
    error = NoBackendError(
        f"no backend can run build {where}"
        + (f" after {short(failure)}" if failure else "")
        + f" (tried {', '.join(names) or 'none'}): {tried or 'none left'}; {hint}"
        "--json or --debug shows each backend's full reason, `veo-edge doctor` what this machine has"
    )
    error.details = {"tried": list(names), "skipped": [{"backend": n, "reason": latest[n]} for n in latest]}
    return error


def release(runner: Runner, name: str) -> None:
    """Deactivate ``runner``; a failure to (a dead device may not release) is logged, not raised."""
    try:
        runner.deactivate()
    except Exception as e:
        log.warning("deactivating %s raised %s", name, e)
