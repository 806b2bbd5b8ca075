"""What a client is told when the runtime refuses or fails its request: the runtime's errors as the
:class:`~veo_edge.serve.protocol.ProtocolError` (with an HTTP status) every transport answers, and the
awaiting of a request's samples (:meth:`InferenceService.infer <veo_edge.serve.app.InferenceService.infer>`).

Refused at submission: overloaded 503 (``REJECTED``), bad input 400 (``INVALID``), closed or no backend
503 (``UNAVAILABLE``). Failed after submission: too late 504, overloaded 503, closed or no backend 503,
bad input 400, any other backend failure 500; the last two kinds mark the model not ready until its
canary matches again (:class:`~veo_edge.serve.readiness.ReadinessCheck`).

Cancelled (a gRPC client that cancelled or passed its deadline, an HTTP client that went away): the
samples still queued are dropped by the runtime, and the cancellation reaches the caller once the
samples already running are done, or after the request timeout (a hung backend). Until then the caller
still holds what the runtime reads: the request's bytes (``--max-buffered-bytes``), a shared-memory
region's lease.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import numpy as np

from veo_edge.errors import InputError, NoBackendError, OverloadedError, VeoEdgeError
from veo_edge.runtime.batching import ClosedError
from veo_edge.serve.protocol import ProtocolError


def _overloaded(e: Exception) -> ProtocolError:
    return ProtocolError(f"overloaded: {e}", 503)


def _unavailable(e: Exception) -> ProtocolError:
    return ProtocolError(f"the model cannot take requests now: {e}", 503)


def refused(e: VeoEdgeError, rejected: Counter[str]) -> ProtocolError:
    """The answer to a request the runtime would not take (``e`` from submitting it), counted in
    ``rejected`` by Triton's failure reason."""
    if isinstance(e, OverloadedError):
        rejected["REJECTED"] += 1
        return _overloaded(e)
    if isinstance(e, InputError):
        rejected["INVALID"] += 1
        return ProtocolError(str(e), 400)
    rejected["UNAVAILABLE"] += 1  # closed runtime, no backend
    return _unavailable(e)


def _retrieve(future: asyncio.Future) -> None:
    """Take a finished future's outcome, so that asyncio does not log one nobody awaits as "never
    retrieved" (a cancelled call's gather ends with the CancelledError no one reads)."""
    if not future.cancelled():
        future.exception()


async def _settled(futures: list[Any], timeout_s: float) -> None:
    """Return once every one of ``futures`` (concurrent) is done, or after ``timeout_s`` (a hung backend
    must not hold a cancelled call for ever): those running are answered, those cancelled while queued
    are never run."""
    running = [asyncio.wrap_future(f) for f in futures if not f.done()]
    for w in running:
        w.add_done_callback(_retrieve)
    if running:
        await asyncio.wait(running, timeout=timeout_s)


async def answers(futures: list[Any], timeout_s: float, check: Any) -> list[np.ndarray]:
    """The submitted samples' answers, or the ProtocolError their failure is; ``check``: the model's
    :class:`~veo_edge.serve.readiness.ReadinessCheck`, told of a backend failure. Cancelled, it cancels
    the samples still queued and re-raises once those running are done (see the module doc)."""
    try:
        if len(futures) == 1 and futures[0].done():  # ran here, on the loop
            return [futures[0].result()]
        gathered = asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        gathered.add_done_callback(_retrieve)
        try:
            return await asyncio.wait_for(gathered, timeout_s)
        except asyncio.CancelledError:
            await _settled(futures, timeout_s)
            raise
    except asyncio.TimeoutError as e:
        raise ProtocolError(f"inference did not finish within {timeout_s} s", 504) from e
    except OverloadedError as e:
        raise _overloaded(e) from e
    except (ClosedError, NoBackendError) as e:
        check.backend_failed(str(e))
        raise _unavailable(e) from e
    except InputError as e:
        raise ProtocolError(str(e), 400) from e
    except VeoEdgeError as e:
        check.backend_failed(f"{type(e).__name__}: {e}")
        raise ProtocolError(f"inference failed: {e}", 500) from e
