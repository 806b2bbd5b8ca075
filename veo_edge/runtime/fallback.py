"""The fallback at run time: the active candidate, a warm standby behind it, the retry of a failed batch
on the candidates after the failing one, and the switch when a backend fails for good.

:mod:`veo_edge.runtime.policy` decides the candidates, their order and how each is probed and made;
:class:`~veo_edge.runtime.candidates.Candidates` holds the activated runners among them (the active one
and its standby) behind a gate (batches share it; activation, switching and closing take it alone).
:class:`Fallback` runs batches on them, counts every fault, retry and switch, and keeps the history that
:class:`RuntimeState` shows. The runtime above it owns the requests, the batcher and the canary that
warms a runner before it takes traffic.

The rules (docs/serving.md, "Faults, retries and fallback"):

- **Standby.** The first usable candidate after the active one is activated and warmed (``check``: the
  golden canary at the build's largest batch, by the rule of the precision it serves) before it takes any
  traffic; one that fails its warm-up is skipped with the reason (tried again ``retry_after_s`` later
  when its activation or warm-up raised, as is a dropped one). After a switch the next one is prepared
  in the background.
- **Retry.** A batch that fails on a backend is re-run on every candidate after it that can run (the
  standby first; one untried, or due again, is activated and warmed then), once each, and, when the
  failure was transient, once more on the backend it failed on, before any of its requests gets an error.
  Without fallback (``--no-fallback``) only the last: no other backend, no switch.
- **Switch.** A lost device (:class:`~veo_edge.errors.DeviceLostError`) switches at once. Out of memory
  and any other backend error are transient: the backend keeps new batches until :data:`SWITCH_AFTER`
  consecutive failed calls (a success resets the count), then traffic moves to the standby. A standby
  that fails the same way is dropped and the one after it prepared.
- **Wrong answer.** The active backend whose golden canary does not match (the server's readiness
  check runs it) is switched away from at once (:meth:`Fallback.reject`), as a lost device is; a standby
  that answered it wrongly in the active one's place (a retry of the canary's failed batch) is dropped,
  and noted in the skipped history with its reason. Either is counted as a fault of kind
  :data:`~veo_edge.runtime.state.WRONG_ANSWER`.
- **Recovery** (the runtime's clock). After a switch the candidates ahead of the active one are tried
  again, each warmed beside the traffic; one that is refused again waits twice as long before the next
  attempt, up to :data:`~veo_edge.runtime.recovery.BACKOFF_MAX` intervals (a dropped or refused standby
  too). With none active, or asked by readiness after a failed request, every one is tried at once.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from veo_edge.errors import BackendError, InputError, NoBackendError, UsageError, VeoEdgeError
from veo_edge.runtime.candidates import Candidates
from veo_edge.runtime.state import (
    WRONG_ANSWER,
    CandidateStatus,
    Held,
    Throttled,
    concurrency,
    fault_kind,
    release,
    short,
)

__all__ = ["SWITCH_AFTER", "Fallback"]

log = logging.getLogger("veo_edge.runtime")

#: consecutive failed calls after which a transient fault (out of memory, backend error) moves traffic
SWITCH_AFTER = 3
#: a failed batch, and a batch failed everywhere, are logged at most every 10 s per backend (with a count)
_throttled = Throttled(log, logging.WARNING)


def _retried(kind: str, after: bool) -> str:
    """What the log says happens to a failed batch: ``after``, some backend follows the failing one."""
    if after:
        return "; it is retried on the backends after it"
    return "" if kind == "device_lost" else "; it is run once more where it first failed"


class Fallback(Candidates):
    """Batches run on the active candidate, retried on the ones after it; switches away from a failing
    one and back to a recovered one (the module docstring). Made as :class:`Candidates` is."""

    # -- running a batch --------------------------------------------------------------------------
    def run(self, feed: dict[str, np.ndarray], output: str, answered: list[Any] | None = None) -> np.ndarray:
        """One batch on the active backend, retried on the candidates after it (the module docstring).
        ``answered``: given a list, the name of the backend that answered and the precision it computes
        at are appended to it (the active one, or the one a retry ran on: the canary is judged by it)."""
        with self.gate.shared():
            index = self._active
            held = self._held.get(index) if index is not None else None
            if index is None or held is None:
                raise NoBackendError(
                    "no backend is active (each failed, or the runtime is closed); the runtime's state says why"
                )
            out, error = self._attempt(index, held, feed, output)
            by = index
            if error is not None:
                out, by = self._retry(index, held, error, feed, output)
            if answered is not None and out is not None:
                runner = self._held[by].runner if by in self._held else None
                answered += [self.names[by], runner.describe().get("precision") if runner else None]
        self._settle()
        if out is None:
            assert error is not None
            _throttled("everywhere", "a batch failed on every backend it was tried on: %s", short(str(error)))
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
    ) -> tuple[np.ndarray | None, int]:
        """The batch's answer (None: failed everywhere) and the candidate that gave it."""
        for j in range(index + 1, len(self.names) if self.fallback else 0):
            standby = self._standby(j)
            if standby is None:
                continue
            out, err = self._attempt(j, standby, feed, output)
            self.tally.retry(self.names[j], err is None)
            if err is None:
                return out, j
        if fault_kind(error) != "device_lost" and self._held.get(index) is held:
            out, err = self._attempt(index, held, feed, output)  # transient: once more where it failed
            self.tally.retry(self.names[index], err is None)
            return out, index
        return None, index

    def _fault(self, index: int, held: Held, error: BaseException) -> None:
        """Count a failed call; mark the switch (the active) or the drop (a standby) it calls for."""
        name, kind = self.names[index], fault_kind(error)
        _throttled(
            name,
            "backend %s failed a batch (%s): %s%s",
            name,
            kind,
            short(str(error)),
            _retried(kind, self.fallback and index + 1 < len(self.names)),
        )
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
            self._backoff.failed(name)  # its fault may heal: warm it again later (with a recovery clock)
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
                    self._switch(index, f"{type(error).__name__}: {error}")
                    prepare = True
        if prepare and not self._closed:
            self._prepare_in_background()

    def reject(self, name: str, reason: str) -> str | None:
        """Backend ``name`` answered the golden canary wrongly (``reason``). The active one: move traffic
        off it now, to its warm standby, else the next candidate that passes its warm-up, counted as a
        switch away from a failing backend. A standby (the active one failed the canary's batch and a
        retry ran on it): drop it; traffic stays. Either is tried again only after its backoff (also with
        none active; never without a recovery clock), and takes traffic back only by passing its warm-up
        canary. Returns the backend active after (None: none passed; batches then get
        :class:`NoBackendError`)."""
        with self.gate:
            index = self._active
            if self._closed or index is None:
                return self.active_backend  # closed, or none active (moved already)
            if self.names[index] == name:
                self._switch(index, reason)
                self._wrong_answer(name)
            elif not self._drop_wrong_standby(name, reason):
                return self.active_backend  # dropped or moved already
        if not self._closed:
            self._prepare_in_background()
        return self.active_backend

    def _drop_wrong_standby(self, name: str, reason: str) -> bool:
        """Drop the standby ``name`` that answered the canary wrongly (exclusive gate held); False: it is
        not held (dropped or moved already)."""
        k = self.names.index(name)
        held = self._held.pop(k, None) if k != self._active else None
        if held is None:
            return False
        release(held.runner, name)
        self._set_status(name, "failed", reason)
        self._wrong_answer(name, f"standby dropped: it answered the canary wrongly ({reason})")
        log.warning("standby %s dropped: it answered the canary wrongly (%s)", name, short(reason))
        return True

    def _wrong_answer(self, name: str, skipped: str | None = None) -> None:
        """Count ``name``'s wrong canary answer and keep it out until its backoff is over (``skipped``:
        noted in the skipped history too)."""
        self.tally.fault(name, WRONG_ANSWER)
        with self._lock:
            self._backoff.failed(name)
            self._wrong.add(name)
            if skipped is not None:
                self._skip(name, skipped)

    def _switch(self, index: int, reason: str) -> None:
        """Move traffic off ``index`` (exclusive gate held): to its standby, else the next that warms."""
        failed = self.names[index]
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
        if to is not None:  # with none left, the error above said so
            log.warning("backend %s failed (%s); traffic moved to %s", failed, short(reason), to)

    def recover(self, only_if_none_active: bool = False, backoff: bool = False) -> bool:
        """Back to a warm-checked candidate ahead of the active one (any, when none is; the one left is
        its standby); True if moved. Warmed while batches run on; only the move takes the whole gate.
        ``backoff`` (the recovery clock): while one is active, a candidate refused before is tried only
        once its wait is over; each refusal doubles the wait."""
        with self.gate.shared(), self._standby_lock:  # the order _standby takes them in
            if self._closed or (only_if_none_active and self._active is not None):
                return False
            found = None
            throttled = backoff and self._active is not None
            for i in range(len(self.names) if self._active is None else self._active):
                name = self.names[i]
                if self._status[name].status != "disabled" and not self._resting(name, throttled):
                    runner = self._try(i, warm=True, retry_any=True)
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

    def warm_up(self, sizes: list[int]) -> int:
        """Every batch size in ``sizes`` once on the active runner, alone (the exclusive gate: no batch
        runs, no backend switches meanwhile); the infer requests it created."""
        with self.gate:
            runner = self.runner
            if runner is None:
                raise NoBackendError("no backend is active to warm up (each failed, or it is closed)")
            return runner.warm_up(sizes, concurrency(runner))

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
