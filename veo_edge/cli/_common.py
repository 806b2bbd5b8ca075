"""What every command shares: the console, the debug switch, and one-line JSON output."""

from __future__ import annotations

import json
import os
import sys
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
