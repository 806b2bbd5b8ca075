"""The gate in front of the active runner: batches share it, activation, switching and closing take it alone."""

from __future__ import annotations

import contextlib
import threading


class Gate:
    """Shared (batches running) / exclusive (activation, switch, close) access to the active runner.

    The exclusive side is re-entrant for its owner and is also the gate's context manager; a thread that
    holds it may take the shared side too. The standard library has no reader-writer lock."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._owner: int | None = None
        self._depth = 0

    @property
    def held(self) -> bool:
        """Whether a thread holds the exclusive side (activation, a switch, closing)."""
        return self._owner is not None

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
