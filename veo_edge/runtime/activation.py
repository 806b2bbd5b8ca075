"""One candidate made ready for traffic: probed, activated and warm-checked, or the reason it is not.

:class:`~veo_edge.runtime.fallback.Fallback` calls this for the first backend, for a standby and for a
recovery; what it returns says whether a refusal may heal (the candidate could run here, but activation
or its warm-up failed) or is this machine's for good (the probe said no: no GPU, no artifact)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from veo_edge.errors import (
    BackendError,
    BackendUnavailableError,
    InputError,
    ModelLoadError,
    UsageError,
    VeoEdgeError,
)
from veo_edge.runtime.backends.base import Runner, Verdict
from veo_edge.runtime.state import WRONG_ANSWER, Tally, fault_kind, release

__all__ = ["Tried", "try_candidate"]


@dataclass(frozen=True)
class Tried:
    """What trying one candidate gave: its runner (warm-checked with ``result``), or ``reason``."""

    runner: Runner | None
    reason: str | None = None
    result: Any = None  # the warm-up canary's result, when one ran and passed
    may_heal: bool = False  # refused after its probe passed: activation or the warm-up batch raised
    wrong: bool = False  # refused for a wrong answer: its warm-up canary did not match


def try_candidate(
    name: str,
    *,
    probe: Callable[[str], Verdict],
    make: Callable[[str], Runner],
    check: Callable[[str, Runner], Any] | None,
    tally: Tally,
) -> Tried:
    """``name`` probed, its runner made and activated, and with ``check`` warmed by the canary (a failure
    there is counted in ``tally`` as a fault of that backend). A refused runner is released."""
    verdict = probe(name)
    if not verdict.ok:
        return Tried(None, verdict.reason or "unusable (no reason given)")
    try:
        runner = make(name).activate()
    except (BackendUnavailableError, BackendError, ModelLoadError) as e:
        return Tried(None, str(e), may_heal=True)
    if check is None:
        return Tried(runner)
    try:
        result = check(name, runner)
    except (InputError, UsageError):
        release(runner, name)
        raise
    except Exception as e:  # the runner failed on the warm-up batch: a fault of its own
        error = e if isinstance(e, VeoEdgeError) else BackendError(f"{type(e).__name__}: {e}")
        tally.fault(name, fault_kind(error))
        release(runner, name)
        return Tried(None, f"warm-up failed: {type(error).__name__}: {error}", may_heal=True)
    if not result.ok:  # a wrong answer (a broken engine or IR) stays wrong: not tried again
        tally.fault(name, WRONG_ANSWER)
        release(runner, name)
        return Tried(None, f"warm-up canary failed: {result.reason}", wrong=True)
    return Tried(runner, result=result)
