"""A soak's chaos schedule: the runtime's fault injection (:mod:`veo_edge.runtime.faults`) in human units.

``--chaos`` takes either the ``VEO_EDGE_FAULTS`` JSON form or a schedule of comma-separated items::

    [BACKEND:] ERROR every DURATION       one fault per period       -> every_s
    [BACKEND:] ERROR once at DURATION     one fault, once            -> once_at_s   ("at DURATION" too)
    [BACKEND:] ERROR after DURATION       every call from then on    -> after_s

e.g. ``oom every 10m, device_lost once at 30m`` or ``onnxruntime: oom every 10m``. ERROR is ``oom``,
``device_lost`` (``device-lost``) or ``backend``; BACKEND defaults to ``*``: the active backend, whichever
it is, with one fault per period in all (a backend name gives it its own). Times count on the run's
clock, from the start of the run (a resumed run keeps its schedule). Both forms give the JSON form,
which the run directory stores.
"""

from __future__ import annotations

import json
import re
from typing import Any

from veo_edge.errors import UsageError
from veo_edge.runtime.faults import ALL, parse_faults
from veo_edge.runtime.policy import BACKENDS
from veo_edge.soak.units import parse_duration

_ERRORS = {"oom": "oom", "device_lost": "device_lost", "device-lost": "device_lost", "backend": "backend"}
_ITEM = re.compile(
    r"(?:(?P<backend>[a-z0-9_*-]+)\s*:\s*)?(?P<error>[a-z_-]+)\s+"
    r"(?P<when>every|once\s+at|at|after)\s+(?P<duration>\S+)"
)
_WHEN = {"every": "every_s", "once at": "once_at_s", "at": "once_at_s", "after": "after_s"}
_EXAMPLE = (
    "e.g. 'oom every 10m, device_lost once at 30m' or JSON such as '{\"onnxruntime\": {\"every_s\": 600}}'"
)


def parse_chaos(text: str) -> dict[str, Any]:
    """The ``VEO_EDGE_FAULTS`` form of ``text`` (JSON or a schedule), checked as the runtime checks it."""
    raw = text.strip()
    if raw.startswith(("{", "[")):
        try:
            faults = json.loads(raw)
        except ValueError as e:
            raise UsageError(f"--chaos is not valid JSON ({e}); {_EXAMPLE}") from e
    else:
        faults = _schedule(raw)
    parse_faults(faults, BACKENDS)  # the runtime's checks and messages, before the run starts
    return faults


def _schedule(raw: str) -> dict[str, Any]:
    items = [i.strip() for i in raw.split(",")]
    if not raw or not all(items):
        raise UsageError(f"--chaos {raw!r} has an empty item; {_EXAMPLE}")
    specs: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        m = _ITEM.fullmatch(item.lower())
        if m is None:
            raise UsageError(
                f"--chaos item {item!r} is not of the form '[BACKEND:] ERROR every|once at|after DURATION'; "
                f"{_EXAMPLE}"
            )
        error = _ERRORS.get(m["error"])
        if error is None:
            raise UsageError(
                f"--chaos item {item!r}: unknown error {m['error']!r}; choose one of: oom, device_lost, backend"
            )
        backend = m["backend"] or ALL
        if backend != ALL and backend not in BACKENDS:
            raise UsageError(
                f"--chaos item {item!r} names backend {backend!r}; choose one of: {', '.join(BACKENDS)} "
                f"(or leave it out: the active backend)"
            )
        when = " ".join(m["when"].split())
        seconds = parse_duration(
            m["duration"], f"--chaos item {item!r}: the time", allow_zero=when != "every"
        )
        specs.setdefault(backend, []).append({_WHEN[when]: seconds, "error": error})
    return {b: s[0] if len(s) == 1 else s for b, s in specs.items()}
