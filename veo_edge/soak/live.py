"""Progress while a soak runs: a rich live panel on a terminal, else one line every so often."""

from __future__ import annotations

import sys
import time
from typing import Any

from veo_edge.soak.units import format_duration


def _mib(v: float | None) -> str:
    return "-" if v is None else f"{v / (1 << 20):.1f} MiB"


def _ms(v: float | None) -> str:
    """A latency for the progress line; "-" before the first answer (no window yet, or NaN)."""
    return "-" if v is None or v != v else f"{v:.2f} ms"


def _rate(v: float | None) -> str:
    return "- req/s" if v is None else f"{v:.1f} req/s"


class Progress:
    def __init__(self, duration_s: float, title: str, enabled: bool = True) -> None:
        from rich.console import Console

        self.duration_s = duration_s
        self.title = title
        self.console = Console(stderr=True, highlight=False)
        self.live = None
        self.enabled = enabled
        self._last_line = 0.0
        self._every = max(10.0, duration_s / 20)
        self._first_rss: float | None = None

    def __enter__(self) -> Progress:
        if self.enabled and self.console.is_terminal:
            from rich.live import Live

            self.live = Live(console=self.console, refresh_per_second=2, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def update(self, t: float, s: dict[str, Any]) -> None:
        """``s``: rate, p50_ms, p99_ms, errors, not_sent, fallbacks, rss, ok."""
        rss = s.get("rss")
        if rss is not None and self._first_rss is None:
            self._first_rss = rss
        trend = None if rss is None or self._first_rss is None else rss - self._first_rss
        if self.live is not None:
            from rich.table import Table

            table = Table(title=self.title, show_header=False, box=None)
            remaining = max(0.0, self.duration_s - t)
            table.add_row("elapsed / remaining", f"{format_duration(t)} / {format_duration(remaining)}")
            table.add_row("rate", f"{_rate(s.get('rate'))}  ({s.get('ok', 0)} answered)")
            table.add_row(
                "latency p50 / p99",
                f"{_ms(s.get('p50_ms'))} / {_ms(s.get('p99_ms'))}",
            )
            table.add_row("errors / fallbacks", f"{s.get('errors', 0)} / {s.get('fallbacks') or 0}")
            if s.get("not_sent"):  # open loop: the client could not keep the offered rate
                table.add_row(
                    "not sent (client backlog)", f"{s['not_sent']}: the offered rate is not sustained"
                )
            table.add_row("memory (trend)", f"{_mib(rss)} ({'+' if (trend or 0) >= 0 else ''}{_mib(trend)})")
            self.live.update(table)
            return
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last_line >= self._every:
            self._last_line = now
            print(
                f"soak {format_duration(t)}/{format_duration(self.duration_s)}: {_rate(s.get('rate'))}, "
                f"p50 {_ms(s.get('p50_ms'))}, p99 {_ms(s.get('p99_ms'))}, "
                f"errors {s.get('errors', 0)}, fallbacks {s.get('fallbacks') or 0}, rss {_mib(rss)}"
                + (f", NOT SENT {s['not_sent']} (client backlog)" if s.get("not_sent") else ""),
                file=sys.stderr,
                flush=True,
            )
