"""The fallback at run time: the active candidate, a warm standby behind it, the retry of a failed batch
on the candidates after the failing one, and the switch when a backend fails for good.

:mod:`veo_edge.runtime.policy` decides the candidates, their order and how each is probed and made;
:class:`Fallback` holds the activated runners among them (the active one and its standby) behind a gate
(batches share it; activation, switching and closing take it alone), counts every fault, retry and
switch, and keeps the history that :class:`RuntimeState` shows. The runtime above it owns the requests,
the batcher and the canary that warms a runner before it takes traffic.

The rules (docs/serving.md, "Faults, retries and fallback"):

- **Standby.** The first usable candidate after the active one is activated and warmed (``check``: the
  golden canary at the build's largest batch, by the rule of the precision it serves) before it takes any
  traffic; one that fails its warm-up is skipped with the reason (tried again ``retry_after_s`` later
  when its activation or warm-up raised, as is a dropped one). After a switch the next one is prepared
  in the background.
- **Retry.** A batch that fails on a backend is re-run on every candidate after it that can run (the
  standby first; one untried, or due again, is activated and warmed then), once each, and, when the
  failure was transient, once more on the backend it failed on, before any of its requests gets an error.
- **Switch.** A lost device (:class:`~veo_edge.errors.DeviceLostError`) switches at once. Out of memory
  and any other backend error are transient: the backend keeps new batches until :data:`SWITCH_AFTER`
  consecutive failed calls (a success resets the count), then traffic moves to the standby. A standby
  that fails the same way is dropped and the one after it prepared.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from veo_edge.errors import BackendError, InputError, NoBackendError, UsageError, VeoEdgeError
from veo_edge.runtime.activation import try_candidate
from veo_edge.runtime.backends.base import Runner, Verdict
from veo_edge.runtime.gate import Gate
from veo_edge.runtime.state import (
    HISTORY,
    CandidateStatus,
    Held,
    RuntimeState,
    Tally,
    fault_kind,
    no_backend_error,
    release,
    short,
)

__all__ = ["SWITCH_AFTER", "Fallback"]

log = logging.getLogger("veo_edge.runtime")

#: consecutive failed calls after which a transient fault (out of memory, backend error) moves traffic
SWITCH_AFTER = 3


class Fallback:
    """The activated runners among ``names`` (in policy order), the retries and switches between them.

    ``probe(name)``: can a candidate run here; ``make(name)``: its (unactivated) runner; ``check(name,
    runner)``: warm an activated one, may it take traffic (``ok``, ``reason``, ``to_dict()``); ``where``:
    the build, named when none can run. ``fallback=False``: no standby, no retry, failures are errors.
    ``retry_after_s``: a candidate whose activation or warm-up raised is tried again this long after."""

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
        #: a candidate refused for a fault that may heal -> when it may be tried again (``retry_after_s``)
        self.retry_after_s = retry_after_s
        self._retry_at: dict[str, float] = {}
        self._skipped: deque[dict[str, str]] = deque(maxlen=HISTORY)  # bounded: recovery may probe for days
        self._switches: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self._verified: dict[str, Any] = {}
        self.fallback_count = 0  # failures switched away from, counted beyond the history's length
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

    def counters(self) -> dict[str, Any]:
        """Faults by backend and kind, retries by the backend they ran on and outcome, switches, standby."""
        with self._lock:
            standby = min((k for k in tuple(self._held) if k != self._active), default=None)
            return {
                **self.tally.snapshot(),
                "fallback_switches": self.fallback_count,
                "standby_backend": None if standby is None else self.names[standby],
            }

    def _set_status(self, name: str, status: str, reason: str | None = None) -> None:
        with self._lock:
            self._status[name] = CandidateStatus(name, status, reason)
            if status in ("failed", "skipped", "untried"):
                self._verified.pop(name, None)

    # -- activation -------------------------------------------------------------------------------
    def _try(self, index: int, warm: bool = False) -> Runner | None:
        """Candidate ``index`` probed, activated (and with ``warm`` warm-checked); ``None``: skipped."""
        name = self.names[index]
        check = self._check if warm else None
        tried = try_candidate(name, probe=self._probe, make=self._make, check=check, tally=self.tally)
        with self._lock:
            self._retry_at.pop(name, None)
            if tried.runner is not None:
                if tried.result is not None:
                    self._verified[name] = tried.result
                return tried.runner
            if tried.may_heal and self.retry_after_s is not None:
                self._retry_at[name] = time.monotonic() + self.retry_after_s
            self._skipped.append({"backend": name, "reason": tried.reason})
            self._status[name] = CandidateStatus(name, "skipped", tried.reason)
        log.info("backend %s skipped: %s", name, tried.reason)
        return None

    def _untried(self, name: str) -> bool:
        """Never tried, or refused or dropped for a fault that may have healed, and due to be tried again."""
        due = self._retry_at.get(name)
        return self._status[name].status == "untried" or (due is not None and time.monotonic() >= due)

    def recovery_due(self) -> bool:
        """A switch happened, none is active, or a candidate ahead of the active one may have healed."""
        if self._switches or self._active is None:
            return True
        return any(n in self._retry_at for n in self.names[: self._active])

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

    # -- running a batch --------------------------------------------------------------------------
    def run(self, feed: dict[str, np.ndarray], output: str) -> np.ndarray:
        """One batch on the active backend, retried on the candidates after it (the module docstring)."""
        with self.gate.shared():
            index = self._active
            held = self._held.get(index) if index is not None else None
            if index is None or held is None:
                raise NoBackendError(
                    "no backend is active (all failed or the runtime is closed); see runtime.state"
                )
            out, error = self._attempt(index, held, feed, output)
            if error is not None and self.fallback:
                out = self._retry(index, held, error, feed, output)
        self._settle()
        if out is None:
            assert error is not None
            log.warning("a batch failed on every backend it was tried on: %s", short(str(error)))
            raise error
        return out

    def _attempt(
        self, index: int, held: Held, feed: dict[str, np.ndarray], output: str
    ) -> tuple[np.ndarray | None, BaseException | None]:
        try:
            with held.slots:
                out = held.runner.infer(feed)[output]
        except (InputError, UsageError):
            raise
        except VeoEdgeError as e:
            error: BaseException = e
        except Exception as e:  # a runner bug or a library error it did not wrap
            error = BackendError(f"{self.names[index]} failed: {type(e).__name__}: {e}")
        else:
            held.failures = 0
            return out, None
        self._fault(index, held, error)
        return None, error

    def _retry(
        self, index: int, held: Held, error: BaseException, feed: dict[str, np.ndarray], output: str
    ) -> np.ndarray | None:
        for j in range(index + 1, len(self.names)):
            standby = self._standby(j)
            if standby is None:
                continue
            out, err = self._attempt(j, standby, feed, output)
            self.tally.retry(self.names[j], err is None)
            if err is None:
                return out
        if fault_kind(error) != "device_lost" and self._held.get(index) is held:
            out, err = self._attempt(index, held, feed, output)  # transient: once more where it failed
            self.tally.retry(self.names[index], err is None)
            return out
        return None

    def _standby(self, j: int) -> Held | None:
        """Candidate ``j``'s standby; an untried one (or one due again) is activated and warmed now."""
        held = self._held.get(j)
        if held is not None or not self._untried(self.names[j]):
            return held
        with self._standby_lock:
            if j not in self._held and self._untried(self.names[j]) and not self._closed:
                runner = self._try(j, warm=True)
                if runner is not None:
                    self._held[j] = Held(runner)
                    self._set_status(self.names[j], "standby")
                    log.info("backend %s warm as a standby", self.names[j])
            return self._held.get(j)

    def _fault(self, index: int, held: Held, error: BaseException) -> None:
        """Count a failed call; mark the switch (the active) or the drop (a standby) it calls for."""
        name, kind = self.names[index], fault_kind(error)
        log.info("backend %s failed a batch (%s): %s", name, kind, short(str(error)))
        self.tally.fault(name, kind)
        with self._lock:
            held.failures += 1
            if not self.fallback or (kind != "device_lost" and held.failures < SWITCH_AFTER):
                return  # without fallback a failure is the caller's error and nothing moves
            if index == self._active:
                if kind == "device_lost" or any(k > index for k in tuple(self._held)):
                    self._due = self._due or (index, held.runner, error)
                return
            if self._held.get(index) is not held:
                return  # dropped by another batch already
            # a standby that fails for good: drop it (released by the next settle), prepare the next
            del self._held[index]
            self._retired.append(held.runner)
            self._status[name] = CandidateStatus(name, "failed", f"{type(error).__name__}: {error}")
            self._verified.pop(name, None)
            if self.retry_after_s is not None:  # its fault may heal: warm it again later
                self._retry_at[name] = time.monotonic() + self.retry_after_s
            self._prepare_due = True
        log.warning("standby %s dropped after %s", name, short(f"{type(error).__name__}: {error}"))

    def _settle(self) -> None:
        """Make the switch or release the runners that failures asked for (exclusive side of the gate)."""
        with self._lock:
            due, retired, prepare = self._due, self._retired, self._prepare_due
            self._due, self._retired = None, []
        if due is None and not retired and not prepare:
            return
        with self.gate:
            for runner in retired:
                release(runner, runner.name)
            if due is not None:
                index, runner, error = due
                if self._active == index and self.runner is runner:  # not switched by another batch
                    self._switch(index, error)
                    prepare = True
        if prepare and not self._closed:
            self._prepare_in_background()

    def _switch(self, index: int, error: BaseException) -> None:
        """Move traffic off ``index`` (exclusive gate held): to its standby, else the next that warms."""
        failed = self.names[index]
        reason = f"{type(error).__name__}: {error}"
        held = self._held.pop(index)
        release(held.runner, failed)
        self._active = None
        self._set_status(failed, "failed", reason)
        standby = min((k for k in tuple(self._held) if k > index), default=None)
        if standby is not None:  # warm already: traffic moves at once
            self._active = standby
            self._set_status(self.names[standby], "active")
        else:
            try:
                self.activate_from(index + 1, failure=f"{failed} failed ({reason})", warm=True)
            except NoBackendError as e:
                log.error("backend %s failed and no backend is left: %s", failed, short(str(e), 400))
        to = self.active_backend
        self._record(failed, to, reason, failure=True)
        log.warning("backend %s failed (%s); traffic moved to %s", failed, short(reason), to or "none")

    def _record(self, frm: str, to: str | None, reason: str, failure: bool = False) -> None:
        with self._lock:
            self._switches.append({"from": frm, "to": to, "reason": reason, "at": time.time()})
            self.fallback_count += failure

    def recover(self, only_if_none_active: bool = False) -> bool:
        """Back to a warm-checked candidate ahead of the active one (any, when none is; the one left is
        its standby); True if moved. Warmed while batches run on; only the move takes the whole gate."""
        with self.gate.shared(), self._standby_lock:  # the order _standby takes them in
            if self._closed or (only_if_none_active and self._active is not None):
                return False
            found = None
            for i in range(len(self.names) if self._active is None else self._active):
                if self._status[self.names[i]].status != "disabled":
                    runner = self._try(i, warm=True)
                    if runner is not None:
                        found = (i, runner)
                        break
        if found is None:
            return False
        i, runner = found
        with self.gate:
            old = self._active
            if self._closed or (old is not None and old <= i):  # closed, or moved by another meanwhile
                release(runner, self.names[i])
                return False
            if old is not None:
                self._set_status(self.names[old], "standby")
            self._use(runner, i)
            for k in sorted(k for k in tuple(self._held) if k > i)[1:]:  # one standby is enough
                release(self._held.pop(k).runner, self.names[k])
                self._set_status(self.names[k], "untried")
            frm = "none" if old is None else self.names[old]
            self._record(frm, self.names[i], "recovered")
        log.warning("backend %s usable again; switched back from %s", self.names[i], frm)
        self._prepare_in_background()
        return True

    def deactivate(self) -> None:
        """Release every activated runner (under the exclusive side of the gate); none is active after."""
        with self.gate:
            self._closed = True
            for k in sorted(tuple(self._held)):
                release(self._held.pop(k).runner, self.names[k])
            for runner in self._retired:
                release(runner, runner.name)
            self._retired = []
            self._active = None
