"""The fallback at run time: which candidate is active, how a batch runs on it, and the switch to the next
one when it fails (and back when an earlier one recovers).

:mod:`veo_edge.runtime.policy` decides the candidates, their order and how each is probed and made;
:class:`Fallback` holds the active runner among them behind a gate (batches share it, activation and
switching take it alone) and keeps the history that :class:`RuntimeState` shows. The runtime above it
owns the requests, the batcher and the counters.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from veo_edge.errors import (
    BackendError,
    BackendUnavailableError,
    InputError,
    ModelLoadError,
    NoBackendError,
    UsageError,
    VeoEdgeError,
)
from veo_edge.runtime.backends.base import Runner, Verdict

log = logging.getLogger("veo_edge.runtime")

#: how many skips and switches the runtime's state keeps (the newest); counters are not capped
HISTORY = 256


def _short(reason: str, limit: int = 120) -> str:
    """The first line of a reason, cut at ``limit`` characters (the full one goes to the details)."""
    line = reason.strip().splitlines()[0] if reason.strip() else reason
    return line if len(line) <= limit else line[: limit - 1] + "…"


@dataclass(frozen=True)
class CandidateStatus:
    name: str
    status: str  # untried | active | standby | skipped | failed | disabled
    reason: str | None = None


@dataclass(frozen=True)
class RuntimeState:
    """A snapshot of the runtime's backend selection and fallback history."""

    active_backend: str | None
    candidates: list[CandidateStatus]
    skipped: list[dict[str, str]]
    switches: list[dict[str, Any]]
    fallback_count: int
    ready: bool
    closed: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def concurrency(runner: Runner | None) -> int:
    """How many batches ``runner`` runs in parallel (its ``concurrency``; 1 when it does not say)."""
    target = getattr(runner, "inner", runner)
    return max(1, int(getattr(target, "concurrency", 1) or 1))


class Fallback:
    """The active runner among ``names`` (in policy order) and the switches between them.

    ``probe(name)`` says whether a candidate can run here, ``make(name)`` creates its (unactivated) runner;
    ``where`` names the build in the error raised when none can run. ``fallback=False``: a failing batch
    is an error, not a switch. Nothing is probed or activated before :meth:`activate_from`."""

    def __init__(
        self,
        names: Sequence[str],
        disabled: Sequence[str],
        *,
        probe: Callable[[str], Verdict],
        make: Callable[[str], Runner],
        fallback: bool,
        where: str,
    ) -> None:
        self.names = list(names)
        self.fallback = fallback
        self._probe, self._make, self._where = probe, make, where
        # batches run on the runner under the gate's shared side, at most the runner's concurrency at
        # once (_slots); activation, switching and closing take its exclusive side
        self.gate = Gate()
        self._slots = threading.BoundedSemaphore(1)
        self._lock = threading.Lock()
        self.runner: Runner | None = None
        self._active: int | None = None  # index into self.names
        self._status = {n: CandidateStatus(n, "untried") for n in self.names}
        for n in disabled:
            self._status[n] = CandidateStatus(n, "disabled", "fallback is off (--no-fallback)")
        # bounded histories: a runtime that probes for recovery for days must not grow without limit
        self._skipped: deque[dict[str, str]] = deque(maxlen=HISTORY)
        self._switches: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self.fallback_count = 0  # failures switched away from, counted beyond the history's length

    @property
    def active_backend(self) -> str | None:
        return None if self._active is None else self.names[self._active]

    @property
    def switched(self) -> bool:
        """Whether any switch (a failure or a recovery) has happened."""
        return bool(self._switches)

    def state(self, *, started: bool, closed: bool) -> RuntimeState:
        with self._lock:
            return RuntimeState(
                active_backend=self.active_backend,
                candidates=list(self._status.values()),
                skipped=[dict(s) for s in self._skipped],
                switches=[dict(s) for s in self._switches],
                fallback_count=self.fallback_count,
                ready=started and not closed and self.runner is not None,
                closed=closed,
            )

    def _set_status(self, name: str, status: str, reason: str | None = None) -> None:
        with self._lock:
            self._status[name] = CandidateStatus(name, status, reason)

    def _try(self, index: int) -> Runner | None:
        """Probe and activate candidate ``index``; ``None`` (and a recorded skip) when it cannot run."""
        name = self.names[index]
        verdict = self._probe(name)
        reason = verdict.reason
        runner = None
        if verdict.ok:
            try:
                runner = self._make(name).activate()
            except (BackendUnavailableError, BackendError, ModelLoadError) as e:
                reason = str(e)
        if runner is None:
            reason = reason or "unusable (no reason given)"
            log.info("backend %s skipped: %s", name, reason)
            with self._lock:
                self._skipped.append({"backend": name, "reason": reason})
                self._status[name] = CandidateStatus(name, "skipped", reason)
        return runner

    def activate_from(self, first: int, failure: str | None = None) -> None:
        """Activate the first usable candidate at or after ``first`` (under the exclusive side of the
        gate); raise :class:`NoBackendError` with every candidate's reason when none is."""
        for i in range(first, len(self.names)):
            runner = self._try(i)
            if runner is not None:
                self._use(runner, i)
                log.info("backend %s active", self.names[i])
                return
        names = self.names[first:]
        skipped = [dict(s) for s in self._skipped if s["backend"] in names]
        latest = {s["backend"]: s["reason"] for s in skipped}
        tried = "; ".join(f"{n}: {_short(latest[n])}" for n in names if n in latest)
        hint = (
            "Fallback is off (--no-fallback): allow it, or fix the first backend; "
            if not self.fallback
            else ""
        )
        error = NoBackendError(
            f"no backend can run build {self._where}"
            + (f" after {_short(failure)}" if failure else "")
            + f" (tried {', '.join(names) or 'none'}): {tried or 'none left'}; {hint}"
            "--json or --debug shows each backend's full reason, `veo-edge doctor` what this machine has"
        )
        error.details = {"tried": names, "skipped": [{"backend": n, "reason": latest[n]} for n in latest]}
        raise error

    def _use(self, runner: Runner, index: int) -> None:
        """Make ``runner`` the active one (under the exclusive side of the gate)."""
        self.runner, self._active = runner, index
        self._slots = threading.BoundedSemaphore(concurrency(runner))
        self._set_status(self.names[index], "active")

    def run(self, feed: dict[str, np.ndarray], output: str) -> np.ndarray:
        """Run one batch on the active backend; on a backend failure switch to the next and re-run it.

        Several batches may run at once, up to the runner's own concurrency."""
        while True:
            with self.gate.shared():
                runner, index, slots = self.runner, self._active, self._slots
                if runner is None or index is None:
                    raise NoBackendError(
                        "no backend is active (all failed or the runtime is closed); see runtime.state"
                    )
                try:
                    with slots:
                        return runner.infer(feed)[output]
                except (InputError, UsageError):
                    raise
                except VeoEdgeError as e:
                    error: Exception = e
                except Exception as e:  # a runner bug or a library error it did not wrap
                    error = BackendError(f"{self.names[index]} failed: {type(e).__name__}: {e}")
            if not self.fallback or index + 1 >= len(self.names):
                raise error
            with self.gate:
                if self.runner is runner:  # not yet switched away by a concurrent batch
                    self._switch(index, error)

    def _switch(self, index: int, error: Exception) -> None:
        failed = self.names[index]
        reason = f"{type(error).__name__}: {error}"
        assert self.runner is not None
        try:
            self.runner.deactivate()
        except Exception as e:  # a dead device may fail to release; the switch goes on
            log.warning("deactivating %s after its failure raised %s", failed, e)
        self.runner, self._active = None, None
        self._set_status(failed, "failed", reason)
        self.activate_from(index + 1, failure=f"{failed} failed ({reason})")
        to = self.names[self._active]  # type: ignore[index]
        with self._lock:
            self._switches.append({"from": failed, "to": to, "reason": reason, "at": time.time()})
            self.fallback_count += 1
        log.warning("backend %s failed (%s); switched to %s and re-ran the batch", failed, reason, to)

    def recover(self, only_if_none_active: bool = False) -> bool:
        """Return to a candidate ahead of the active one, or to any when none is active; True if moved.
        Takes the exclusive side of the gate (re-entrant: a caller may hold it already)."""
        with self.gate:
            if only_if_none_active and self._active is not None:
                return False
            upto = len(self.names) if self._active is None else self._active
            for i in range(upto):
                if self._status[self.names[i]].status == "disabled":
                    continue
                runner = self._try(i)
                if runner is None:
                    continue
                old = "none" if self._active is None else self.names[self._active]
                if self.runner is not None:
                    self.runner.deactivate()
                if self._active is not None:
                    self._set_status(old, "standby")
                self._use(runner, i)
                with self._lock:
                    self._switches.append(
                        {"from": old, "to": self.names[i], "reason": "recovered", "at": time.time()}
                    )
                log.warning("backend %s usable again; switched back from %s", self.names[i], old)
                return True
        return False

    def deactivate(self) -> None:
        """Release the active runner (under the exclusive side of the gate); none is active after."""
        with self.gate:
            if self.runner is not None:
                self.runner.deactivate()
                self.runner = None


class Gate:
    """Shared (batches running) / exclusive (activation, switch, close) access to the active runner.

    The exclusive side is re-entrant for its owner and is also the gate's context manager; a thread that
    holds it may take the shared side too. The standard library has no reader-writer lock."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._owner: int | None = None
        self._depth = 0

    @contextlib.contextmanager
    def shared(self):
        me = threading.get_ident()
        with self._cond:
            if self._owner != me:
                while self._owner is not None:
                    self._cond.wait()
                self._readers += 1
        try:
            yield
        finally:
            if self._owner != me:
                with self._cond:
                    self._readers -= 1
                    self._cond.notify_all()

    def __enter__(self) -> Gate:
        me = threading.get_ident()
        with self._cond:
            if self._owner != me:
                while self._owner is not None:
                    self._cond.wait()
                self._owner = me
                while self._readers:
                    self._cond.wait()
            self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._depth -= 1
            if not self._depth:
                self._owner = None
                self._cond.notify_all()
