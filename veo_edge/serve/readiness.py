"""One model's readiness: the golden canary run through its runtime, a backend failure seen on a request
since, and the background re-check that brings readiness back.

Ready = a runtime with an active backend, on which the golden canary matched (by the rule of the
precision that backend computes at), and no request failed since it last matched. A fault the runtime
absorbed by a retry is no failure here: readiness stays up. A switch to a standby keeps it up too, as
the standby passed the canary at its warm-up (``state.verified``). A request that failed on every
backend drops it at once; :meth:`ReadinessCheck.recheck_loop` then re-checks at most once per interval
(recovering earlier backends first) and readiness returns only when the canary matches again: with every
backend failing for good it stays down. A canary that runs but does not match takes the backend out of
traffic (:meth:`ReadinessCheck.run_canary`): the model is ready on the next backend that matches, or on
none, and then inference is refused (503) rather than answered wrongly. The answer is judged by the
rule of the backend that gave it: a standby that answered for an active backend that failed the batch
is judged (and, answering wrongly, dropped) itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any

from veo_edge.errors import VeoEdgeError
from veo_edge.export.canary import Canary, CanaryResult, compare_canary
from veo_edge.runtime.state import short
from veo_edge.serve.health import load_canary

log = logging.getLogger("veo_edge.serve")


def unloaded(model: str) -> str:
    """Why model ``model`` answers nothing while unloaded, and what loads it (readiness, infer, canary)."""
    return f"model {model!r} is unloaded; POST /v2/repository/models/{model}/load"


def _skipped_line(state: dict[str, Any]) -> str:
    """The runtime ``state``'s skipped backends and why, in words (``none`` when it skipped none)."""
    skipped = state.get("skipped") or []
    return "; ".join(f"{s['backend']}: {short(s['reason'])}" for s in skipped) or "none"


class ReadinessCheck:
    """The canary's last result (on which backend), and a backend failure seen since it matched."""

    def __init__(self, build: Any) -> None:
        self.build = build
        # the golden canary is read (and verified) now: a build without a usable one is refused at start
        self.canary: Canary | None = load_canary(build)
        self._canaries: dict[str, Canary] = {}  # precision -> the canary with that precision's rule
        self.result: CanaryResult | None = None
        self.backend: str | None = None  # the backend the canary last ran on
        self.error: str | None = None
        #: a backend error seen on a request since the canary last matched (readiness drops on it)
        self.backend_failure: str | None = None
        self.wake: asyncio.Event | None = None  # set: the re-checker looks now
        self._last_reason: str | None = None

    def reset(self) -> None:
        """Forget the canary's result and any failure (a fresh runtime was loaded)."""
        self.result = self.backend = self.error = None
        self.backend_failure = None

    def run_canary(self, runtime: Any) -> CanaryResult | None:
        """Run the golden canary through ``runtime`` (blocking); readiness follows its result.

        A backend that answers it wrongly (a mismatch, not a failure to answer) loses its traffic at once
        (:meth:`Runtime.reject <veo_edge.runtime.runtime.Runtime.reject>`): the active one, or the standby
        that answered in its place when the active one failed the canary's batch (dropped; traffic stays).
        The canary then runs again on the backend active after, until one matches or none is left, and
        then no backend answers (inference gets 503, not an answer known to be wrong)."""
        if runtime is None:
            return None
        for _ in range(len(runtime.names)):  # each round takes one backend out: the policy bounds it
            active = self._run_once(runtime)
            if active is not None and self.result is not None and not self._matched_on(active):
                # an answer, wrong or a standby's: once more before a backend loses its traffic (the active
                # one may have failed the batch, a transient fault, and a standby answered in its place; a
                # broken backend stays wrong). One that raised is not run again here: the re-check does
                active = self._run_once(runtime)
            if active is None or self.result is None or self._matched_on(active):
                break  # none active, it raised (not a wrong answer: the re-check tries again), or ready
            if self.result.ok:  # right, but from a standby: the active one has not answered it yet
                continue
            wrong = self.backend  # the backend whose answer it was
            moved = runtime.reject(wrong, f"canary mismatch: {self.error}")
            if moved is None:
                log.error(
                    "not ready: no backend passed the canary (%s: %s; skipped: %s); inference is refused "
                    "(503) until one does: rebuild the model, or check the backend's artifacts",
                    wrong,
                    self.error,
                    _skipped_line(runtime.state.to_dict()),
                )
                break
            if moved == wrong:  # not moved (closed meanwhile): nothing else to run it on
                break
        return self.result

    def _matched_on(self, backend: str) -> bool:
        return self.result is not None and self.result.ok and self.backend == backend

    def _run_once(self, runtime: Any) -> str | None:
        """The canary on the active backend, judged by the rule of the precision of the backend that
        answered it (the active one, or the standby a failed batch was retried on); the result, the
        error and that backend noted. Returns the backend active when it ran. With none active there is
        nothing to run it on: the last result stands (what failed, on which)."""
        backend = runtime.state.to_dict().get("active_backend")
        if backend is None:
            return None
        answered = backend
        try:
            self.canary = self.canary or load_canary(self.build)
            out, answered, precision = runtime.run_canary(self.canary.input)
            canary = self.canary_of(str(precision or "f32"))
            self.result = compare_canary(out, canary)
            self.error = self.result.reason
        except VeoEdgeError as e:
            self.result, self.error = None, str(e)
        self.backend = answered
        if self.error:
            if self.error != self._last_reason:
                mismatch = self.result is not None and len(runtime.names) > 1
                handled = (
                    "; traffic moves off it to a backend that passes the canary"
                    if answered == backend
                    else f"; it answered in place of {backend}, which failed the batch: it is dropped as a standby"
                )
                log.log(  # a mismatch with backends left is handled: it moves traffic (WARNING)
                    logging.WARNING if mismatch else logging.ERROR,
                    "not ready: canary failed on %s: %s%s",
                    answered,
                    self.error,
                    handled if mismatch else "",
                )
            self._last_reason = self.error
        elif answered == backend:
            if self.backend_failure or self._last_reason:
                log.info("canary matched on %s: ready", backend)
            self.backend_failure = self._last_reason = None
        return backend

    def canary_of(self, precision: str | None) -> Canary:
        """The canary with the rule of ``precision`` (None: the build's own, what it serves on OpenVINO)."""
        if precision is None:
            self.canary = self.canary or load_canary(self.build)
            return self.canary
        if precision not in self._canaries:
            self._canaries[precision] = load_canary(self.build, precision)
        return self._canaries[precision]

    def adopt_warm_result(self, state: dict[str, Any]) -> None:
        """After a switch to a standby that passed the canary at its warm-up, take that result as the
        canary's on it (no request failed since): readiness does not drop for a switch."""
        backend = state.get("active_backend")
        warm = (state.get("verified") or {}).get(backend)
        if backend and backend != self.backend and warm and warm.get("ok") and not self.backend_failure:
            self.result, self.backend, self.error = CanaryResult(**warm), backend, None
            self._last_reason = None
            log.info("%s is active now; it passed the canary at its warm-up: ready", backend)

    def needs_recheck(self, state: dict[str, Any]) -> bool:
        backend = state.get("active_backend")
        return bool(self.backend_failure or not backend or backend != self.backend)

    def reasons(self, state: dict[str, Any]) -> list[str]:
        """Why a loaded runtime in ``state`` (its ``state.to_dict()``) is not ready; empty when it is.
        Wakes the re-checker when there is something to re-check."""
        self.adopt_warm_result(state)
        backend = state.get("active_backend")
        reasons = []
        if state.get("closed"):
            reasons.append("the runtime is closed")
        if not backend or not state.get("ready", True):
            reasons.append(f"no backend is active (skipped: {_skipped_line(state)})")
        if self.backend_failure and backend:  # with none active, that is the reason already
            reasons.append(f"a request failed on the backend ({self.backend_failure}); re-checking")
        if self.error:
            reasons.append(f"canary failed on {self.backend}: {self.error}")
        elif self.result is None:
            reasons.append("the canary has not run")
        elif backend and backend != self.backend:
            reasons.append(f"the canary ran on {self.backend}, {backend} is active now: re-running it")
        if self.needs_recheck(state) and self.wake is not None:
            self.wake.set()
        return reasons

    def report(self, runtime: Any, model: str, draining: bool) -> dict[str, Any]:
        """The readiness body of ``model`` served by ``runtime`` (None: unloaded): ``ready`` and, when
        not, ``reason`` (what a probe and a person need), the backends, the fallback and the canary."""
        state = runtime.state.to_dict() if runtime is not None else {}
        reasons = []
        if draining:
            reasons.append("the server is shutting down")
        if runtime is None:
            reasons.append(unloaded(model))
        else:
            reasons += self.reasons(state)
        body: dict[str, Any] = {
            "ready": not reasons,
            "model": model,
            "active_backend": state.get("active_backend"),
            # the warm one a failed batch is re-run on (None: no second backend here, or still warming)
            "standby_backend": runtime.standby_backend if runtime is not None else None,
            "fallback": {
                "count": state.get("fallback_count", 0),
                "switches": state.get("switches", []),
                "skipped": state.get("skipped", []),
            },
            "canary": self.canary_report(),
        }
        if reasons:
            body["reason"] = "; ".join(reasons)
        return body

    def canary_report(self) -> dict[str, Any] | None:
        """The canary's last result for the ready body: its comparison; when it raised instead of
        answering, ``ok`` false, the backend and why in one line (``raised``); None: it has not run."""
        if self.result is not None:
            return self.result.to_dict()
        if self.error is not None:
            return {"ok": False, "backend": self.backend, "raised": short(self.error, 300)}
        return None

    def backend_failed(self, reason: str) -> None:
        self.backend_failure = reason
        if self.wake is not None:
            self.wake.set()

    async def recheck_loop(
        self, runtime: Callable[[], Any], paused: Callable[[], bool], interval_s: float
    ) -> None:
        """While not ready because of a failure or a switch: recover earlier backends, re-run the canary.
        ``runtime()``: the current runtime (None while unloaded); ``paused()``: true while draining."""
        if self.wake is None:
            self.wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), interval_s)
            self.wake.clear()
            rt = runtime()
            if rt is None or paused():
                continue
            state = rt.state.to_dict()
            self.adopt_warm_result(state)
            if not self.needs_recheck(state):
                continue
            # a request failed on the active backend: try the earlier ones; none active: try any
            only_if_none = self.backend_failure is None
            await loop.run_in_executor(None, functools.partial(rt.try_recover, only_if_none))
            await loop.run_in_executor(None, self.run_canary, rt)
            await asyncio.sleep(interval_s)  # at most one re-check per interval
