"""What every command shares: the console, the debug switch, one-line JSON output, and signals that
interrupt a command the way Ctrl-C does."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any


class State:
    debug: bool = os.environ.get("VEO_EDGE_DEBUG", "") not in ("", "0")


def console(stderr: bool = False):
    """The commands' console. Piped into a file or ``grep`` (no terminal, no ``COLUMNS``), rich would cut
    every line at 80 columns, mid-list: there a line stays whole up to 400 columns."""
    from rich.console import Console

    c = Console(stderr=stderr, highlight=False)
    if not c.is_terminal and "COLUMNS" not in os.environ:
        c.width = max(c.width, 400)
    return c


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


#: the signals :func:`interrupt_on_signals` turned into KeyboardInterrupt: one raised inside an import
#: can come out as another error (a C extension's init reports "ImportError: initialization failed")
_INTERRUPTED: list[str] = []


def interrupted_by() -> str | None:
    """The signal that interrupted this command (see :func:`interrupt_on_signals`), if one did."""
    return _INTERRUPTED[0] if _INTERRUPTED else None


@contextlib.contextmanager
def interrupt_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP (a dropped ssh session) raise KeyboardInterrupt, as Ctrl-C does, so that what
    the command cleans up on Ctrl-C is cleaned up then too: a deploy restores the previous release, a
    build removes its staging directory and lock."""

    def _raise(signum, _frame):
        name = signal.Signals(signum).name
        _INTERRUPTED.append(name)
        raise KeyboardInterrupt(name)

    _INTERRUPTED.clear()  # a command run before in this process (tests call main() again) is over
    saved = {s: signal.signal(s, _raise) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
