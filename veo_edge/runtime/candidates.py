"""The policy's candidates and the activated runners among them: each candidate's status, trying one
(probe, activate, warm), the standby after the active one, and what the runtime shows of them.

:class:`Candidates` is the half of :class:`~veo_edge.runtime.fallback.Fallback` that holds; the other
half runs batches, retries, switches and recovers (the rules are in :mod:`veo_edge.runtime.fallback`).
A candidate that failed an attempt for a fault that may heal is tried again on the recovery clock, each
wait twice the last (:class:`~veo_edge.runtime.recovery.Backoff`)."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from veo_edge.runtime.activation import try_candidate
from veo_edge.runtime.backends.base import Runner, Verdict
from veo_edge.runtime.gate import Gate
from veo_edge.runtime.recovery import Backoff
from veo_edge.runtime.state import (
    HISTORY,
    CandidateStatus,
    Held,
    RuntimeState,
    Tally,
    no_backend_error,
    short,
)

__all__ = ["Candidates"]

log = logging.getLogger("veo_edge.runtime")


class Candidates:
    """The activated runners among ``names`` (in policy order): the active one and its standbys.

    ``probe(name)``: can a candidate run here; ``make(name)``: its (unactivated) runner; ``check(name,
    runner)``: warm an activated one, may it take traffic (``ok``, ``reason``, ``to_dict()``); ``where``:
    the build, named when none can run. ``fallback=False``: no standby, no retry, failures are errors.
    ``retry_after_s``: a candidate whose activation or warm-up raised is tried again this long after
    (then twice as long after each further failure, :class:`~veo_edge.runtime.recovery.Backoff`)."""

    def __init__(
        self,
        names: Sequence[str],
        disabled: Sequence[str],
        *,
        probe: Callable[[str], Verdict],
        make: Callable[[str], Runner],
        fallback: bool,
        where: str,
        check: Callable[[str, Runner], Any] | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        self.names = list(names)
        self.fallback = fallback
        self._probe, self._make, self._check, self._where = probe, make, check, where
        self.gate = Gate()
        self._lock = threading.Lock()  # counters, statuses, histories
        self._standby_lock = threading.Lock()  # one activation of a standby at a time
        self._held: dict[int, Held] = {}  # index -> activated runner: the active one and standbys
        self._active: int | None = None
        self._status = {n: CandidateStatus(n, "untried") for n in self.names}
        for n in disabled:
            self._status[n] = CandidateStatus(n, "disabled", "fallback is off (--no-fallback)")
        #: when a candidate refused for a fault that may heal (or a recovery refused) is tried again
        self.retry_after_s = retry_after_s
        self._backoff = Backoff(retry_after_s)
        self._wrong: set[str] = set()  # last refused or rejected for a wrong answer (their canary)
        self._skipped: deque[dict[str, Any]] = deque(maxlen=HISTORY)  # bounded: recovery may probe for days
        self._switches: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self._verified: dict[str, Any] = {}
        self.fallback_count = 0  # failures switched away from, counted beyond the history's length
        self.recovery_count = 0  # moves back to a recovered candidate, likewise
        self.tally = Tally()  # faults and retries
        self._due: tuple[int, Runner, BaseException] | None = None  # a switch the next settle makes
        self._retired: list[Runner] = []  # dropped standbys, released under the exclusive gate
        self._prepare_due = False  # a standby was dropped: the next settle prepares another
        self._closed = False

    # -- observation ------------------------------------------------------------------------------
    @property
    def runner(self) -> Runner | None:
        held = self._held.get(self._active) if self._active is not None else None
        return held.runner if held is not None else None

    @property
    def active_backend(self) -> str | None:
        return None if self._active is None else self.names[self._active]

    def steady(self) -> bool:
        """A batch run now needs only its compute (:meth:`Runtime.run_alone`): a backend active whose last
        call succeeded, the gate free, no switch or release pending, no candidate after it untried (a
        retry would activate it). Faults and switches of the past do not count."""
        with self._lock:
            active = self._active
            if active is None or self.gate.held or self._due or self._retired or self._prepare_due:
                return False
            held = self._held.get(active)
            if held is None or held.failures:
                return False
            return not any(self._untried(n) for n in self.names[active + 1 :])

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
                verified={n: r.to_dict() for n, r in self._verified.items()},
            )

    @property
    def standby_backend(self) -> str | None:
        """The warm candidate a failed batch is re-run on first (None: none held beside the active)."""
        standby = min((k for k in tuple(self._held) if k != self._active), default=None)
        return None if standby is None else self.names[standby]

    def counters(self) -> dict[str, Any]:
        """Faults by backend and kind, retries by the backend they ran on and outcome, switches, standby."""
        with self._lock:
            return {
                **self.tally.snapshot(),
                "fallback_switches": self.fallback_count,
                "fallback_recoveries": self.recovery_count,
                "standby_backend": self.standby_backend,
            }

    def _set_status(self, name: str, status: str, reason: str | None = None) -> None:
        with self._lock:
            self._status[name] = CandidateStatus(name, status, reason)
            if status in ("failed", "skipped", "untried"):
                self._verified.pop(name, None)

    # -- activation -------------------------------------------------------------------------------
    def _try(self, index: int, warm: bool = False, retry_any: bool = False) -> Runner | None:
        """Candidate ``index`` probed, activated (and with ``warm`` warm-checked); ``None``: skipped, and
        tried again after its backoff when its fault may heal (``retry_any``: whatever the refusal was,
        as a recovery tries the GPU again after "no GPU here")."""
        name = self.names[index]
        check = self._check if warm else None
        tried = try_candidate(name, probe=self._probe, make=self._make, check=check, tally=self.tally)
        with self._lock:
            if tried.wrong:
                self._wrong.add(name)
            else:
                self._wrong.discard(name)
            if tried.runner is not None:
                self._backoff.clear(name)
                if tried.result is not None:
                    self._verified[name] = tried.result
                return tried.runner
            if tried.may_heal or retry_any:
                self._backoff.failed(name)
            else:
                self._backoff.clear(name)  # a wrong answer stays wrong: not tried again
            self._skip(name, tried.reason)
            self._status[name] = CandidateStatus(name, "skipped", tried.reason)
        log.info("backend %s skipped: %s", name, tried.reason)
        return None

    def _skip(self, name: str, reason: str) -> None:
        """Note ``name`` skipped for ``reason`` in the history (``self._lock`` held). A candidate skipped
        again (each re-check) is one entry, counted, with the latest reason, and last; reasons name
        moments and call counts, so they rarely repeat word for word."""
        entry: dict[str, Any] = {"backend": name, "reason": reason}
        for seen in self._skipped:
            if seen["backend"] == name:
                self._skipped.remove(seen)
                entry["times"] = seen.get("times", 1) + 1
                break
        self._skipped.append(entry)

    def _resting(self, name: str, throttled: bool) -> bool:
        """Not to be tried by a recovery now: waiting out its backoff on the recovery clock
        (``throttled``), or, whoever asks, after a wrong answer, which trying sooner does not make right:
        until its backoff is over (none kept: never; a standby refused at its warm-up, or no clock)."""
        if name in self._wrong:
            return not self._backoff.due(name)
        return throttled and self._backoff.waiting(name)

    def _untried(self, name: str) -> bool:
        """Never tried, or refused or dropped for a fault that may have healed, and due to be tried again."""
        return self._status[name].status == "untried" or self._backoff.due(name)

    def recovery_due(self) -> bool:
        """A switch happened, none is active, or a candidate ahead of the active one may have healed."""
        if self._switches or self._active is None:
            return True
        return any(self._backoff.pending(n) for n in self.names[: self._active])

    def activate_from(self, first: int, failure: str | None = None, warm: bool = False) -> None:
        """Activate the first usable candidate at or after ``first`` (under the exclusive side of the
        gate); raise :class:`NoBackendError` with every candidate's reason when none is."""
        for i in range(first, len(self.names)):
            held = self._held.pop(i, None)  # a standby there is warm already
            runner = held.runner if held is not None else self._try(i, warm)
            if runner is not None:
                self._use(runner, i)
                log.info("backend %s active", self.names[i])
                return
        names = self.names[first:]
        raise no_backend_error(self._where, names, list(self._skipped), failure, self.fallback)

    def _use(self, runner: Runner, index: int) -> None:
        """Make ``runner`` the active one (under the exclusive side of the gate)."""
        self._held[index] = Held(runner)
        self._active = index
        self._set_status(self.names[index], "active")

    def prepare_standby(self) -> None:
        """Warm the first untried candidate after the active one (:meth:`_untried`: also one whose fault
        may have healed) as its standby, unless one is held."""
        if not self.fallback:
            return
        with self.gate.shared():
            active = self._active
            for j in range(len(self.names) if active is None else active + 1, len(self.names)):
                if self._closed or any(k > j for k in tuple(self._held)) or self._standby(j) is not None:
                    return

    def _prepare_in_background(self) -> None:
        threading.Thread(target=self.prepare_standby, name="veo-edge-standby", daemon=True).start()

    def _standby(self, j: int) -> Held | None:
        """Candidate ``j``'s standby; an untried one (or one due again) is activated and warmed now."""
        held = self._held.get(j)
        if held is not None or not self._untried(self.names[j]):
            return held
        with self._standby_lock:
            if j not in self._held and self._untried(self.names[j]) and not self._closed:
                was = self._status[self.names[j]]
                runner = self._try(j, warm=True)
                if runner is not None:
                    self._held[j] = Held(runner)
                    self._set_status(self.names[j], "standby")
                    if was.reason:  # back after a drop, which was a WARNING: its return shows as one too
                        log.warning(
                            "backend %s warm as a standby again (last refused: %s)",
                            self.names[j],
                            short(was.reason),
                        )
                    else:
                        log.info("backend %s warm as a standby", self.names[j])
            return self._held.get(j)

    def _record(self, frm: str, to: str | None, reason: str, failure: bool = False) -> None:
        with self._lock:
            self._switches.append({"from": frm, "to": to, "reason": reason, "at": time.time()})
            self.fallback_count += failure
            self.recovery_count += reason == "recovered"
